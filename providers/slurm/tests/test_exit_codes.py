"""Plain sentences for a job's exit code and signal."""

from __future__ import annotations

from slurm_provider.exit_codes import explain_exit


def test_success_and_unknown_codes_say_nothing() -> None:
    assert explain_exit(0, 0) is None
    assert explain_exit(None, None) is None
    assert explain_exit(3, 0) is None


def test_a_signal_that_killed_the_script_is_named_with_its_usual_cause() -> None:
    assert explain_exit(0, 9) == ("The batch script was killed by SIGKILL (often the kernel's out-of-memory "
                                  "killer, or Slurm ending the job after its time limit or a cancel).")
    assert "SIGTERM" in explain_exit(0, 15) and "preemption" in explain_exit(0, 15)


def test_shell_conventions_and_death_of_a_child_by_signal() -> None:
    assert "not found" in explain_exit(127, 0)
    assert explain_exit(137, 0) == ("Exit code 137: a process of the job was killed by SIGKILL (often the "
                                    "kernel's out-of-memory killer, or Slurm ending the job after its time "
                                    "limit or a cancel).")
    assert "SIGUSR2" in explain_exit(140, 0)


def test_the_jobs_own_meanings_come_first() -> None:
    meanings = {86: "the code on the cluster changed.", 127: "our launcher is missing."}
    assert explain_exit(86, 0, meanings) == "Exit code 86: the code on the cluster changed."
    assert explain_exit(127, 0, meanings) == "Exit code 127: our launcher is missing."
    assert explain_exit(86, 9, meanings).startswith("The batch script was killed by SIGKILL")


def test_a_failure_excerpt_keeps_the_whole_last_traceback() -> None:
    from slurm_provider.job_task.ending import log_excerpt

    frames = [f'  File "/code/mod{i}.py", line {i}, in f{i}' for i in range(40)]
    log = "\n".join(["starting", "Traceback (most recent call last):", "  old one", "KeyError: 1", "retrying",
                     "Traceback (most recent call last):", *frames, "ValueError: boom", "exit 1"])
    excerpt = log_excerpt(log, lines=25, traceback_lines=80).splitlines()
    assert excerpt[0] == "Traceback (most recent call last):" and excerpt[-2:] == ["ValueError: boom", "exit 1"]
    assert "KeyError: 1" not in excerpt and len(excerpt) == 43
    plain = "\n".join(f"line {i}" for i in range(100))
    assert log_excerpt(plain, lines=25).splitlines() == [f"line {i}" for i in range(75, 100)]
    capped = log_excerpt(log, lines=25, traceback_lines=10).splitlines()
    assert len(capped) == 10 and capped[-1] == "exit 1"
