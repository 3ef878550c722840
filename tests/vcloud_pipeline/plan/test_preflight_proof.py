"""A passed preflight check answers for later runs that ask exactly the same question, and for no other."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from vcloud_pipeline.plan.labels import JobLabel
from vcloud_pipeline.plan.preflight_proof import PreflightProof, decide_preflight, proof_key
from vcloud_pipeline.plan.run_plan import RunPlan
from vcloud_pipeline.plan.stages import Action
from vcloud_pipeline.provision.environment import JobEnvironment
from vcloud_pipeline.provision.requirements import runtime_requirements
from vcloud_pipeline.dag.tasks import plan_run

CODE = "a" * 64
OTHER_CODE = "b" * 64
IDENTITY = "build " + "c" * 64
NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.timezone.utc)


def _plan(**params: Any) -> RunPlan:
    return RunPlan.from_xcom(plan_run({"profile": "local", "config": "tiny", "run_name": "one", **params}))


def _environment(plan: RunPlan, identity: str | None = IDENTITY) -> JobEnvironment:
    return JobEnvironment.of(plan.profile, runtime_requirements(), identity)


def _key(plan: RunPlan, code: str = CODE, identity: str | None = IDENTITY) -> str | None:
    return plan.preflight_key(code, _environment(plan, identity))


def test_the_key_is_the_same_for_every_run_name_and_changes_with_what_the_check_depends_on() -> None:
    one = _plan()
    key = _key(one)
    assert key is not None and len(key) == 64
    assert _key(_plan(run_name="another", stages=[1], max_epochs=3)) == key  # the run and its stages drop out
    assert _key(one, code=OTHER_CODE) != key
    assert _key(one, identity="build " + "d" * 64) != key  # the image was rebuilt
    assert _key(one, identity="size 1 mtime 2") != key
    # The image's identity unknown: no earlier check can answer for it.
    assert _key(one, identity=None) is None


def test_the_key_changes_with_the_partition_the_resources_and_the_software() -> None:
    lumi = RunPlan.from_xcom(plan_run({"profile": "lumi", "config": "full", "stages": [1], "run_name": "a"}))
    key = _key(lumi)
    assert key is not None and key != _key(_plan())
    other_env = lumi.model_copy(update={"profile": lumi.profile.model_copy(update={
        "software": lumi.profile.software.model_copy(update={"env": {**lumi.profile.software.env, "X": "1"}})})})
    assert _key(other_env) != key
    preflight = lumi.jobs[JobLabel.PREFLIGHT]
    moved = lumi.model_copy(update={"jobs": {**lumi.jobs, JobLabel.PREFLIGHT: preflight.model_copy(update={
        "spec": dataclasses.replace(preflight.spec, partition="small-g")})}})
    assert _key(moved) != key


def test_a_profile_without_a_container_is_keyed_by_its_scripts_alone() -> None:
    assert proof_key("outer", "inner", None, has_container=False) is not None
    assert proof_key("outer", "inner", None, has_container=True) is None
    assert proof_key("outer", "inner", "build 1", has_container=True) != proof_key("outer", "inner", "build 2",
                                                                                   has_container=True)
    # The parts are delimited: moving text between them is another key.
    assert proof_key("ab", "c", "x", has_container=True) != proof_key("a", "bc", "x", has_container=True)


def _proof(key: str = "k" * 64, when: dt.datetime = NOW - dt.timedelta(minutes=30)) -> str:
    return PreflightProof(key=key, job_id="412", code_hash=CODE, environment="image /i (build 1)",
                          partition="dev-g", proven_at=when.isoformat(timespec="seconds"), run="first").to_json()


@pytest.mark.parametrize(("key", "text", "reuse", "action", "said"), [
    ("k" * 64, _proof(), 24, Action.SKIP, "job 412 (run first, 30 min ago) already passed the import check of code "
                                          "aaaaaaaaaaaa with image /i (build 1) on partition dev-g"),
    ("k" * 64, None, 24, Action.SUBMIT, "no passed check of this code, environment and job shape yet"),
    ("j" * 64, _proof(), 24, Action.SUBMIT, "no passed check"),
    ("k" * 64, _proof(when=NOW - dt.timedelta(hours=25)), 24, Action.SUBMIT,
     "(job 412, 2026-11-28T11:00:00+00:00) is 25.0 h old, more than jobs.preflight_reuse_hours 24: checking again"),
    ("k" * 64, _proof(when=NOW + dt.timedelta(hours=1)), 24, Action.SUBMIT, "is -1.0 h old"),
    ("k" * 64, _proof(), 0, Action.SUBMIT, "checked on every run (jobs.preflight_reuse_hours 0)"),
    (None, _proof(), 24, Action.SUBMIT, "the image's identity was not read at sync"),
    ("k" * 64, '{"key": "' + "k" * 64 + '"}', 24, Action.SUBMIT, "no passed check"),
    ("k" * 64, "not json", 24, Action.SUBMIT, "no passed check"),
    ("k" * 64, _proof().replace("2026-11-29T11:30:00+00:00", "yesterday"), 24, Action.SUBMIT, "no passed check"),
], ids=["fresh-proof", "no-proof", "other-question", "stale", "from-the-future", "reuse-off", "no-key",
        "partial-proof", "not-json", "unreadable-time"])
def test_the_decision_skips_only_a_fresh_proof_of_the_same_question(key: str | None, text: str | None, reuse: int,
                                                                     action: Action, said: str) -> None:
    decision = decide_preflight(key, text, NOW, reuse)
    assert decision.action is action
    assert said in decision.reason, decision.reason
    assert not decision.restart


def test_a_proof_reads_back_what_was_written() -> None:
    text = _proof()
    proof = PreflightProof.parse(text)
    assert proof is not None and proof.to_json() == text
    assert proof.proven == NOW - dt.timedelta(minutes=30)
    assert PreflightProof.parse("") is None and PreflightProof.parse("[1]") is None
