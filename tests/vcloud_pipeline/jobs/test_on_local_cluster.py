"""End to end on the local Slurm cluster, through its real SSH login, as the cluster user.

Sync the code with the argv from code_tree.py, upload the manifest and the rendered scripts, submit with
``sbatch``, and read what the job wrote. Jobs run in the local profile's Charliecloud image (built by
``make image``); the inner script logs the image's build hash, which must be the one next to the
image. The stop-signal tests use a stand-in trainer in its own code tree, so they show the whole
relay (Slurm -> outer -> srun -> ch-run -> inner -> trainer in the container -> requeue) without
depending on a dataset.
"""

from __future__ import annotations

import datetime as dt
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from support.localcluster import LocalCluster, poll_until
from vcloud_pipeline.plan.jobspec import JobSpec
from vcloud_pipeline.plan.layout import RunPaths, run_paths
from vcloud_pipeline.profile import ClusterProfile, load_profile
from vcloud_pipeline.jobs.render import EXIT_CODE_MISMATCH, RenderedJob, render_job
from vcloud_pipeline.code.tree import (
    CodeManifest,
    CodeTree,
    build_manifest,
    code_hash,
    code_sync_argv,
    refuse_unanchored_excludes,
    scripts_sync_argv,
)
from slurm_provider.cli.job_files import job_log_name
from slurm_provider.watch.end_records import EndRecord, end_record_path, parse_end_record
from slurm_provider.hooks import SlurmHook
from tests.vcloud_pipeline.jobs.test_job_scripts import LAUNCHER, SLOW_START, STAND_IN_TRAINER, TRAINER_PACKAGE

pytestmark = pytest.mark.usefixtures("cluster_connection")  # rsync logs in with the profile's connection
REPO = Path(__file__).resolve().parents[3]
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}
BUILD_IMAGE = REPO / "include" / "local_cluster" / "build_image.sh"


def image_line(cluster: LocalCluster) -> str:
    """What the inner script logs in the local image: its build hash, as the cluster user reads it."""
    container = load_profile("local").container
    assert container is not None and container.runtime == "charliecloud"
    built = cluster.ssh(f"cat {shlex.quote(container.image + '.sha256')}").stdout.strip()
    assert len(built) == 64, built
    return f"vcloud inner script: in Charliecloud image {built} on "


def setup_run(cluster: LocalCluster, tree: CodeTree, tmp_path: Path) -> tuple[ClusterProfile, RunPaths, CodeManifest]:
    """A fresh base directory on the cluster with the tree synced and its manifest in place."""
    profile = load_profile("local", overrides={"paths.base": cluster.test_dir()})
    paths = run_paths(profile, "it")
    cluster.ssh("mkdir -p " + " ".join(shlex.quote(str(d)) for d in paths.directories_to_create()))
    refuse_unanchored_excludes(tree)
    manifest = build_manifest(tree, dt.datetime.now(dt.timezone.utc))
    code = paths.code(manifest.hash)
    with SlurmHook(profile.connection.conn_id).ssh_command() as ssh:
        subprocess.run(code_sync_argv(tree, ssh.destination, code.dir, ssh.argv),
                       check=True, capture_output=True, timeout=300)
    cluster.ssh(f"cat > {shlex.quote(str(code.manifest))}", input=manifest.to_json())
    return profile, paths, manifest


def place_scripts(profile: ClusterProfile, job: RenderedJob, tmp_path: Path) -> None:
    """The job's outer and inner scripts where it reads them on the cluster."""
    local_jobs = tmp_path / "jobs"
    local_jobs.mkdir(exist_ok=True)
    (local_jobs / job.outer_path.name).write_text(job.outer)
    (local_jobs / job.inner_path.name).write_text(job.inner)
    with SlurmHook(profile.connection.conn_id).ssh_command() as ssh:
        subprocess.run(scripts_sync_argv(local_jobs, ssh.destination, job.outer_path.parent, ssh.argv),
                       check=True, capture_output=True, timeout=120)


def submit(cluster: LocalCluster, profile: ClusterProfile, job: RenderedJob, tmp_path: Path,
           options: tuple[str, ...] = ()) -> int:
    """Place the job's scripts and submit it (``options`` go to sbatch before the script's own)."""
    place_scripts(profile, job, tmp_path)
    argv = [job.submit_argv[0], *options, *job.submit_argv[1:]]
    return int(cluster.ssh(shlex.join(argv)).stdout.strip().split(";")[0])


def test_preflight_job_imports_everything_in_the_job_environment(local_cluster: LocalCluster, tmp_path: Path) -> None:
    tree = CodeTree(REPO)
    profile, paths, manifest = setup_run(local_cluster, tree, tmp_path)

    # what arrived on the cluster hashes exactly like the local tree
    back = tmp_path / "back"
    with SlurmHook(profile.connection.conn_id).ssh_command() as ssh:
        pull = ["rsync", "-a", "-s", "--exclude=/.vcloud_manifest.json", "-e", ssh.shell,
                f"{ssh.destination}:{paths.code(manifest.hash).dir}/", f"{back}/"]
        subprocess.run(pull, check=True, capture_output=True, timeout=300)
    assert (back / "trainer/src/vcloud/data/__init__.py").exists()
    assert code_hash(back) == manifest.hash

    job = render_job(profile, JobSpec.preflight(), paths, manifest.hash)
    job_id = submit(local_cluster, profile, job, tmp_path)
    state = local_cluster.wait_for_state(job_id, FINAL, timeout=600)
    log = local_cluster.ssh(f"cat {shlex.quote(str(job.stdout_path(str(job_id))))}", check=False).stdout
    err = local_cluster.ssh(f"cat {shlex.quote(str(job.stderr_path(str(job_id))))}", check=False).stdout
    assert state == "COMPLETED", log + err
    for module in ("vcloud", "vcloud.data", "tifffile", "rasterio", "torch"):
        assert f"preflight: {module} " in log
    assert f"{paths.code(manifest.hash).dir}/trainer/src/vcloud/data/__init__.py" in log
    assert "preflight: OK" in log
    assert f"with code {manifest.hash}" in err
    assert image_line(local_cluster) in err  # the imports ran inside the built image


def test_the_image_is_current_readable_and_has_a_mount_point_for_every_bind(local_cluster: LocalCluster) -> None:
    container = load_profile("local").container
    assert container is not None
    check = local_cluster.root("bash", str(BUILD_IMAGE), "check", check=False)
    assert check.returncode == 0, "the image is missing or older than trainer/requirements-runtime.txt: make image"
    image = shlex.quote(container.image)
    inside = local_cluster.ssh(f"cat {image}/etc/vcloud-image.sha256").stdout.strip()
    assert image_line(local_cluster) == f"vcloud inner script: in Charliecloud image {inside} on "
    for bind in container.binds:
        assert local_cluster.ssh(f"test -d {image}{shlex.quote(bind)}", check=False).returncode == 0, bind
    # ch-run as the cluster user, outside Slurm: the image's interpreter, not the host's
    out = local_cluster.ssh(f"ch-run {image} -- /opt/vcloud-localcluster/venv/bin/python -c "
                            + shlex.quote("import os, torch; print(os.environ['CH_RUNNING'], torch.__version__)")).stdout
    assert out.strip() == "Weird Al Yankovic 2.13.0+cpu"


def test_job_refuses_to_start_without_the_code_of_its_hash(local_cluster: LocalCluster, tmp_path: Path) -> None:
    """Rendered for code the cluster does not hold (never synced, or its directory was removed):
    the other hash's code directory next to it is never used instead."""
    src = tmp_path / "src"
    (src / "trainer/src/vcloud").mkdir(parents=True)
    (src / "trainer/src/vcloud/__init__.py").write_text("")
    profile, paths, manifest = setup_run(local_cluster, CodeTree(src), tmp_path)
    stale = "0" * 64
    job = render_job(profile, JobSpec.preflight(), paths, stale)
    job_id = submit(local_cluster, profile, job, tmp_path)
    assert local_cluster.wait_for_state(job_id, FINAL, timeout=600) == "FAILED"
    runs = poll_until(lambda: [r for r in local_cluster.sacct_runs(job_id) if r["ExitCode"] != "0:0"],
                      timeout=60, what="the exit code in sacct")
    assert runs[-1]["ExitCode"] == f"{EXIT_CODE_MISMATCH}:0"
    err = local_cluster.ssh(f"cat {shlex.quote(str(job.stderr_path(str(job_id))))}").stdout
    assert f"code manifest {paths.code(stale).manifest} is missing" in err
    assert manifest.hash not in err
    record = left_record(local_cluster, job, job_id)
    assert record.exit_code == EXIT_CODE_MISMATCH and record.ends(str(job_id), 0)


def test_a_job_named_on_the_command_line_leaves_its_record_where_its_watch_looks(local_cluster: LocalCluster,
                                                                              tmp_path: Path) -> None:
    """The operator names the job and its output on sbatch's command line (the name adoption finds
    it by), not the script's directives: the record follows the name the job was given."""
    src = tmp_path / "src"
    (src / "trainer/src/vcloud").mkdir(parents=True)
    (src / "trainer/src/vcloud/__init__.py").write_text("")
    profile, paths, _ = setup_run(local_cluster, CodeTree(src), tmp_path)
    job = render_job(profile, JobSpec.preflight(), paths, "0" * 64)  # refuses to start: a quick end
    submit(local_cluster, profile, job, tmp_path)  # places the scripts
    name = "vcloud_training.preflight.0123456789"
    output = str(paths.logs_dir / job_log_name(name, "%j", "out"))
    argv = ["sbatch", "--parsable", f"--job-name={name}", f"--output={output}", str(job.outer_path)]
    job_id = int(local_cluster.ssh(shlex.join(argv)).stdout.strip().split(";")[0])
    local_cluster.wait_for_state(job_id, FINAL, timeout=600)
    watched = end_record_path(output.replace("%j", str(job_id)))  # what the trigger reads
    record = parse_end_record(local_cluster.ssh(f"cat {shlex.quote(watched)}", check=False).stdout)
    assert record is not None and record.exit_code == EXIT_CODE_MISMATCH and record.ends(str(job_id), 0)


def left_record(cluster: LocalCluster, job: RenderedJob, job_id: int, timeout: float = 30) -> EndRecord:
    """The exit record the job's outer script left next to its output (what its watch reads).

    Read again for ``timeout`` seconds while the login node does not answer or the file does not
    parse; then the failure shows what the last read got and what the log directory holds."""
    path = end_record_path(str(job.stdout_path(str(job_id))))
    reads: list[subprocess.CompletedProcess[str]] = []

    def read() -> EndRecord | None:
        reads.append(cluster.ssh(f"cat {shlex.quote(path)}", check=False))
        return parse_end_record(reads[-1].stdout)

    try:
        return poll_until(read, timeout=timeout, interval=1, what=f"the exit record {path}")
    except AssertionError as exc:
        last = reads[-1]
        listing = cluster.ssh(f"ls -la --time-style=full-iso {shlex.quote(str(Path(path).parent))}",
                              check=False).stdout
        raise AssertionError(f"{exc}; the last read exited {last.returncode} with {last.stdout!r} "
                             f"(stderr {last.stderr.strip()!r}); the directory holds:\n{listing}") from None


def start_stand_in_trainer(cluster: LocalCluster, tmp_path: Path,
                           trainer: str = STAND_IN_TRAINER) -> tuple[RenderedJob, int, Callable[[str], str]]:
    """Submit stage 0 with the stand-in trainer (it records the signal that stopped it).

    Returns the job, its id, and the quoted path of one of the trainer's records by name
    (``starting.0``, ``ready.0``, ``stopped.0``).
    """
    src = tmp_path / "src"
    (src / "trainer/src/vcloud").mkdir(parents=True)
    (src / "trainer/src/vcloud/__init__.py").write_text("")
    (src / "trainer/src/vcloud/train.py").write_text(trainer)
    profile, paths, manifest = setup_run(cluster, CodeTree(src), tmp_path)
    job = render_job(profile, JobSpec.train(0, time_limit="00:10:00"), paths, manifest.hash)
    job_id = submit(cluster, profile, job, tmp_path)
    return job, job_id, lambda name: shlex.quote(str(paths.outputs_dir / name))


def test_pre_timeout_signal_checkpoints_and_requeues(local_cluster: LocalCluster, tmp_path: Path) -> None:
    job, job_id, record = start_stand_in_trainer(local_cluster, tmp_path)
    ready, stopped = record("ready.0"), record("stopped.0")
    err_path = shlex.quote(str(job.stderr_path(str(job_id))))
    try:
        poll_until(lambda: local_cluster.ssh(f"test -e {ready}", check=False).returncode == 0,
                   timeout=600, what="the stand-in trainer to start")
        # what Slurm does at <lead> seconds before the time limit: USR2 to the batch shell only
        local_cluster.ssh(f"scancel --batch --signal=USR2 {job_id}")
        poll_until(lambda: "restart 1" in local_cluster.ssh(f"cat {err_path}", check=False).stdout,
                   timeout=600, what="the job to be requeued and start again")
        # the second start's inner script logs its image line a moment after the outer "restart 1"
        err = poll_until(lambda: (text := local_cluster.ssh(f"cat {err_path}").stdout).count(
            image_line(local_cluster)) >= 2 and text, timeout=120, what="the resumed start inside the image")
        assert "received SIGUSR2" in err, err
        assert "job step finished with exit code 85" in err, err
        assert "requeued: the next start resumes from the checkpoint" in err, err
        assert local_cluster.ssh(f"cat {stopped}").stdout == "USR2"
        first = left_record(local_cluster, job, job_id)  # the second start still runs
        assert (first.restart, first.exit_code, first.requeued) == (0, 85, True), first
        assert not first.ends(str(job_id), 1), "the requeued start's record is not the job's end"
        assert err.count(image_line(local_cluster)) >= 2  # both starts ran in the image
    finally:
        local_cluster.ssh(f"scancel {job_id}", check=False)


def test_pre_timeout_signal_before_the_trainer_can_handle_it_requeues(local_cluster: LocalCluster,
                                                                     tmp_path: Path) -> None:
    """Slurm may send USR2 up to a minute early, e.g. while the trainer is still importing torch."""
    job, job_id, record = start_stand_in_trainer(local_cluster, tmp_path, trainer=SLOW_START + STAND_IN_TRAINER)
    err_path, starting = shlex.quote(str(job.stderr_path(str(job_id)))), record("starting.0")
    try:
        poll_until(lambda: local_cluster.ssh(f"test -e {starting}", check=False).returncode == 0,
                   timeout=600, what="the stand-in trainer to begin starting")
        local_cluster.ssh(f"scancel --batch --signal=USR2 {job_id}")
        # With several nodes the next start may begin on another node while the first start's script
        # is still writing its last lines to the same (appended) log: wait for both.
        err = poll_until(lambda: (text := local_cluster.ssh(f"cat {err_path}", check=False).stdout).count(
            image_line(local_cluster)) >= 2 and "requeued: the next start" in text and text, timeout=600,
            what="the job to be requeued and start again")
        assert "vcloud inner script: stopped after SIGUSR2, exit code 140" in err  # 128 + USR2: died of it
        assert "job step finished with exit code 140" in err
        assert "the job step died of SIGUSR2 itself" in err
        assert "requeued: the next start resumes from the checkpoint" in err and "(restart 1)" in err
    finally:
        local_cluster.ssh(f"scancel {job_id}", check=False)


def test_scancel_reaches_the_trainer_inside_the_container(local_cluster: LocalCluster, tmp_path: Path) -> None:
    job, job_id, record = start_stand_in_trainer(local_cluster, tmp_path)
    ready, stopped = record("ready.0"), record("stopped.0")
    try:
        poll_until(lambda: local_cluster.ssh(f"test -e {ready}", check=False).returncode == 0,
                   timeout=600, what="the stand-in trainer to start")
        local_cluster.ssh(f"scancel {job_id}")
        assert local_cluster.wait_for_state(job_id, FINAL, timeout=300) == "CANCELLED"
        poll_until(lambda: local_cluster.ssh(f"test -e {stopped}", check=False).returncode == 0,
                   timeout=60, what="the trainer's stop record")
        assert local_cluster.ssh(f"cat {stopped}").stdout == "TERM"  # the trainer's handler ran
        err = local_cluster.ssh(f"cat {shlex.quote(str(job.stderr_path(str(job_id))))}").stdout
        assert image_line(local_cluster) in err
    finally:
        local_cluster.ssh(f"scancel {job_id}", check=False)


RENDEZVOUS_TRAINER = """
import datetime, os, pathlib, sys, time
import torch
import torch.distributed as dist
out = pathlib.Path(sys.argv[sys.argv.index("--out") + 1])  # the run's outputs, shared by both jobs
job, rank = os.environ["SLURM_JOB_ID"], os.environ["RANK"]
dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=15))  # through this job's rendezvous
(out / f"up.{job}.{rank}").write_text(os.environ["MASTER_PORT"])
for _ in range(9000):  # until both jobs' ranks are up at once, each job's rendezvous still held
    if len(list(out.glob("up.*"))) >= 4:
        break
    time.sleep(0.1)
else:
    sys.exit("the other job's ranks never came up beside this job's")
total = torch.tensor([1.0])
dist.all_reduce(total)
(out / f"sum.{job}.{rank}").write_text(str(int(total.item())))
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_two_multi_gpu_jobs_train_on_one_node_at_once_each_on_its_own_rendezvous_port(
        local_cluster: LocalCluster, tmp_path: Path) -> None:
    """Two 2-GPU stage jobs on one node of a shared partition (small-g), whose ranks are in their
    process groups at the same time: each job's torchrun rendezvous has a port of its own."""
    src = tmp_path / "src"
    package = src / "trainer/src/vcloud"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(RENDEZVOUS_TRAINER)
    for module in LAUNCHER:
        (package / module).write_text((TRAINER_PACKAGE / module).read_text())
    profile, paths, manifest = setup_run(local_cluster, CodeTree(src), tmp_path)
    node = "nid005001"
    jobs = {}
    for stage in (0, 1):
        job = render_job(profile, JobSpec.train(stage, gpus_per_node=2, time_limit="00:20:00"), paths, manifest.hash)
        jobs[submit(local_cluster, profile, job, tmp_path, (f"--nodelist={node}", "--hold"))] = job
    try:
        local_cluster.ssh("scontrol release " + ",".join(map(str, jobs)))
        states = {job_id: local_cluster.wait_for_state(job_id, FINAL, timeout=1200) for job_id in jobs}
    finally:
        local_cluster.ssh("scancel " + " ".join(map(str, jobs)), check=False)
    errs = {job_id: local_cluster.ssh(f"cat {shlex.quote(str(job.stderr_path(str(job_id))))}", check=False).stdout
            for job_id, job in jobs.items()}
    assert set(states.values()) == {"COMPLETED"}, (states, errs)
    outputs = shlex.quote(str(paths.outputs_dir))
    ports = {job_id: {local_cluster.ssh(f"cat {outputs}/up.{job_id}.{rank}").stdout for rank in (0, 1)}
             for job_id in jobs}
    assert all(len(found) == 1 for found in ports.values()), ports  # both ranks of a job share its rendezvous
    port_of = {job_id: next(iter(found)) for job_id, found in ports.items()}
    assert len(set(port_of.values())) == 2, port_of
    for job_id in jobs:
        assert f"torchrun rendezvous on {node}:" in errs[job_id], errs[job_id]
        # Each job's two ranks reduced together: their own group, not one spanning both jobs.
        assert {local_cluster.ssh(f"cat {outputs}/sum.{job_id}.{rank}").stdout for rank in (0, 1)} == {"2"}
    nodes = {job_id: local_cluster.ssh(f"sacct -X -n -P -j {job_id} --format=NodeList").stdout.strip()
             for job_id in jobs}
    assert set(nodes.values()) == {node}, nodes
    print(f"two 2-GPU jobs at once on {node}: rendezvous ports {port_of}")


ARGV_RECORDING_TRAINER = """
import os, pathlib, sys
out = pathlib.Path(sys.argv[sys.argv.index("--out") + 1])
out.mkdir(parents=True, exist_ok=True)
(out / f"argv.{os.environ['SLURM_JOB_ID']}").write_text(" ".join(sys.argv[1:]))
"""


def test_a_queued_job_runs_the_script_it_was_submitted_with_after_its_run_name_is_rendered_again(
        local_cluster: LocalCluster, tmp_path: Path) -> None:
    """Stage 0 of a run name is submitted held (3 epochs); the same job is rendered and placed again
    with 7 epochs, as a second trigger of the run name does; the held job, released, runs its own
    inner script: its log names that script's sha256, its trainer got 3 epochs."""
    import hashlib

    src = tmp_path / "src"
    (src / "trainer/src/vcloud").mkdir(parents=True)
    (src / "trainer/src/vcloud/__init__.py").write_text("")
    (src / "trainer/src/vcloud/train.py").write_text(ARGV_RECORDING_TRAINER)
    profile, paths, manifest = setup_run(local_cluster, CodeTree(src), tmp_path)
    first = render_job(profile, JobSpec.train(0, max_epochs=3, time_limit="00:10:00"), paths, manifest.hash)
    job_id = submit(local_cluster, profile, first, tmp_path, ("--hold",))
    try:
        again = render_job(profile, JobSpec.train(0, max_epochs=7, time_limit="00:10:00"), paths, manifest.hash)
        assert again.job_name == first.job_name and again.inner_path != first.inner_path
        place_scripts(profile, again, tmp_path)
        local_cluster.ssh(f"scontrol release {job_id}")
        state = local_cluster.wait_for_state(job_id, FINAL, timeout=600)
    finally:
        local_cluster.ssh(f"scancel {job_id}", check=False)
    err = local_cluster.ssh(f"cat {shlex.quote(str(first.stderr_path(str(job_id))))}", check=False).stdout
    assert state == "COMPLETED", err
    digest = hashlib.sha256(first.inner.encode()).hexdigest()
    assert f"inner script sha256 {digest}" in err, err
    argv = local_cluster.ssh(f"cat {shlex.quote(str(paths.outputs_dir / f'argv.{job_id}'))}").stdout.split()
    assert argv[argv.index("--max-epochs") + 1] == "3", argv
    # Both scripts stay on the cluster, each under its own name, as rendered.
    for job in (first, again):
        assert local_cluster.ssh(f"cat {shlex.quote(str(job.inner_path))}").stdout == job.inner
