"""Which code directories a cleanup removes: the pure decision, the listing and the commands."""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from slurm_provider.cli.sbatch import JobComment
from slurm_provider.cli.squeue import SQUEUE_FIELDS
from slurm_provider.cli.squeue import parse_squeue
from support.local_shell import LocalShell, local_hook
from vcloud_pipeline.code.retention import (
    INCOMPLETE_GRACE_S,
    RUN_MARKER_EXPIRY_S,
    CodeDir,
    RetentionPlan,
    RunMarker,
    code_hash_of_comment,
    hashes_in_use,
    job_keeps_its_code,
    list_code_dirs_command,
    newest_complete,
    parse_code_dirs,
    plan_retention,
    mark_run,
    release_run,
    removal_command,
    remove_unused_code_dirs,
    touch_run,
)
from vcloud_pipeline.plan.layout import MANIFEST_NAME, RunPaths, run_key, run_paths
from vcloud_pipeline.plan.request import parse_request
from vcloud_pipeline.profile import ClusterProfile, load_profile
from vcloud_pipeline.dag.tasks import build_plan, clean_code_dirs

NOW = 1_800_000_000.0
A, B, C, D, E, F = (c * 64 for c in "abcdef")


def synced(code: str, age_s: float) -> CodeDir:
    return CodeDir(hash=code, synced_at=NOW - age_s, changed_at=NOW - age_s - 5)


def plan(dirs: list[CodeDir], *, in_use: set[str] = frozenset(), current: str = A, keep: int = 2) -> RetentionPlan:
    return plan_retention(dirs, in_use=in_use, current=current, keep=keep, now=NOW)


# --------------------------------------------------------------------------- the decision


def test_the_newest_few_stay_and_older_unused_ones_go() -> None:
    dirs = [synced(A, 10), synced(B, 100), synced(C, 200), synced(D, 300)]
    result = plan(dirs, keep=2)
    assert result.remove == (C, D)
    assert result.newest == (A, B)
    assert plan(dirs, keep=5).remove == ()


def test_a_directory_a_live_job_uses_stays_however_old() -> None:
    dirs = [synced(A, 10), synced(B, 100), synced(C, 10_000_000), synced(D, 300)]
    result = plan(dirs, in_use={C}, keep=1)
    assert result.remove == (B, D)
    assert result.in_use == (C,)
    assert "keeping code directory " + C in "\n".join(result.lines())


def test_the_current_code_stays_even_when_it_is_not_the_newest() -> None:
    # a run that reuses old code refreshes its manifest; even without that, it is never removed
    dirs = [synced(A, 5000), synced(B, 10), synced(C, 20)]
    result = plan(dirs, current=A, keep=1)
    assert result.remove == (C,)
    assert set(result.newest) == {A, B}


def test_the_code_of_an_unfinished_dag_run_stays_until_its_marker_expires() -> None:
    # Run 1 synced C and has not submitted its next stage: no job Slurm lists names C. Run 2's
    # marker is older than the expiry: its run vanished, its code D goes with it.
    one, two = run_key("vcloud_training", "manual__1"), run_key("vcloud_training", "manual__2")
    runs = [RunMarker(one, C, NOW - 3 * 86400), RunMarker(two, D, NOW - RUN_MARKER_EXPIRY_S - 1)]
    result = plan_retention([synced(A, 10), synced(B, 100), synced(C, 200), synced(D, 300)], in_use=set(),
                            current=A, keep=1, now=NOW, runs=runs)
    assert result.in_runs == (C,) and result.remove == (B, D)
    assert result.expired_runs == (runs[1],)
    lines = "\n".join(result.lines())
    assert f"keeping code directory {C}: an unfinished DAG run uses it" in lines
    assert f"forgetting DAG run {two}, untouched for 30 days (code {D})" in lines


def test_a_transfer_in_progress_stays_and_a_dead_one_goes() -> None:
    young = CodeDir(hash=E, synced_at=None, changed_at=NOW - 60)
    dead = CodeDir(hash=F, synced_at=None, changed_at=NOW - INCOMPLETE_GRACE_S - 1)
    result = plan([synced(A, 10), young, dead], keep=1)
    assert result.incomplete == (E,) and result.remove == (F,)
    # incomplete directories never count towards the newest
    assert plan([synced(A, 10), synced(B, 20), young], keep=2).newest == (A, B)


def test_an_interrupted_removal_is_finished() -> None:
    leftover = CodeDir(hash=B, synced_at=None, changed_at=NOW - 1, removing=True)
    result = plan([synced(A, 10), leftover], keep=1)
    assert result.leftovers == (B,) and result.remove == ()
    assert "finishing the removal of code directory " + B in result.lines()


def test_nothing_to_remove_on_a_fresh_cluster() -> None:
    assert plan([], keep=1) == RetentionPlan()
    assert plan([synced(A, 1)], keep=1) == RetentionPlan(newest=(A,))


def test_keep_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        plan([synced(A, 1)], keep=0)


def test_newest_complete_is_the_basis_of_a_new_transfer() -> None:
    dirs = [synced(A, 10), synced(B, 5), CodeDir(hash=C, synced_at=None, changed_at=NOW)]
    assert newest_complete(dirs, other_than=A) == B
    assert newest_complete(dirs, other_than=B) == A
    assert newest_complete([CodeDir(hash=C, synced_at=None, changed_at=NOW)], other_than=A) is None


# --------------------------------------------------------------------------- which jobs keep their code


@pytest.mark.parametrize(("state", "keeps"), [
    ("PENDING", True), ("RUNNING", True), ("REQUEUED", True), ("REQUEUE_HOLD", True), ("SUSPENDED", True),
    ("COMPLETING", True), ("CONFIGURING", True), ("SPECIAL_EXIT", True), ("STOPPED", True), ("PD", True),
    ("TIMEOUT", True), ("NODE_FAIL", True), ("PREEMPTED", True), ("BOOT_FAIL", True),  # may be resubmitted
    ("garbled", True),  # unreadable: keep
    ("COMPLETED", False), ("FAILED", False), ("CANCELLED by 1001", False), ("OUT_OF_MEMORY", False),
    ("DEADLINE", False),
])
def test_which_job_states_keep_their_code(state: str, keeps: bool) -> None:
    assert job_keeps_its_code(state) is keeps


def test_the_code_hash_comes_from_the_job_comment() -> None:
    operator_comment = JobComment(dag="d", task="stage1", run="r", attempt=1, code=B).to_json()
    assert code_hash_of_comment(operator_comment) == B
    assert code_hash_of_comment('{"code":"' + C + '"}') == C  # a job a person submitted by hand
    for foreign in (None, "", "hand-written", '{"code": "abc"}', '{"code": 7}', "[1]", "{not json"):
        assert code_hash_of_comment(foreign) is None
    assert code_hash_of_comment(JobComment(dag="d", task="t", run="r", attempt=1).to_json()) is None


def squeue_line(job_id: int, state: str, comment: str) -> str:
    """One line of build_squeue_account_jobs' output (the fields of SQUEUE_FIELDS, Comment last)."""
    values = {"JobID": str(job_id), "State": state, "RestartCnt": "0", "Name": "vcloud", "exit_code": "0:0",
              "Comment": comment}
    return "|".join(values.get(field, "") for field in SQUEUE_FIELDS)


def test_hashes_in_use_are_read_from_squeue() -> None:
    def tagged(code: str) -> str:
        return JobComment(dag="vcloud_training", task="stage0", run="r", attempt=1, code=code).to_json()

    out = "\n".join([
        squeue_line(11, "RUNNING", tagged(A)),
        squeue_line(12, "PENDING", tagged(B)),
        squeue_line(13, "SUSPENDED", tagged(C)),
        squeue_line(14, "COMPLETED", tagged(D)),
        squeue_line(15, "CANCELLED by 0", tagged(E)),
        squeue_line(16, "RUNNING", "someone else's job | with a separator"),
        squeue_line(17, "TIMEOUT", tagged(F)),
    ])
    assert hashes_in_use(parse_squeue(out)) == {A, B, C, F}


# --------------------------------------------------------------------------- listing and removing, with bash


def test_the_listing_reads_a_real_directory(tmp_path: Path) -> None:
    root = tmp_path / "code dir's"
    for code in (A, B):
        (root / code / "trainer").mkdir(parents=True)
    (root / A / MANIFEST_NAME).write_text("{}")
    (root / f".{C}.removing").mkdir()
    (root / "trainer").mkdir()  # the layout before code directories per hash: left alone
    (root / "notes.txt").write_text("")
    out = subprocess.run(["bash", "-c", list_code_dirs_command(root)], capture_output=True, text=True,
                         check=True).stdout
    listing = parse_code_dirs(out)
    by_hash = {d.hash: d for d in listing.dirs}
    assert set(by_hash) == {A, B, C}
    assert by_hash[A].complete and not by_hash[B].complete
    assert by_hash[C].removing and not by_hash[C].complete
    assert abs(by_hash[A].synced_at - (root / A / MANIFEST_NAME).stat().st_mtime) < 1
    assert abs(listing.now - by_hash[B].changed_at) < 60


def test_the_listing_reads_the_run_markers(tmp_path: Path) -> None:
    root = tmp_path / "code"
    (root / A).mkdir(parents=True)
    (root / A / MANIFEST_NAME).write_text("{}")
    (root / ".runs").mkdir()
    key = run_key("vcloud_training", "scheduled__2026-03-01T00:00:00+00:00")
    (root / ".runs" / f"{key}-{A}").write_text("DAG vcloud_training ...\n")
    os.utime(root / ".runs" / f"{key}-{A}", (NOW - 50, NOW - 50))
    (root / ".runs" / f".{key}-{B}.tmp").write_text("")  # a marker being written: not a marker yet
    (root / ".runs" / "notes.txt").write_text("")
    out = subprocess.run(["bash", "-c", list_code_dirs_command(root)], capture_output=True, text=True,
                         check=True).stdout
    listing = parse_code_dirs(out)
    assert [d.hash for d in listing.dirs] == [A]  # .runs is no code directory
    assert listing.runs == [RunMarker(key, A, NOW - 50)]


def test_a_run_marks_refreshes_and_releases_its_code(tmp_path: Path) -> None:
    paths = run_paths(load_profile("local", overrides={"paths.base": str(tmp_path / "base dir")}), "r")
    shell = local_hook()
    mine, other = run_key("d", "manual__mine"), run_key("d", "manual__other")
    mark_run(shell, paths, other, B, "DAG d, run manual__other")
    mark_run(shell, paths, mine, A, "DAG d, run manual__mine, run name 'r'")
    markers = Path(paths.run_markers_dir)
    assert sorted(p.name for p in markers.iterdir()) == sorted([f"{mine}-{A}", f"{other}-{B}"])
    assert (markers / f"{mine}-{A}").read_text() == "DAG d, run manual__mine, run name 'r'\n"
    # The run synced again with other code (its whole run was cleared): one marker, for the new code.
    mark_run(shell, paths, mine, C, "DAG d, run manual__mine")
    assert sorted(p.name for p in markers.iterdir()) == sorted([f"{mine}-{C}", f"{other}-{B}"])
    os.utime(markers / f"{mine}-{C}", (1000, 1000))  # touched long ago
    touch_run(shell, paths, mine, C)
    assert (markers / f"{mine}-{C}").stat().st_mtime > 10**9
    release_run(shell, paths, mine)
    assert [p.name for p in markers.iterdir()] == [f"{other}-{B}"]
    release_run(shell, paths, mine)  # twice is fine: the summary of a cleared run runs again
    # A cleared task of an ended run submits again: its marker is back for as long as the run lives.
    touch_run(shell, paths, mine, C)
    assert (markers / f"{mine}-{C}").exists()
    with pytest.raises(ValueError, match="run key"):
        touch_run(shell, paths, "manual__mine", C)


def test_the_listing_of_a_missing_root_is_empty(tmp_path: Path) -> None:
    out = subprocess.run(["bash", "-c", list_code_dirs_command(tmp_path / "none")], capture_output=True, text=True,
                         check=True).stdout
    assert parse_code_dirs(out).dirs == []
    with pytest.raises(ValueError, match="clock"):
        parse_code_dirs("")


def test_removal_renames_first_and_touches_nothing_else(tmp_path: Path) -> None:
    base = tmp_path / "base with space"
    paths = run_paths(load_profile("local", overrides={"paths.base": str(base)}), "r")
    for code in (A, B, C):
        (Path(paths.code(code).dir) / "trainer").mkdir(parents=True)
    Path(paths.code_being_removed(D)).mkdir()
    gone, kept = RunMarker(run_key("d", "r1"), B, NOW), RunMarker(run_key("d", "r2"), A, NOW)
    Path(paths.run_markers_dir).mkdir()
    for marker in (gone, kept):
        Path(paths.run_marker(marker.key, marker.hash)).write_text("")
    command = removal_command(paths, RetentionPlan(remove=(B, C), newest=(A,), leftovers=(D,),
                                                   expired_runs=(gone,)))
    assert command is not None and command.index("mv -T -- ") < command.index("rm -rf")
    subprocess.run(["bash", "-c", command], check=True)
    assert sorted(p.name for p in Path(paths.code_root).iterdir()) == [".runs", A]
    assert [p.name for p in Path(paths.run_markers_dir).iterdir()] == [kept.name]
    assert removal_command(paths, RetentionPlan(newest=(A,))) is None


# --------------------------------------------------------------------------- the whole cleanup, in a local shell


def cleanup_setup(tmp_path: Path, squeue_body: str) -> tuple[LocalShell, ClusterProfile, RunPaths]:
    """Code directories A (oldest), B, C (newest) with their manifests, and a stand-in squeue."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(f"#!/bin/bash\n{squeue_body}\n")
    (bin_dir / "squeue").chmod(0o755)
    profile = load_profile("local", overrides={"paths.base": str(tmp_path / "base dir"), "paths.code_keep": 1})
    paths = run_paths(profile, "r")
    for age, code in ((300, A), (200, B), (100, C)):
        code_paths = paths.code(code)
        Path(code_paths.pythonpath_dir).mkdir(parents=True)
        Path(code_paths.manifest).write_text("{}")
        os.utime(code_paths.manifest, (NOW - age, NOW - age))
    return LocalShell(path_first=bin_dir), profile, paths


def hook_of(shell: LocalShell) -> Any:
    return local_hook(shell)


def remaining(paths: RunPaths) -> set[str]:
    return {p.name for p in Path(paths.code_root).iterdir()}


def test_the_cleanup_lists_reads_the_queue_and_removes_in_three_commands(tmp_path: Path) -> None:
    running_a = squeue_line(7, "RUNNING", JobComment(dag="d", task="stage0", run="r", attempt=1, code=A).to_json())
    shell, profile, paths = cleanup_setup(tmp_path, f"echo {shlex.quote(running_a)}")
    plan = remove_unused_code_dirs(profile, paths, hook_of(shell), current=C)
    assert (plan.remove, plan.in_use, plan.newest) == ((B,), (A,), (C,))
    assert remaining(paths) == {A, C}
    assert len(shell.commands) == 3 and "squeue" in shell.commands[1] and "--account=vcloud_local" in shell.commands[1]


def test_the_preflight_proofs_of_a_removed_code_go_with_it_in_the_same_command(tmp_path: Path) -> None:
    running_a = squeue_line(7, "RUNNING", JobComment(dag="d", task="stage0", run="r", attempt=1, code=A).to_json())
    shell, profile, paths = cleanup_setup(tmp_path, f"echo {shlex.quote(running_a)}")
    for code in (A, B):
        proof = Path(paths.preflight_proof(code, "e" * 64))
        proof.parent.mkdir(parents=True)
        proof.write_text("{}")
    plan = remove_unused_code_dirs(profile, paths, hook_of(shell), current=C)
    assert plan.remove == (B,)
    assert not Path(paths.preflight_proofs(B)).exists()
    assert Path(paths.preflight_proof(A, "e" * 64)).read_text() == "{}"  # A's code stays, and what proved it
    assert remaining(paths) == {A, C, ".preflight"} and len(shell.commands) == 3


def test_the_cleanup_keeps_what_an_unfinished_run_recorded(tmp_path: Path) -> None:
    shell, profile, paths = cleanup_setup(tmp_path, "true")  # nothing in the queue
    mark_run(hook_of(shell), paths, run_key("vcloud_training", "manual__long"), A, "a run between two stages")
    plan = remove_unused_code_dirs(profile, paths, hook_of(shell), current=C)
    assert (plan.remove, plan.in_runs, plan.newest) == ((B,), (A,), (C,))
    assert remaining(paths) == {A, C, ".runs"}


def test_nothing_is_removed_when_the_queue_cannot_be_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    shell, _, paths = cleanup_setup(tmp_path, "echo 'slurm_load_jobs error: Socket timed out' >&2; exit 1")
    monkeypatch.setenv("VCLOUD_PROFILE_OVERRIDES", json.dumps(
        {"local": {"paths.base": str(tmp_path / "base dir"), "paths.code_keep": 1}}))
    ctx = build_plan(parse_request({"profile": "local"}))
    with caplog.at_level(logging.WARNING):
        assert clean_code_dirs(ctx, hook_of(shell), C) is None  # the sync itself goes on
    assert "code directories in" in caplog.text and "Socket timed out" in caplog.text
    assert remaining(paths) == {A, B, C}
