"""sbatch: the submit command line, its quoting in a real shell, the job comment, and what sbatch answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_provider.cli.sbatch import (
    JobComment,
    SbatchRefused,
    build_sbatch_submit,
    build_sbatch_test_only,
    parse_job_comment,
    parse_sbatch_parsable,
    parse_sbatch_test_only,
    with_stdin_heredoc,
)
from slurm_provider.validation import ValidationError
from providers.slurm.tests.cli.captured_output import JOBS, raw
from providers.slurm.tests.cli.command_words import argv_of

COMMENT = JobComment(dag="vcloud_train", task="train_stage1", run="manual__2026-02-16T08:00:00+00:00", attempt=2, stage="1")


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


def test_sbatch_parsable_plain_and_with_cluster() -> None:
    assert parse_sbatch_parsable(raw("sbatch_completed.txt")).job_id == JOBS["COMPLETED_ID"]
    with_cluster = parse_sbatch_parsable(raw("sbatch_cluster.txt"))
    assert (with_cluster.job_id, with_cluster.cluster) == (JOBS["CLUSTER_ID"], "vcloud-local")
    warned = parse_sbatch_parsable("sbatch: warning: can't honor --ntasks-per-node\n12345\n")
    assert warned.job_id == "12345" and warned.cluster is None


def test_sbatch_refusals_carry_slurms_message() -> None:
    with pytest.raises(SbatchRefused) as caught:
        parse_sbatch_parsable("", raw("sbatch_bad_account.stderr.txt"))
    assert caught.value.message == "Batch job submission failed: Invalid account or account/partition combination specified"
    with pytest.raises(SbatchRefused, match="invalid partition specified: nosuch-g"):
        parse_sbatch_test_only(raw("sbatch_test_only_bad_partition.stderr.txt"))


def test_sbatch_test_only_estimate() -> None:
    estimate = parse_sbatch_test_only(raw("sbatch_test_only.stderr.txt"))
    assert estimate.partition == "small-g" and estimate.nodes == "vcnode1" and estimate.processors == 1
    assert estimate.start is not None and estimate.start.startswith("20")


def test_time_min_lets_slurm_shorten_the_limit_never_beyond_it() -> None:
    argv = argv_of(build_sbatch_submit(job_name="x", output="/tmp/x.out", time_limit="3-00:00:00", time_min="1-00:00:00"))
    assert argv[-2:] == ["--time=3-00:00:00", "--time-min=1-00:00:00"]
    assert "--time-min=0-00:30:00" in argv_of(build_sbatch_submit(job_name="x", output="/tmp/x.out", time_min="30"))
    with pytest.raises(ValidationError, match="time_min.*longer than the allowed maximum 0-01:00:00"):
        build_sbatch_submit(job_name="x", output="/tmp/x.out", time_limit="1:00:00", time_min="2:00:00")
    with pytest.raises(ValidationError, match="time_min"):
        build_sbatch_submit(job_name="x", output="/tmp/x.out", time_min="soon")


def test_nodes_left_out_and_a_later_begin_become_exclude_and_begin() -> None:
    argv = argv_of(build_sbatch_submit(job_name="x", output="/tmp/x.out", exclude=["nid005001", "nid005003"],
                                       begin_in=120))
    assert "--exclude=nid005001,nid005003" in argv and "--begin=now+120" in argv
    plain = argv_of(build_sbatch_submit(job_name="x", output="/tmp/x.out", exclude=[], begin_in=0))
    assert not [a for a in plain if a.startswith(("--exclude", "--begin"))]
    with pytest.raises(ValidationError, match="'nid\\[1-2\\]' is not a valid node name"):
        build_sbatch_submit(job_name="x", output="/tmp/x.out", exclude=["nid[1-2]"])
    with pytest.raises(ValidationError, match="begin_in"):
        build_sbatch_submit(job_name="x", output="/tmp/x.out", begin_in=-5)
