"""Job scripts: golden files per profile and kind, shellcheck on every render, LUMI's must-haves."""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from vcloud_pipeline.plan.jobspec import JobSpec
from vcloud_pipeline.plan.layout import run_paths
from vcloud_pipeline.profile import ClusterProfile, ProfileError, load_profile
from vcloud_pipeline.provision.environment import JobEnvironment
from vcloud_pipeline.provision.requirements import parse_requirements
from vcloud_pipeline.jobs.render import (
    CODE_HASH_ENV,
    EXIT_CODE_MISMATCH,
    OUTPUTS_MIRROR_ENV,
    RANK_EXITS_DIR_ENV,
    RenderError,
    RenderedJob,
    directive_value,
    render_job,
    render_template,
    shell_word,
)
from tests.vcloud_pipeline.conftest import complete_profile

GOLDEN = Path(__file__).parents[1] / "golden"
CODE_HASH = hashlib.sha256(b"vcloud golden code tree").hexdigest()
GOLDEN_PINS = ("PyYAML==6.0.3", "tifffile==2026.3.3", "torch==2.13.0")
GOLDEN_IMAGE_IDENTITY = "size 21474836480 mtime 1767225600"


def golden_environment(profile: ClusterProfile) -> JobEnvironment:
    """The pins and image identity the golden jobs are rendered for (LUMI's PYTHONPATH names their set)."""
    return JobEnvironment.of(profile, parse_requirements("\n".join(GOLDEN_PINS)), GOLDEN_IMAGE_IDENTITY)
UPDATE = os.environ.get("VCLOUD_UPDATE_GOLDEN") == "1"

CASES = {
    "lumi_stage": ("lumi", JobSpec.train(1, on_code_change="keep_weights")),
    "lumi_stage_multinode": ("lumi", JobSpec.train(1, partition="standard-g", nodes=2, gpus_per_node=8,
                                                      config="trainer/configs/model_full.yaml")),
    "lumi_export": ("lumi", JobSpec.export(config="trainer/configs/model_full.yaml")),
    "lumi_preflight": ("lumi", JobSpec.preflight()),
    "levante_stage": ("levante", JobSpec.train(0, gpus_per_node=4, max_epochs=5, on_code_change="refuse")),
    "levante_export": ("levante", JobSpec.export()),
    "levante_preflight": ("levante", JobSpec.preflight()),
    "cosmos_stage": ("cosmos", JobSpec.train(2)),
    "cosmos_stage_multinode": ("cosmos", JobSpec.train(3, nodes=4, gpus_per_node=4, restart=True)),
    "cosmos_export": ("cosmos", JobSpec.export()),
    "cosmos_preflight": ("cosmos", JobSpec.preflight()),
    "local_stage": ("local", JobSpec.train(0, max_epochs=2, on_code_change="keep_weights")),
    "local_export": ("local", JobSpec.export()),
    "local_preflight": ("local", JobSpec.preflight()),
    "local_bare_stage": ("local", JobSpec.train(0, max_epochs=2)),
    "local_bare_preflight": ("local", JobSpec.preflight()),
}
BARE = {"container.runtime": "none"}
"""The local profile without its container: jobs run in the host's venv."""


def render_case(case: str) -> RenderedJob:
    profile_name, spec = CASES[case]
    profile = complete_profile(profile_name, BARE if "_bare_" in case else None)
    return render_job(profile, spec, run_paths(profile, "full"), CODE_HASH, environment=golden_environment(profile))


def shellcheck(*scripts: str, tmp_path: Path) -> None:
    exe = shutil.which("shellcheck") or "/usr/bin/shellcheck"
    files = []
    for i, text in enumerate(scripts):
        path = tmp_path / f"script{i}.sh"
        path.write_text(text)
        files.append(str(path))
    result = subprocess.run([exe, "--shell=bash", "--severity=style", *files], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str) -> None:
    job = render_case(case)
    for suffix, text in (("outer.sbatch", job.outer), ("inner.sh", job.inner)):
        path = GOLDEN / f"{case}.{suffix}"
        if UPDATE:
            path.write_text(text)
        assert path.exists(), f"{path} missing: run with VCLOUD_UPDATE_GOLDEN=1 and review the diff"
        assert text == path.read_text(), f"{case} {suffix} differs from {path} (VCLOUD_UPDATE_GOLDEN=1 to accept)"


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_rendered_script_is_shellcheck_clean(case: str, tmp_path: Path) -> None:
    job = render_case(case)
    shellcheck(job.outer, job.inner, tmp_path=tmp_path)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_job_requeues_appends_and_gets_usr2_before_the_limit(case: str) -> None:
    job = render_case(case)
    lead = complete_profile(CASES[case][0]).jobs.signal_lead_seconds
    assert "#SBATCH --requeue\n" in job.outer
    assert "#SBATCH --open-mode=append\n" in job.outer
    assert f"#SBATCH --signal=B:USR2@{lead}\n" in job.outer
    assert "USR1" not in job.outer + job.inner
    assert f"#SBATCH --output={job.stdout_pattern}" in job.outer and "/logs/full/%x.%j.out" in job.outer
    assert "trap 'on_signal USR2' USR2" in job.outer and "trap 'on_signal USR2' USR2" in job.inner
    assert f"readonly EXPECTED_CODE_HASH={CODE_HASH}" in job.outer
    assert f"readonly EXIT_CODE_MISMATCH={EXIT_CODE_MISMATCH}" in job.outer
    assert job.outer.startswith("#!/bin/bash\n#SBATCH --job-name=vcloud-full-")
    assert job.submit_argv == ("sbatch", "--parsable", str(job.outer_path))
    assert str(job.inner_path) in job.outer


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_job_runs_only_the_code_directory_of_its_hash(case: str) -> None:
    """PYTHONPATH, the config, ch-run's --cd and the manifest: all inside <paths.code>/<hash>/, so a
    later sync of other code (another directory) cannot change what a requeued job runs."""
    job = render_case(case)
    profile = complete_profile(CASES[case][0], BARE if "_bare_" in case else None)
    code_root = profile.paths.code.rstrip("/") + "/"
    text = job.outer + job.inner
    uses = [text[i + len(code_root):i + len(code_root) + 65] for i in range(len(text)) if text.startswith(code_root, i)]
    assert uses and all(use[:64] == CODE_HASH and not use[64:].isalnum() for use in uses), uses
    assert f"export {CODE_HASH_ENV}={CODE_HASH}\n" in job.inner
    assert f"readonly CODE_MANIFEST={code_root}{CODE_HASH}/.vcloud_manifest.json\n" in job.outer
    other = render_job(profile, CASES[case][1], run_paths(profile, "full"), "0" * 64)
    assert CODE_HASH not in other.outer + other.inner


def test_the_trainer_reads_the_code_hash_where_the_scripts_put_it() -> None:
    from vcloud.training import provenance

    assert provenance.CODE_HASH_ENV == CODE_HASH_ENV


def test_lumi_render_has_the_guides_settings_and_none_of_the_traps() -> None:
    job = render_case("lumi_stage")
    hint = next(line for line in job.inner.splitlines() if line.startswith("export VCLOUD_GPU_HINT="))
    assert "never add --rocm" in hint
    text = (job.outer + job.inner).replace(hint, "")
    assert "--rocm" not in text
    assert "module load" not in text and "module " not in text
    assert "export SINGULARITY_CONTAINLIBS=/usr/lib64/libcxi.so.1,/opt/rocm/lib/librocm_smi64.so.7\n" in job.outer
    assert "export SINGULARITY_BIND=" in job.outer and "/opt/cray" in job.outer
    assert "export PYTORCH_HIP_ALLOC_CONF=expandable_segments:True\n" in job.inner
    assert "export WANDB_MODE=disabled\n" in job.inner
    assert 'export MIOPEN_USER_DB_PATH=/tmp/miopen_cache_"${SLURM_JOB_ID}"\n' in job.inner
    assert 'export MIOPEN_CUSTOM_CACHE_DIR="${MIOPEN_USER_DB_PATH}"\n' in job.inner
    assert "export MIOPEN_FIND_MODE=1\n" in job.inner
    assert "MIOPEN_DISABLE_CACHE" not in text
    pythonpath = next(line for line in job.inner.splitlines() if line.startswith("export PYTHONPATH="))
    key = golden_environment(complete_profile("lumi")).key
    assert f"/scratch/project_465002500/vcloud/code/{CODE_HASH}/trainer/src:/projappl/project_465002500/pylibs/" \
        f"{key}\"" in pythonpath
    # the job's log states which set it imports from and the image that set was built for
    assert (f"packages outside the container from requirement set {key} in /projappl/project_465002500/pylibs/{key}, "
            "provisioned for image /appl/local/csc/soft/ai/images/pytorch_2.5.1_lumi_rocm6.2.4_flash-attn-3.0.0.post1"
            f".sif ({GOLDEN_IMAGE_IDENTITY})") in job.inner
    assert "singularity exec" in job.outer and "pytorch_2.5.1_lumi_rocm6.2.4" in job.outer
    assert "#SBATCH --account=project_465002500" in job.outer and "#SBATCH --partition=small-g" in job.outer
    assert "python3 -m vcloud.train --stage 1 --config" in job.inner


def test_lumi_multinode_launch_is_srun_plus_torchrun_with_eight_per_node() -> None:
    job = render_case("lumi_stage_multinode")
    assert "#SBATCH --nodes=2" in job.outer and "#SBATCH --gpus-per-node=8" in job.outer
    assert "#SBATCH --exclusive" in job.outer
    assert "srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=56 singularity exec" in job.outer
    assert "-m vcloud.launch" in job.inner and "--nproc_per_node=8" in job.inner
    assert '--node_rank="${SLURM_NODEID}"' in job.inner and "--nnodes=2" in job.inner
    assert "MASTER_ADDR=" in job.outer


def test_torchrun_jobs_name_one_exit_record_directory_in_both_scripts() -> None:
    """The inner script names it to the ranks; the outer empties it before the step and removes it after."""
    job = render_case("lumi_stage_multinode")
    records = shell_word(run_paths(complete_profile("lumi"), "full").exit_records_dir(job.job_name))
    assert f"export {RANK_EXITS_DIR_ENV}={records}\n" in job.inner
    assert f"readonly EXIT_RECORDS={records}\n" in job.outer
    assert job.outer.count('rm -rf "$EXIT_RECORDS"') == 2
    assert job.outer.index('rm -rf "$EXIT_RECORDS"') < job.outer.index("srun --nodes=2")
    for case in ("lumi_stage", "lumi_export", "local_stage"):
        single = render_case(case)
        assert RANK_EXITS_DIR_ENV not in single.inner and "EXIT_RECORDS" not in single.outer, case


def test_levante_requests_a100_gres_and_no_container() -> None:
    job = render_case("levante_stage")
    assert "#SBATCH --gres=gpu:a100_80:4" in job.outer and "--gpus" not in job.outer
    assert "singularity" not in job.outer
    assert "--max-epochs 5 --set train.on_code_change=refuse &" in job.inner


def test_cosmos_stages_to_node_local_disk_and_syncs_back() -> None:
    job = render_case("cosmos_stage")
    assert "module load rocm/6.3.0 singularitypro/4.1.3" in job.outer
    assert 'readonly NODE_LOCAL=/scratch/cosmouser/job_"${SLURM_JOB_ID}"' in job.outer
    assert 'rsync -a "${SHARED_DATA}/" "${NODE_LOCAL}/data/"' in job.outer
    assert job.outer.count("sync_back") >= 3  # defined, on the signal, after the step
    assert '--data /scratch/cosmouser/job_"${SLURM_JOB_ID}"/data' in job.inner
    assert "export NCCL_SOCKET_IFNAME=hsn0" in job.inner and "export RCCL_MSCCL_ENABLE=1" in job.inner
    assert "--dest" not in job.inner
    assert "--dest /cosmos/vast/scratch/cosmouser/vcloud/viewer_data/full" in render_case("cosmos_export").inner


@pytest.mark.parametrize("case", sorted(CASES))
def test_only_cosmos_training_jobs_name_the_shared_outputs_to_the_trainer(case: str) -> None:
    """Cosmos trains on node-local disk (staging.stage_outputs): its training jobs tell the trainer the
    shared output directory, the one sync_back copies to, so that every checkpoint is copied back as
    it is saved. Jobs whose outputs are on shared storage already (LUMI, Levante, local), the export
    and the preflight check do not set it."""
    job = render_case(case)
    exports = [line for line in job.inner.splitlines() if line.startswith(f"export {OUTPUTS_MIRROR_ENV}=")]
    if case in ("cosmos_stage", "cosmos_stage_multinode"):
        shared = next(line for line in job.outer.splitlines() if line.startswith("readonly SHARED_OUTPUTS="))
        assert exports == [f"export {OUTPUTS_MIRROR_ENV}={shared.split('=', 1)[1]}"]
        assert shared == "readonly SHARED_OUTPUTS=/cosmos/vast/scratch/cosmouser/vcloud/outputs/full"
        assert job.inner.index(exports[0]) < job.inner.index(" -m vcloud.train ")
        assert "--out /scratch/cosmouser/job_" in job.inner  # the trainer itself writes to node-local disk
    else:
        assert exports == [] and OUTPUTS_MIRROR_ENV not in job.outer + job.inner


def test_the_trainer_reads_the_outputs_mirror_where_the_scripts_put_it() -> None:
    from vcloud.training import mirror

    job = render_case("cosmos_stage")
    value = shlex.split(next(line for line in job.inner.splitlines()
                             if line.startswith(f"export {OUTPUTS_MIRROR_ENV}=")).split("=", 1)[1])[0]
    assert mirror.mirror_root({OUTPUTS_MIRROR_ENV: value}) == \
        Path("/cosmos/vast/scratch/cosmouser/vcloud/outputs/full")


def test_local_requests_one_emulated_gpu_and_runs_in_the_charliecloud_image() -> None:
    job = render_case("local_stage")
    assert "#SBATCH --gpus=1" in job.outer and "#SBATCH --account=vcloud_local" in job.outer
    assert "/opt/vcloud-localcluster/venv/bin/python -m vcloud.train --stage 0" in job.inner
    assert "#SBATCH --time=0-00:30:00" in job.outer
    assert "readonly IMAGE=/var/lib/vcloud-localcluster/images/vcloud-trainer\n" in job.outer
    assert 'USER="${USER:-$(id -un)}"\nexport USER\n' in job.outer  # ch-run refuses to start without it
    # srun starts ch-run, which becomes bash: srun's forwarded USR2/TERM reach the inner script.
    assert ('srun --ntasks-per-node=1 --cpus-per-task=2 ch-run -b /srv:/srv --home '
            f'--cd=/srv/vcloud/scratch/vcloud/code/{CODE_HASH} "$IMAGE" -- bash "$INNER_SCRIPT" &\n') in job.outer
    assert "SINGULARITY" not in job.outer and "singularity" not in job.outer
    assert 'if [ -z "${CH_RUNNING:-}" ]; then' in job.inner
    assert "cat /etc/vcloud-image.sha256" in job.inner and "in Charliecloud image ${image_hash}" in job.inner
    assert job.inner.index("CH_RUNNING") < job.inner.index(" -m vcloud.train ")


def test_the_bare_runtime_runs_the_inner_script_in_the_hosts_venv() -> None:
    job = render_case("local_bare_stage")
    assert 'srun --ntasks-per-node=1 --cpus-per-task=2 bash "$INNER_SCRIPT" &\n' in job.outer
    assert "ch-run" not in job.outer and "IMAGE" not in job.outer and "CH_RUNNING" not in job.inner
    assert "/opt/vcloud-localcluster/venv/bin/python -m vcloud.train --stage 0" in job.inner
    assert "runs in the job environment" in job.inner


def test_charliecloud_binds_follow_the_profile_and_paths_stay_quoted() -> None:
    profile = complete_profile("local", {"container.binds": ["/srv", "/data sets/it's"],
                                         "container.exec_args": ["--private-tmp"],
                                         "container.image": "/images/vcloud trainer"})
    job = render_job(profile, JobSpec.train(1), run_paths(profile, "full"), CODE_HASH)
    assert "readonly IMAGE='/images/vcloud trainer'\n" in job.outer
    launch = next(line for line in job.outer.splitlines() if line.lstrip().startswith("srun "))
    words = shlex.split(launch.strip().replace(' "$IMAGE"', " IMAGE").replace(' "$INNER_SCRIPT" &', " INNER"))
    assert words[words.index("ch-run"):] == [
        "ch-run", "--private-tmp", "-b", "/srv:/srv", "-b", "/data sets/it's:/data sets/it's", "--home",
        f"--cd=/srv/vcloud/scratch/vcloud/code/{CODE_HASH}", "IMAGE", "--", "bash", "INNER"]


def test_preflight_imports_the_packages_on_the_debug_partition() -> None:
    job = render_case("lumi_preflight")
    assert "#SBATCH --partition=dev-g" in job.outer
    for module in ("vcloud", "vcloud.data", "tifffile", "rasterio", "torch"):
        assert f'"{module}"' in job.inner


def test_placeholders_must_be_filled_before_rendering() -> None:
    profile = load_profile("levante")
    with pytest.raises(ProfileError, match="still set to CHANGE_ME"):
        render_job(profile, JobSpec.train(0), run_paths(profile, "r"), CODE_HASH)


def test_code_hash_must_be_a_digest() -> None:
    profile = load_profile("local")
    with pytest.raises(RenderError, match="not a sha256 hex digest"):
        render_job(profile, JobSpec.train(0), run_paths(profile, "r"), "abc; rm -rf /")


# --------------------------------------------------------------------------- quoting

AWKWARD_BASE = "/srv/vcloud scratch/it's \"quoted\" #1"


def awkward_job(tmp_path: Path | None = None) -> RenderedJob:
    base = AWKWARD_BASE if tmp_path is None else f"{tmp_path}/{AWKWARD_BASE.lstrip('/')}"
    profile = load_profile("local", overrides={"paths.base": base})
    return render_job(profile, JobSpec.train(1, config="trainer/configs/model tiny.yaml"),
                      run_paths(profile, "full"), CODE_HASH)


def test_paths_with_spaces_and_quotes_survive_the_shell(tmp_path: Path) -> None:
    job = awkward_job()
    shellcheck(job.outer, job.inner, tmp_path=tmp_path)
    script = tmp_path / "outer.sbatch"
    script.write_text(job.outer)
    probe = (f"eval \"$(grep -E '^readonly (CODE_MANIFEST|INNER_SCRIPT)=' {shlex.quote(str(script))})\"; "
             'printf "%s\\n%s\\n" "$CODE_MANIFEST" "$INNER_SCRIPT"')
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == [f"{AWKWARD_BASE}/code/{CODE_HASH}/.vcloud_manifest.json",
                   str(job.inner_path)]
    assert str(job.inner_path).startswith(f"{AWKWARD_BASE}/jobs/full/vcloud-full-stage1.inner.")
    command = next(line for line in job.inner.splitlines() if " -m vcloud.train " in line)
    words = shlex.split(command.replace(" &", ""))
    assert words[words.index("--config") + 1] == f"{AWKWARD_BASE}/code/{CODE_HASH}/trainer/configs/model tiny.yaml"
    assert words[words.index("--out") + 1] == f"{AWKWARD_BASE}/outputs/full"


def test_directive_values_use_sbatchs_double_quotes() -> None:
    job = awkward_job()
    assert '#SBATCH --output="/srv/vcloud scratch/it\'s \\"quoted\\" #1/logs/full/%x.%j.out"' in job.outer
    assert directive_value("small-g") == "small-g"
    assert directive_value("B:USR2@600") == "B:USR2@600"
    with pytest.raises(RenderError):
        directive_value("a\nb")


def test_shell_word_expands_only_the_job_id() -> None:
    assert shell_word("/tmp/miopen_cache_{job_id}") == '/tmp/miopen_cache_"${SLURM_JOB_ID}"'
    assert shell_word("/x/$HOME/{job_id}/y z") == "'/x/$HOME/'\"${SLURM_JOB_ID}\"'/y z'"
    assert shell_word("plain") == "plain"


def test_templates_refuse_unknown_names_and_quote_through_their_filters(tmp_path: Path) -> None:
    (tmp_path / "t.sh").write_text("{% if flag %}\nmkdir -p {{ dir | shq }}\n{% endif %}\n"
                                   "run {{ argv | shjoin }}\n#SBATCH --output={{ out | directive }}\n")
    text = render_template(str(tmp_path), "t.sh", flag=True, dir="/scratch/it's {job_id}",
                           argv=["a b", "$x"], out="/s p/%j.out")
    assert text == ("mkdir -p '/scratch/it'\"'\"'s '\"${SLURM_JOB_ID}\"\nrun 'a b' '$x'\n"
                    '#SBATCH --output="/s p/%j.out"\n')
    with pytest.raises(RenderError, match=r"template t.sh: 'flag' is undefined"):
        render_template(str(tmp_path), "t.sh", dir="/d", argv=[], out="/o")
    with pytest.raises(RenderError, match=r"job script template .*missing.sh is missing"):
        render_template(str(tmp_path), "missing.sh")




@pytest.mark.parametrize("on_code_change", ["keep_weights", "refuse"])
def test_the_runs_on_code_change_reaches_every_training_job_and_only_them(on_code_change: str) -> None:
    """From the DAG run's params through the plan's XCom to the trainer's command line."""
    from vcloud_pipeline.plan.request import parse_request
    from vcloud_pipeline.plan.run_plan import RunPlan
    from vcloud_pipeline.dag.tasks import plan_run

    planned = plan_run({"profile": "local", "config": "tiny", "on_code_change": on_code_change})
    jobs = RunPlan.from_xcom(planned).render(CODE_HASH)
    flag = f" --set train.on_code_change={on_code_change} &\n"
    assert [label for label, job in jobs.items() if flag in job.inner] == ["stage0", "stage1", "stage2", "stage3"]
    assert not any("on_code_change" in job.inner for label, job in jobs.items() if not label.startswith("stage"))
    assert parse_request({"profile": "local"}).on_code_change == "keep_weights"
