"""The preflight import check, proven once per code, environment and job shape, not once per trigger.

The preflight job answers one question before a run spends GPU-hours: do this code, this image (and
requirement set) and this software set-up import, and see their GPUs, on a node of the partition the
check runs on? The answer depends on nothing of the run, so a run that asks the same question within
``jobs.preflight_reuse_hours`` of a passed check does not queue another job for it (on a busy site a
debug-partition job can wait longer than the check runs).

The question is named by its **key**: the SHA-256 of the preflight job's outer and inner script as a
neutral run would submit them (:data:`NEUTRAL_RUN`, so the run name and the Slurm job name drop out),
and of the image's identity as the login node reported it at sync. Everything the check depends on is
in those scripts by construction (code hash, requirement set, container and its arguments, Python,
modules, environment, partition, resources, the check's own source): a change of any of them is
another key and runs the check again. A run whose image identity could not be read gets no key and
always runs the check.

A passed check leaves a :class:`PreflightProof` under ``<paths.code>/.preflight/<key>.json`` (written
whole, by rename); :func:`decide_preflight` reads it before the next submit.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from vcloud_pipeline.plan.stages import Action, Decision

NEUTRAL_RUN = "preflight-proof"
"""The run name (and Slurm job name) the key's scripts are rendered with: any run asks the same question."""



@dataclass(frozen=True)
class PreflightProof:
    """What a passed preflight check proved, and where and when."""

    key: str
    job_id: str
    code_hash: str
    environment: str
    """The image (and its identity) or ``no container``, as the sync described it."""
    partition: str
    proven_at: str
    """ISO 8601 UTC time the check's job ended."""
    run: str
    """The run name whose trigger ran the check (for the reader of the skip reason)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True) + "\n"

    @classmethod
    def parse(cls, text: str | None) -> PreflightProof | None:
        """The proof in ``text``; None for no file or one that is not a whole proof (never trusted)."""
        if not text:
            return None
        try:
            raw: Any = json.loads(text)
            proof = cls(**{name: str(raw[name]) for name in cls.__dataclass_fields__})
            dt.datetime.fromisoformat(proof.proven_at)
        except (ValueError, TypeError, KeyError):
            return None
        return proof

    @property
    def proven(self) -> dt.datetime:
        when = dt.datetime.fromisoformat(self.proven_at)
        return when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)


def proof_key(outer: str, inner: str, image_identity: str | None, has_container: bool) -> str | None:
    """The key of the check the neutral run's ``outer`` and ``inner`` scripts make; None (check every
    time) when the profile runs a container whose identity the login node could not tell."""
    if has_container and not image_identity:
        return None
    digest = hashlib.sha256()
    for part in (outer, inner, image_identity or "no container"):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def decide_preflight(key: str | None, proof_text: str | None, now: dt.datetime, reuse_hours: float) -> Decision:
    """Submit the preflight check, or skip it because a passed one answered the same question
    (``key``) less than ``reuse_hours`` ago. The reason says which job proved it, when, and how to
    ask again."""
    if reuse_hours <= 0:
        return Decision(Action.SUBMIT, "checked on every run (jobs.preflight_reuse_hours 0)")
    if key is None:
        return Decision(Action.SUBMIT, "the image's identity was not read at sync, so no earlier "
                                       "check can be known to answer for it: checking")
    proof = PreflightProof.parse(proof_text)
    if proof is None or proof.key != key:
        return Decision(Action.SUBMIT, "no passed check of this code, environment and job shape yet: "
                                       "checking")
    age_hours = (now - proof.proven).total_seconds() / 3600
    if age_hours > reuse_hours or age_hours < -0.25:
        return Decision(Action.SUBMIT, f"the last passed check of this code, environment and job shape "
                                       f"(job {proof.job_id}, {proof.proven_at}) is {age_hours:.1f} h old, more than "
                                       f"jobs.preflight_reuse_hours {reuse_hours:g}: checking again")
    return Decision(Action.SKIP, f"job {proof.job_id} (run {proof.run}, {_ago(age_hours)}) already "
                                 f"passed the import check of code {proof.code_hash[:12]} with {proof.environment} "
                                 f"on partition {proof.partition}, and nothing the check depends on changed since; "
                                 f"not checked again (within jobs.preflight_reuse_hours {reuse_hours:g}; 0 checks "
                                 f"on every run)")


def _ago(hours: float) -> str:
    minutes = max(0, round(hours * 60))
    return f"{minutes} min ago" if minutes < 120 else f"{hours:.1f} h ago"
