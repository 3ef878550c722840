"""The provisioning step's pure parts: the requirement set and its hash, the set's key (pins and image),
where a set goes, the script (a golden file per place, shellcheck), what its output means, and the
hints for a failure."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path, PurePosixPath

import pytest

from vcloud_pipeline.jobs.hints import provision_hints
from vcloud_pipeline.plan.layout import pylibs_set
from vcloud_pipeline.profile import ProfileError
from vcloud_pipeline.provision.commands import (
    EXIT_INSTALL_FAILED,
    ProvisionSetupError,
    build_provision_script,
    parse_provision_output,
)
from vcloud_pipeline.provision.environment import (
    JobEnvironment,
    image_identity_script,
    parse_image_identity,
    read_image_identity,
)
from vcloud_pipeline.provision.requirements import (
    RequirementsError,
    parse_requirements,
    runtime_requirements,
)
from vcloud_pipeline.provision.step import ProvisionError, provision_environment
from tests.vcloud_pipeline.conftest import complete_profile

GOLDEN = Path(__file__).parents[1] / "golden"
UPDATE = os.environ.get("VCLOUD_UPDATE_GOLDEN") == "1"
PINS = "# runtime\ntifffile==2026.3.3\nPyYAML == 6.0.3   # config files\n\ntorch==2.13.0\n"
SIF = "/appl/local/csc/soft/ai/images/pytorch_2.5.1_lumi_rocm6.2.4_flash-attn-3.0.0.post1.sif"
IDENTITY = "size 21474836480 mtime 1767225600"


def lumi_environment(pins: str = PINS, image: str = SIF, identity: str | None = IDENTITY,
                     extra: dict | None = None) -> JobEnvironment:
    profile = complete_profile("lumi", {**(extra or {}), "container.image": image})
    return JobEnvironment.of(profile, parse_requirements(pins), identity)


def test_a_requirement_set_is_its_pins_sorted_and_its_hash_ignores_comments_order_and_spelling() -> None:
    one = parse_requirements(PINS)
    assert one.pins == ["PyYAML==6.0.3", "tifffile==2026.3.3", "torch==2.13.0"]
    other = parse_requirements("torch==2.13.0\npyyaml==6.0.3\ntifffile==2026.3.3\n")
    assert one.hash == other.hash and len(one.hash) == 16
    assert parse_requirements(PINS.replace("2026.3.3", "2026.3.4")).hash != one.hash


@pytest.mark.parametrize("text, message", [
    ("numpy>=2\n", r"line 1: 'numpy>=2' is not a pin; write name==version"),
    ("rasterio[s3]==1.4.4\n", r"line 1: .* is not a pin"),
    ("numpy==2.4.6\nNumPy==2.4.6\n", r"line 2: NumPy is pinned twice"),
    ("# nothing\n", r"pins no package"),
    ("--index-url https://x\n", r"is not a pin"),
    ("torch==abc\n", r"line 1: 'torch==abc' is not a pin"),  # not a PEP 440 version
    ("numpy==2.*\n", r"line 1: 'numpy==2.\*' is not a pin"),
    ("numpy==2.4.6,==2.4.7\n", r"is not a pin"),
    ("numpy==2.4.6; python_version > '3.0'\n", r"is not a pin"),
    ("numpy @ https://x/numpy.whl\n", r"is not a pin"),
])
def test_anything_but_exact_pins_is_refused_naming_the_line(text: str, message: str) -> None:
    with pytest.raises(RequirementsError, match=message):
        parse_requirements(text)


def test_the_checkouts_runtime_requirements_pin_tifffile() -> None:
    assert "tifffile==2026.3.3" in runtime_requirements().pins


@pytest.mark.parametrize("one, other, same", [
    # same pins (other order, comments, spelling) and the same image: one set
    (dict(), dict(pins="torch==2.13.0\npyyaml==6.0.3\ntifffile==2026.3.3\n"), True),
    # another image reference (a new site image, or the same file under another path): another set
    (dict(), dict(image="/appl/local/csc/soft/ai/images/pytorch_2.6.0_lumi_rocm6.2.4.sif"), False),
    (dict(), dict(image=SIF.replace("/appl/local/csc", "/pfs/lustrep1/appl/local/csc")), False),
    # the same path, an image replaced there (another size or mtime; another recorded build hash)
    (dict(), dict(identity="size 21474836480 mtime 1769904000"), False),
    (dict(identity="build 9f2c"), dict(identity="build 0a7e"), False),
    # the identity not read (the image was unreadable when the run synced): keyed by the reference alone
    (dict(), dict(identity=None), False),
    (dict(identity=None), dict(identity=None), True),
    # other pins, same image
    (dict(), dict(pins=PINS.replace("2026.3.3", "2026.3.4")), False),
])
def test_a_set_is_keyed_by_its_pins_and_the_image_it_is_built_for(one: dict, other: dict, same: bool) -> None:
    a, b = lumi_environment(**one), lumi_environment(**other)
    assert (a.key == b.key) is same, (a, b)
    assert len(a.key) == 16 and a.key != a.requirement_set.hash
    dirs = {pylibs_set(complete_profile("lumi"), e.key) for e in (a, b)}
    assert len(dirs) == (1 if same else 2)


def test_a_profile_without_a_container_keys_its_set_by_the_pins_alone() -> None:
    bare = complete_profile("local", {"container.runtime": "none"})
    environment = JobEnvironment.of(bare, parse_requirements(PINS), IDENTITY)
    assert environment.image is None and environment.image_identity is None
    assert environment.key == parse_requirements(PINS).hash and environment.describe_image() == "no container"


def test_the_environment_travels_in_xcom_and_keeps_its_key() -> None:
    environment = lumi_environment()
    again = JobEnvironment.model_validate(environment.model_dump(mode="json"))
    assert again == environment and again.key == environment.key
    assert environment.describe_image() == f"image {SIF} ({IDENTITY})"


@pytest.mark.parametrize("exit_status, stdout, identity", [
    (0, "build 3f2a9c\n", "build 3f2a9c"),
    (0, "stat 21474836480 1767225600\n", "size 21474836480 mtime 1767225600"),
    (1, "", None),                            # stat: cannot statx: No such file or directory
    (0, "build \n", None),                    # an empty recorded hash
    (0, "stat 4096\n", None),
])
def test_the_image_identity_is_the_recorded_build_hash_else_size_and_mtime(
        exit_status: int, stdout: str, identity: str | None) -> None:
    assert parse_image_identity(exit_status, stdout) == identity


def test_the_image_identity_command_reads_the_build_hash_next_to_a_directory_image_else_stats_it(
        tmp_path: Path) -> None:
    image = tmp_path / "images" / "vcloud trainer's"  # quoting: a space and a quote
    image.mkdir(parents=True)

    def identity() -> str | None:
        done = subprocess.run(["bash", "-c", image_identity_script(str(image))], capture_output=True, text=True)
        return parse_image_identity(done.returncode, done.stdout)

    stat = os.stat(image)
    assert identity() == f"size {stat.st_size} mtime {int(stat.st_mtime)}"
    Path(f"{image}.sha256").write_text("ab12cd\n")
    assert identity() == "build ab12cd"
    sif = tmp_path / "x.sif"
    assert identity() is not None and image_identity_script(str(sif)).endswith(f"-- {sif}; fi")
    done = subprocess.run(["bash", "-c", image_identity_script(str(sif))], capture_output=True, text=True)
    assert parse_image_identity(done.returncode, done.stdout) is None


def test_the_identity_is_read_for_every_profile_that_runs_a_container() -> None:
    class _Answer:
        def __init__(self) -> None:
            self.scripts: list[str] = []

        def run_script(self, script: str, *, verb: str, timeout: float) -> object:
            from slurm_provider.transport import CommandResult

            self.scripts.append(script)
            return CommandResult(command="bash -s", exit_status=0, stdout="stat 7 8\n", stderr="")

    hook = _Answer()
    assert read_image_identity(complete_profile("lumi"), hook) == "size 7 mtime 8"  # type: ignore[arg-type]
    assert len(hook.scripts) == 1 and SIF in hook.scripts[0]
    assert read_image_identity(complete_profile("local"), hook) == "size 7 mtime 8"  # type: ignore[arg-type]
    assert len(hook.scripts) == 2  # local provisions nothing: its identity keys the preflight check's proof
    assert read_image_identity(complete_profile("levante"), _NoCluster()) is None  # type: ignore[arg-type]


def test_a_set_goes_to_a_directory_of_its_key_in_pylibs_and_profiles_without_pylibs_have_none() -> None:
    lumi, requirements = complete_profile("lumi"), parse_requirements(PINS)
    key = lumi_environment().key
    pylibs = pylibs_set(lumi, key)
    assert pylibs is not None
    assert pylibs.dir == PurePosixPath(f"/projappl/project_465002500/pylibs/{key}")
    assert pylibs.marker == pylibs.dir / ".vcloud_requirements"
    assert pylibs.building.parent == pylibs.dir.parent and pylibs.building.name.startswith(".")
    assert pylibs_set(complete_profile("local"), requirements.hash) is None
    with pytest.raises(ValueError, match="not 16 hex digits"):
        pylibs_set(lumi, "../x")


def test_provisioning_needs_pylibs() -> None:
    with pytest.raises(ProfileError, match="provision installs into paths.pylibs"):
        complete_profile("local", {"provision": {"where": "login"}})


def _shellcheck(script: str, tmp_path: Path) -> None:
    path = tmp_path / "provision.sh"
    path.write_text(script)
    exe = shutil.which("shellcheck") or "/usr/bin/shellcheck"
    result = subprocess.run([exe, "--shell=bash", "--severity=warning", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("case, extra", [
    ("lumi_provision_login", None),
    ("lumi_provision_job", {"provision": {"where": "job", "partition": "dev-g", "binds": ["/etc/ssl/certs"]}}),
])
def test_golden_provisioning_script(case: str, extra: dict | None, tmp_path: Path) -> None:
    profile, environment = complete_profile("lumi", extra), lumi_environment(extra=extra)
    pylibs = pylibs_set(profile, environment.key)
    assert pylibs is not None
    script = build_provision_script(profile, pylibs, environment)
    path = GOLDEN / f"{case}.sh"
    if UPDATE:
        path.write_text(script)
    assert path.exists(), f"{path} missing: run with VCLOUD_UPDATE_GOLDEN=1 and review the diff"
    assert script == path.read_text(), f"{case} differs from {path} (VCLOUD_UPDATE_GOLDEN=1 to accept)"
    _shellcheck(script, tmp_path)
    # The marker is looked for first, before the lock and again under it; it is renamed into place last.
    assert script.count(f"if [ -f {pylibs.marker} ]") == 2
    assert script.index("lock=") < script.index("pip install")
    assert script.index("pip install") < script.index(f"mv -T {pylibs.building} {pylibs.dir}")
    assert "--no-deps --only-binary=:all:" in script and f"--target {pylibs.building}" in script
    # the set's record names the pins' hash, the set's key and the image it was built for
    assert f'echo "set {environment.key}"' in script and f"'image {SIF}' 'image-identity {IDENTITY}'" in script


def test_a_set_in_another_directory_is_refused() -> None:
    profile = complete_profile("lumi")
    pylibs = pylibs_set(profile, lumi_environment().key)
    assert pylibs is not None
    with pytest.raises(ProvisionSetupError, match="is not the one of requirement set"):
        build_provision_script(profile, pylibs, lumi_environment(pins="numpy==2.4.6\n"))
    with pytest.raises(ProvisionSetupError, match=r"\(image /appl/other.sif \(size"):
        build_provision_script(profile, pylibs, lumi_environment(image="/appl/other.sif"))


def test_the_output_says_what_was_installed_and_what_the_container_provides() -> None:
    output = ("have PyYAML==6.0.3 6.0.3\nmissing tifffile==2026.3.3\nhave torch==2.13.0 2.5.1+rocm6.2\n"
              "VCLOUD-PROVISION installing tifffile==2026.3.3\nSuccessfully installed tifffile-2026.3.3\n"
              "VCLOUD-PROVISION installed /p/abc\nrequirements abc\n")
    outcome = parse_provision_output(0, output)
    assert outcome.ok and outcome.state == "installed" and outcome.installed == ("tifffile==2026.3.3",)
    assert outcome.version_differences() == ["torch==2.13.0 (the container has 2.5.1+rocm6.2)"]
    assert parse_provision_output(0, "have torch==2.13.0 2.13.0+cpu\n").version_differences() == []
    present = parse_provision_output(0, "VCLOUD-PROVISION present /p/abc\nrequirements abc\n"
                                        "missing tifffile==2026.3.3\n")
    assert present.state == "present" and present.installed == ("tifffile==2026.3.3",)
    assert parse_provision_output(75, "provision: error: another installer holds").state == "busy"
    failed = parse_provision_output(EXIT_INSTALL_FAILED, "ERROR: No matching distribution found for x==0\n"
                                                         "VCLOUD-PROVISION install-failed exit 1\n")
    assert not failed.ok and failed.state == "install-failed"
    assert parse_provision_output(255, "ssh: connection lost").state == "failed"


def test_pips_failures_get_their_hints() -> None:
    offline = ("WARNING: Retrying ... Failed to establish a new connection: [Errno 101] Network is unreachable\n"
               "ERROR: No matching distribution found for tifffile==2026.3.3\n")
    assert [h.key for h in provision_hints(offline)] == ["pip_no_network"]
    no_version = "ERROR: Could not find a version that satisfies the requirement tifffile==1.0.0.1 (from versions: 1)\n"
    assert [h.key for h in provision_hints(no_version)] == ["pip_no_such_version"]
    assert [h.key for h in provision_hints("error: command 'gcc' failed: No such file\n")][0] == "pip_needs_compiler"
    assert provision_hints("Successfully installed tifffile-2026.3.3\n") == []


class _NoCluster:
    """A hook that must not be used: a profile that provisions nothing costs no command."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the step called hook.{name}")


def test_a_profile_without_provision_passes_without_a_command() -> None:
    local = complete_profile("local")
    done = provision_environment(local, _NoCluster(), JobEnvironment.of(local, runtime_requirements()))  # type: ignore[arg-type]
    assert done.state == "none" and done.directory is None


class _Answers:
    """The login node's answer to the one script the step runs."""

    def __init__(self, exit_status: int, stdout: str) -> None:
        self.answer = (exit_status, stdout)
        self.scripts: list[str] = []

    def run_script(self, script: str, *, verb: str, timeout: float) -> object:
        from slurm_provider.transport import CommandResult

        self.scripts.append(script)
        return CommandResult(command="bash -s", exit_status=self.answer[0], stdout=self.answer[1], stderr="")


def test_a_failure_names_pips_words_the_hint_and_the_sites_hint() -> None:
    hook = _Answers(EXIT_INSTALL_FAILED, "missing tifffile==9.9.9\nVCLOUD-PROVISION installing tifffile==9.9.9\n"
                                         "ERROR: No matching distribution found for tifffile==9.9.9\n"
                                         "VCLOUD-PROVISION install-failed exit 1\n")
    with pytest.raises(ProvisionError) as failure:
        provision_environment(complete_profile("lumi"), hook, lumi_environment("tifffile==9.9.9\n"))  # type: ignore[arg-type]
    message = str(failure.value)
    assert f"provisioning requirement set {lumi_environment('tifffile==9.9.9').key} (image {SIF} ({IDENTITY})) " \
           "of profile lumi on the login node failed (exit 72)" in message
    assert "pip could not install what the container lacks; no job of the run was submitted" in message
    assert "No matching distribution found for tifffile==9.9.9" in message
    assert "Hint: The package index has no wheel of a pinned version" in message
    assert "Hint (lumi): On LUMI install from a login node" in message
    assert len(hook.scripts) == 1


def test_the_provisioning_task_installs_the_set_the_jobs_were_rendered_for() -> None:
    """sync_code renders the jobs for an environment and hands it on; provision_env installs that very
    set (the one key), and its summary names the image it was built for."""
    from vcloud_pipeline.dag.tasks import provision
    from vcloud_pipeline.plan.labels import JobLabel
    from vcloud_pipeline.plan.request import parse_request
    from vcloud_pipeline.plan.run_plan import RunPlan, SyncedCode

    profile = complete_profile("lumi")
    plan = RunPlan.build(parse_request({"profile": "lumi", "config": "full", "run_name": "keyed"}), profile)
    environment = JobEnvironment.of(profile, runtime_requirements(), IDENTITY)
    code_hash = "0" * 64
    jobs = plan.render(code_hash, environment)
    synced = SyncedCode.recording(code_hash, {label: job.outer for label, job in jobs.items()},
                                  requirements=list(environment.requirements),
                                  requirements_hash=environment.requirement_set.hash, environment=environment)
    synced = SyncedCode.model_validate(synced.model_dump(mode="json"))  # through XCom
    pylibs = pylibs_set(profile, environment.key)
    assert pylibs is not None and f":{pylibs.dir}\"" in jobs[JobLabel.STAGE0].inner
    hook = _Answers(0, f"have torch==2.13.0 2.5.1\nVCLOUD-PROVISION present {pylibs.dir}\n")
    summary = provision(plan, hook, synced)  # type: ignore[arg-type]
    assert len(hook.scripts) == 1 and f"if [ -f {pylibs.marker} ]" in hook.scripts[0]
    assert summary["set"] == environment.key and summary["directory"] == str(pylibs.dir)
    assert summary["image"] == SIF and summary["image_identity"] == IDENTITY and summary["state"] == "present"


def test_jobs_synced_before_sets_were_keyed_by_image_get_the_set_their_scripts_name() -> None:
    """A DAG run whose sync_code ran before this key (no environment in its XCom) rendered its jobs for
    the directory of the pins' hash: provision_env fills that one."""
    from vcloud_pipeline.dag.tasks import provision
    from vcloud_pipeline.plan.request import parse_request
    from vcloud_pipeline.plan.run_plan import RunPlan, SyncedCode

    profile = complete_profile("lumi")
    plan = RunPlan.build(parse_request({"profile": "lumi", "config": "full", "run_name": "older"}), profile)
    pins = parse_requirements(PINS)
    synced = SyncedCode.recording("0" * 64, {}, requirements=pins.pins, requirements_hash=pins.hash)
    pylibs = pylibs_set(profile, pins.hash)
    assert pylibs is not None
    hook = _Answers(0, f"VCLOUD-PROVISION present {pylibs.dir}\n")
    assert provision(plan, hook, synced)["directory"] == str(pylibs.dir)  # type: ignore[arg-type]
