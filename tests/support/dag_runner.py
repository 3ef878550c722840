"""One Airflow deployment's DAG runs on request, in one long-lived process: ``python -m tests.support.dag_runner DAG_ID``.

``airflow dags test`` pays for importing Airflow, parsing the DAG and starting its in-process
execution API on every run (about half a minute on a busy two-core host); a test that races
deployments many times over pays that once per deployment here. The process parses the DAG, says
``{"ready": true}`` on stdout, then reads one request per line on stdin, ``{"conf": {...},
"log": PATH}``, runs ``dag.test(run_conf=conf)`` as ``airflow dags test`` does, with everything the
run prints going to ``PATH``, and answers ``{"run_id": ..., "state": ...}``. What it prints between
runs goes to stderr. It ends when stdin closes, and with the test process that started it (a killed
pytest worker leaves no DAG run going on).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, TextIO


def _run(dag: Any, conf: dict[str, Any], log_path: str) -> dict[str, Any]:
    """One DAG run with file descriptors 1 and 2 on ``log_path``, restored afterwards."""
    from airflow.sdk import timezone

    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            dag_run = dag.test(logical_date=timezone.utcnow(), run_conf=conf)
            answer = {"run_id": dag_run.run_id, "state": str(dag_run.state)}
        except Exception as exc:  # noqa: BLE001 - the caller reads the log; the answer says it raised
            import traceback

            traceback.print_exc()
            answer = {"run_id": None, "state": f"raised {type(exc).__name__}: {exc}"}
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
    return answer


def _end_with_parent() -> None:
    """Linux's parent-death signal: SIGTERM when the process that started this one ends, even mid-run."""
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() == 1:  # the parent ended before the signal was asked for
        sys.exit("dag_runner: the process that started it has ended")


def main(dag_id: str, requests: TextIO, answers: TextIO) -> None:
    from airflow.utils.cli import get_bagged_dag

    dag = get_bagged_dag(bundle_names=None, dag_id=dag_id)
    answers.write(json.dumps({"ready": True}) + "\n")
    answers.flush()
    for line in requests:
        if not line.strip():
            continue
        request = json.loads(line)
        answers.write(json.dumps(_run(dag, request["conf"], request["log"])) + "\n")
        answers.flush()


if __name__ == "__main__":
    # Answers go through a copy of the original stdout; whatever else is printed goes to stderr
    # (between runs) or to the run's log (during one).
    _end_with_parent()
    answer_channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    main(sys.argv[1], sys.stdin, answer_channel)
