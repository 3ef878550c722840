"""The provisioning step's pure parts: the requirement set and its hash, where a set goes, the script
(a golden file per place, shellcheck), what its output means, and the hints for a failure."""

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


def test_a_set_goes_to_a_directory_of_its_hash_in_pylibs_and_profiles_without_pylibs_have_none() -> None:
    lumi, requirements = complete_profile("lumi"), parse_requirements(PINS)
    pylibs = pylibs_set(lumi, requirements.hash)
    assert pylibs is not None
    assert pylibs.dir == PurePosixPath(f"/projappl/project_465002500/pylibs/{requirements.hash}")
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
    profile, requirements = complete_profile("lumi", extra), parse_requirements(PINS)
    pylibs = pylibs_set(profile, requirements.hash)
    assert pylibs is not None
    script = build_provision_script(profile, pylibs, requirements)
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


def test_a_set_in_another_directory_is_refused() -> None:
    profile = complete_profile("lumi")
    pylibs = pylibs_set(profile, parse_requirements(PINS).hash)
    assert pylibs is not None
    with pytest.raises(ProvisionSetupError, match="is not the one of requirement set"):
        build_provision_script(profile, pylibs, parse_requirements("numpy==2.4.6\n"))


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
    done = provision_environment(complete_profile("local"), _NoCluster(), runtime_requirements())  # type: ignore[arg-type]
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
        provision_environment(complete_profile("lumi"), hook, parse_requirements("tifffile==9.9.9\n"))  # type: ignore[arg-type]
    message = str(failure.value)
    assert "pip could not install what the container lacks; no job of the run was submitted" in message
    assert "No matching distribution found for tifffile==9.9.9" in message
    assert "Hint: The package index has no wheel of a pinned version" in message
    assert "Hint (lumi): On LUMI install from a login node" in message
    assert len(hook.scripts) == 1
