"""The watch's events round-trip through the JSON-safe dict Airflow carries, and a bad one says what is wrong."""

from __future__ import annotations

import json

import pytest

from slurm_provider.job_status import JobStatus
from slurm_provider.state_vocabulary import SlurmState
from slurm_provider.watch.events import ERROR, FINISHED, REACHABLE, LoginEvent, WatchEvent

ENDED = JobStatus("7", SlurmState.COMPLETED, exit_code=0, node_list="n1", restarts=1, name="train")


@pytest.mark.parametrize("event", [
    WatchEvent(FINISHED, "c", "7", "COMPLETED on n1", ENDED, "/l/7.out", 120, "/l/7.err", 4,
               {"history": [{"job_id": "7"}]}, "end_record", ({"path": "/m", "fold": "a.b", "offset": 9},)),
    WatchEvent(ERROR, "c", "7", "login node of c unreachable since 08:00"),
])
def test_a_watch_event_round_trips_through_json(event: WatchEvent) -> None:
    assert WatchEvent.from_json(json.loads(json.dumps(event.to_json()))) == event


def test_a_login_event_round_trips_through_json() -> None:
    event = LoginEvent(REACHABLE, "c", 1_800_000_000.5, 4, "reachable again after 2 min", {"failures_while_reachable": 1})
    assert LoginEvent.from_json(json.loads(json.dumps(event.to_json()))) == event


@pytest.mark.parametrize("payload, words", [
    (None, "trigger event is not a mapping"),
    ({"kind": FINISHED, "job_id": "7", "message": "m"}, "trigger event lacks ['status', 'carry']"),
    ({"kind": "done", "job_id": "7", "status": None, "message": "m", "carry": {}}, "unknown watch event kind 'done'"),
    ({"kind": FINISHED, "job_id": "7", "status": None, "message": "m", "carry": {}}, "carries no job status"),
    ({"kind": FINISHED, "job_id": "7", "status": {"job_id": "7", "state": "DONE"}, "message": "m", "carry": {}},
     "unknown state 'DONE'"),
])
def test_a_bad_watch_event_says_what_is_wrong(payload: object, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        WatchEvent.from_json(payload)  # type: ignore[arg-type]


def test_a_bad_login_event_says_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="login wait event lacks"):
        LoginEvent.from_json({"kind": REACHABLE})
    with pytest.raises(ValueError, match="unknown login wait event kind 'finished'"):
        LoginEvent.from_json({"kind": FINISHED, "since": 1.0, "message": "m"})
