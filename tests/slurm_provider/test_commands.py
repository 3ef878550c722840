"""Command builders: exact argv, safe quoting proven by running the lines in a real shell.

The shell tests put a stand-in ``sbatch`` first on PATH that prints the argv and stdin it
received, so they check what the remote shell would hand to Slurm. The ``cluster`` tests run
the same lines over SSH on the local Slurm cluster.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_provider import commands
from slurm_provider.commands import (
    JobComment,
    build_read_log,
    build_read_progress,
    build_sacct,
    build_sacct_by_name,
    build_sbatch_submit,
    build_sbatch_test_only,
    build_scancel,
    build_scontrol_show_job,
    build_sinfo_unavailable_nodes,
    build_squeue,
    build_squeue_account_jobs,
    build_squeue_by_name,
    build_sshare_account,
    expand_filename_pattern,
    parse_job_comment,
    with_stdin_heredoc,
)
from slurm_provider.parsers import (
    is_invalid_job_id_error,
    parse_log_chunk,
    parse_progress,
    parse_sbatch_test_only,
    parse_squeue,
)
from slurm_provider.validation import ValidationError

COMMENT = JobComment(dag="vcloud_train", task="train_stage1", run="manual__2026-02-16T08:00:00+00:00", attempt=2, stage="1")


def argv_of(command: str) -> list[str]:
    """The words a POSIX shell would pass, after dropping a leading VAR=value assignment."""
    words = shlex.split(command)
    while words and "=" in words[0] and not words[0].startswith("-") and words[0].split("=")[0].isidentifier():
        words = words[1:]
    return words


# --- sbatch --------------------------------------------------------------------------------------


def test_sbatch_submit_argv() -> None:
    command = build_sbatch_submit(
        job_name="vcloud-stage1",
        output="/scratch/project_465002500/vcloud/logs/%x_%j.out",
        error="/scratch/project_465002500/vcloud/logs/%x_%j.err",
        comment=COMMENT,
        chdir="/scratch/project_465002500/vcloud",
        export={"START_STAGE": "1"},
        dependency="afterok:16082076",
        partition="small-g",
        account="project_465002500",
        time_limit="3-00:00:00",
        extra_options=["--gpus=1", "--mem=64G", "--requeue"],
    )
    argv = argv_of(command)
    assert argv[:2] == ["sbatch", "--parsable"]
    assert argv[2:] == [
        "--job-name=vcloud-stage1",
        "--output=/scratch/project_465002500/vcloud/logs/%x_%j.out",
        "--error=/scratch/project_465002500/vcloud/logs/%x_%j.err",
        f"--comment={COMMENT.to_json()}",
        "--chdir=/scratch/project_465002500/vcloud",
        "--export=ALL,START_STAGE=1",
        "--dependency=afterok:16082076",
        "--partition=small-g",
        "--account=project_465002500",
        "--time=3-00:00:00",
        "--gpus=1",
        "--mem=64G",
        "--requeue",
    ]
    assert not any(a.endswith((".sh", ".sbatch")) for a in argv), "the script travels on stdin"


def test_test_only_has_no_parsable() -> None:
    argv = argv_of(build_sbatch_test_only(job_name="x", output="/tmp/x.out", partition="dev-g"))
    assert argv[:2] == ["sbatch", "--test-only"] and "--parsable" not in argv


def test_injection_is_refused_before_any_command_exists() -> None:
    with pytest.raises(ValidationError) as caught:
        build_sbatch_submit(job_name="x", output="/tmp/x.out", partition="small-g; touch /tmp/pwned")
    assert caught.value.field == "partition"
    with pytest.raises(ValidationError, match="--job-name is set by the plugin"):
        build_sbatch_submit(job_name="x", output="/tmp/x.out", extra_options=["--job-name=y"])
    with pytest.raises(ValidationError) as caught:
        build_sbatch_submit(job_name="x", output="/tmp/x.out", comment="a|b")
    assert caught.value.field == "comment"


def test_job_comment_round_trip_and_matching() -> None:
    text = COMMENT.to_json()
    assert " " not in text and "|" not in text
    assert parse_job_comment(text) == COMMENT
    tricky = JobComment(dag="d", task="t", run="custom|run 'quoted'", attempt=1)
    assert "|" not in tricky.to_json()
    assert parse_job_comment(tricky.to_json()) == tricky
    assert COMMENT.same_task(JobComment(**{**COMMENT.__dict__, "attempt": 3}))
    assert not COMMENT.same_task(JobComment(**{**COMMENT.__dict__, "run": "other"}))
    assert not COMMENT.same_task(JobComment(**{**COMMENT.__dict__, "clear": 1}))
    assert not COMMENT.same_task(JobComment(**{**COMMENT.__dict__, "place": "0123456789"}))


def test_comment_keeps_clear_and_place_only_when_set() -> None:
    assert '"clear"' not in COMMENT.to_json() and '"place"' not in COMMENT.to_json()
    cleared = JobComment(**{**COMMENT.__dict__, "clear": 2, "place": "ab12cd34ef"})
    assert '"clear":2' in cleared.to_json() and '"place":"ab12cd34ef"' in cleared.to_json()
    assert parse_job_comment(cleared.to_json()) == cleared
    assert parse_job_comment(COMMENT.to_json()) == COMMENT
    assert parse_job_comment("hand-written comment") is None
    assert parse_job_comment('{"dag": "x"}') is None
    assert parse_job_comment(None) is None


def test_comment_carries_the_code_version_without_making_it_part_of_the_task() -> None:
    assert '"code"' not in COMMENT.to_json()
    versioned = JobComment(**{**COMMENT.__dict__, "code": "ab" * 32})
    assert f'"code":"{"ab" * 32}"' in versioned.to_json()
    assert parse_job_comment(versioned.to_json()) == versioned
    assert versioned.same_task(COMMENT)  # a job is adopted whatever code it runs


@pytest.fixture
def fake_sbatch(tmp_path: Path) -> Path:
    """A stand-in sbatch that prints its argv and stdin as JSON."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "sbatch"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        "print(json.dumps({'argv': sys.argv[1:], 'stdin': sys.stdin.read()}))\n"
    )
    script.chmod(0o755)
    return bin_dir


def run_sh(command: str, bin_dir: Path, stdin: str = "") -> dict:
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(["sh", "-c", command], input=stdin, capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout)


NASTY_PATH = "/srv/vcloud/run 1/it's \"quoted\" $HOME `id`;x/%x_%j.out"


def test_quoting_survives_a_real_shell(fake_sbatch: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    command = build_sbatch_submit(
        job_name="vcloud-stage1",
        output=NASTY_PATH,
        chdir="/srv/vcloud/run 1",
        comment=JobComment(dag="d", task="t", run=f"$(touch {marker})", attempt=1),
        export={"NOTE": "it's $HOME"},
    )
    script = "#!/bin/bash\necho \"$HOME\" 'single'\n"
    seen = run_sh(command, fake_sbatch, stdin=script)
    assert f"--output={NASTY_PATH}" in seen["argv"]
    assert "--chdir=/srv/vcloud/run 1" in seen["argv"]
    assert "--export=ALL,NOTE=it's $HOME" in seen["argv"]
    assert seen["stdin"] == script
    assert not marker.exists()


def test_heredoc_carries_the_script_unexpanded(fake_sbatch: Path) -> None:
    script = "#!/bin/bash\necho $HOME `id` \"$(date)\"\nSLURM_PROVIDER_SCRIPT_EOF\necho after\n"
    command = with_stdin_heredoc(build_sbatch_submit(job_name="x", output="/tmp/x.out"), script)
    seen = run_sh(command, fake_sbatch)
    assert seen["stdin"] == script
    assert "SLURM_PROVIDER_SCRIPT_EOF_1" in command


def test_heredoc_refuses_huge_scripts() -> None:
    with pytest.raises(ValidationError, match="send it as stdin"):
        with_stdin_heredoc("sbatch", "#!/bin/bash\n" + "x" * 200_000)


# --- squeue / sacct / scontrol / scancel / sinfo ---------------------------------------------------


def test_squeue_many_ids_with_fixed_unambiguous_format() -> None:
    command = build_squeue([16082076, "16082077", "123_4", "16082076"])
    assert command.startswith("SLURM_TIME_FORMAT=standard squeue ")
    argv = argv_of(command)
    assert argv[:6] == ["squeue", "-h", "-r", "-t", "all", "--jobs=16082076,16082077,123_4"]
    fmt = argv[6].removeprefix("--Format=").split(",")
    assert [f.split(":")[0] for f in fmt] == list(commands.SQUEUE_FIELDS)
    assert all(f.endswith(":|") for f in fmt[:-1]) and fmt[-1] == "Comment:"
    assert {"JobID", "State", "Reason", "RestartCnt", "Name", "Comment", "NodeList", "TimeUsed"} <= set(
        commands.SQUEUE_FIELDS
    )
    with pytest.raises(ValidationError):
        build_squeue(["1;rm -rf /"])


def test_squeue_of_the_account_and_of_the_login_user() -> None:
    command = build_squeue_account_jobs("project_465002500")
    by_account, own = command.split(" && ")
    assert argv_of(by_account)[:6] == ["squeue", "-h", "-r", "-t", "all", "--account=project_465002500"]
    assert argv_of(own)[:6] == ["squeue", "-h", "-r", "-t", "all", "--me"]
    assert argv_of(by_account)[-1] == argv_of(own)[-1] == argv_of(build_squeue([1]))[-1]  # the same fields
    with pytest.raises(ValidationError):
        build_squeue_account_jobs("p; rm -rf /")


def test_squeue_by_name() -> None:
    argv = argv_of(build_squeue_by_name("vcloud-stage1", user="digifarm"))
    assert "--name=vcloud-stage1" in argv and "--user=digifarm" in argv and "-t" in argv


def test_sacct_commands() -> None:
    argv = argv_of(build_sacct([1, 2]))
    assert argv[:4] == ["sacct", "--parsable2", "--noheader", "--delimiter=|"]
    assert argv[4] == "--format=" + ",".join(commands.SACCT_FIELDS)
    assert "--allocations" in argv and "--duplicates" in argv and argv[-1] == "--jobs=1,2"
    steps = argv_of(build_sacct([1], allocations_only=False, duplicates=False, since="now-7days"))
    assert "--allocations" not in steps and "--duplicates" not in steps and "--starttime=now-7days" in steps
    for needed in ("JobIDRaw", "State", "ExitCode", "Reason", "ElapsedRaw", "Start", "End", "Submit", "AllocTRES"):
        assert needed in commands.SACCT_FIELDS
    assert commands.SACCT_FIELDS[-1] == "Comment"


def test_sacct_by_name_always_has_a_start_time() -> None:
    argv = argv_of(build_sacct_by_name("vcloud-stage1", since="now-14days", user="vcloud"))
    assert "--starttime=now-14days" in argv and "--name=vcloud-stage1" in argv
    with pytest.raises(TypeError):
        build_sacct_by_name("vcloud-stage1")  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="since"):
        build_sacct_by_name("vcloud-stage1", since="last week")


def test_scontrol_and_scancel() -> None:
    assert argv_of(build_scontrol_show_job(42)) == ["scontrol", "show", "job", "-o", "42"]
    assert argv_of(build_scancel([42, 43])) == ["scancel", "42", "43"]
    assert argv_of(build_scancel([42], signal="SIGUSR1", batch_only=True)) == ["scancel", "--signal=USR1", "--batch", "42"]
    assert argv_of(build_scancel([42], signal=15, full=True)) == ["scancel", "--signal=15", "--full", "42"]
    with pytest.raises(ValidationError, match="batch_only"):
        build_scancel([42], batch_only=True, full=True)
    with pytest.raises(ValidationError, match="signal"):
        build_scancel([42], signal="USR1;reboot")


def test_sinfo_unavailable_nodes() -> None:
    argv = argv_of(build_sinfo_unavailable_nodes("small-g"))
    assert argv[:3] == ["sinfo", "-h", "-N"] and "--partition=small-g" in argv


def test_sshare_of_one_account_with_fixed_fields() -> None:
    assert argv_of(build_sshare_account("project_465002500")) == [
        "sshare", "--noheader", "--parsable2", "--accounts=project_465002500",
        "--format=Account,User,GrpTRESMins,GrpTRESRaw,TRESRunMins"]
    with pytest.raises(ValidationError, match="account"):
        build_sshare_account("project;scancel -u $USER")


# --- log and progress files, run in a real shell ----------------------------------------------------


def run_local(command: str) -> str:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def log_file(tmp_path: Path) -> Path:
    directory = tmp_path / "run 1" / "it's \"logs\""
    directory.mkdir(parents=True)
    path = directory / "vcloud_16082076.out"
    path.write_bytes("epoch 1 loss=0.5\nPSNR 34.0 dB ✓ température\n".encode())
    return path


def test_read_log_from_offsets(log_file: Path) -> None:
    data = log_file.read_bytes()
    first = parse_log_chunk(run_local(build_read_log(str(log_file), 0)), 0)
    assert first.text == data.decode() and first.new_offset == len(data) == first.file_size
    assert not first.has_more and not first.truncated and not first.missing

    with log_file.open("ab") as handle:
        handle.write(b"epoch 2 loss=0.25\n")
    second = parse_log_chunk(run_local(build_read_log(str(log_file), first.new_offset)), first.new_offset)
    assert second.text == "epoch 2 loss=0.25\n" and second.offset == first.new_offset

    nothing = parse_log_chunk(run_local(build_read_log(str(log_file), second.new_offset)), second.new_offset)
    assert nothing.text == "" and nothing.new_offset == second.new_offset


def test_read_log_never_splits_a_character(log_file: Path) -> None:
    data = log_file.read_bytes()
    check_mark = data.index("✓".encode())
    text, offset = "", 0
    while offset < len(data):
        # chunk size chosen so that a chunk ends inside the 3-byte check mark
        chunk = parse_log_chunk(run_local(build_read_log(str(log_file), offset, max_bytes=check_mark + 1)), offset)
        assert chunk.new_offset > offset
        text, offset = text + chunk.text, chunk.new_offset
    assert text == data.decode()


def test_read_log_after_truncation_and_missing(log_file: Path, tmp_path: Path) -> None:
    log_file.write_text("requeued run\n")
    chunk = parse_log_chunk(run_local(build_read_log(str(log_file), 500)), 500)
    assert chunk.truncated and chunk.offset == 0 and chunk.text == "requeued run\n"
    missing = parse_log_chunk(run_local(build_read_log(str(tmp_path / "no such.out"), 7)), 7)
    assert missing.missing and missing.new_offset == 7 and missing.text == ""


def test_read_log_rejects_bad_offsets() -> None:
    with pytest.raises(ValidationError, match="offset"):
        build_read_log("/tmp/x", -1)
    with pytest.raises(ValidationError, match="max_bytes"):
        build_read_log("/tmp/x", 0, max_bytes=0)


def test_read_progress(tmp_path: Path) -> None:
    path = tmp_path / "progress it's.json"
    path.write_text('{"epoch": 3}\n')
    assert parse_progress(run_local(build_read_progress(str(path)))) == '{"epoch": 3}\n'
    assert parse_progress(run_local(build_read_progress(str(tmp_path / "none.json")))) is None


# --- filename patterns ---------------------------------------------------------------------------------


def test_expand_filename_pattern() -> None:
    kwargs = {"job_id": "40", "job_name": "gc-throttled", "user": "vcloud"}
    assert expand_filename_pattern("/logs/%x_%j.out", **kwargs) == "/logs/gc-throttled_40.out"
    assert (
        expand_filename_pattern("/logs/%A_%3a-%u-%N.out", array_job_id="37", array_task_id="1", first_node="nid005001.lumi", **kwargs)
        == "/logs/37_001-vcloud-nid005001.out"
    )
    assert expand_filename_pattern("/logs/100%%_%8j.out", **kwargs) == "/logs/100%_00000040.out"
    assert expand_filename_pattern("/logs/%a.out", **kwargs) == "/logs/%a.out", "unknown stays as written"
    assert expand_filename_pattern("/logs/\\%j.out", **kwargs) == "/logs/%j.out"


# --- against the real cluster, over SSH ----------------------------------------------------------------

STATE_DIR = Path("/var/lib/vcloud-localcluster/ssh")


def ssh(command: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    argv = [
        "ssh", "-p", "2222", "-i", str(STATE_DIR / "id_ed25519"),
        "-o", f"UserKnownHostsFile={STATE_DIR / 'known_hosts'}", "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "vcloud@127.0.0.1", command,
    ]  # fmt: skip
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60)


def cluster_reachable() -> bool:
    if not (STATE_DIR / "id_ed25519").exists():
        return False
    try:
        return ssh("true").returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_commands_over_ssh_on_the_local_cluster(local_cluster) -> None:
    if not cluster_reachable():
        pytest.fail("the local Slurm cluster is up but not reachable over SSH", pytrace=False)
    command = build_sbatch_test_only(
        job_name="slurm-provider-test",
        output="/home/vcloud/it's a dir/%x_%j.out",
        partition="small-g",
        time_limit="0:05:00",
        comment=COMMENT,
        extra_options=["--gpus=1"],
    )
    answer = ssh(command, stdin="#!/bin/bash\necho 'never runs'\n")
    estimate = parse_sbatch_test_only(answer.stderr)
    assert estimate.partition == "small-g" and estimate.nodes

    unknown = ssh(build_squeue([999999999]))
    assert unknown.returncode == 1 and is_invalid_job_id_error(unknown.stderr)
    assert parse_squeue(unknown.stdout) == []
