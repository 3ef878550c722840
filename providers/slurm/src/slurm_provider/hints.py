"""Known failure signatures -> a hint that says what happened and what to do.

The table is data: each rule is a regular expression over a job's log tail (or sbatch's
stderr) or a final Slurm state. The provider's own rules are Slurm's signatures (out of memory,
time limit, a refused account, partition or GPU request); a project or site adds its own with
:func:`register_hints` (its rules, and its advice for the provider's signatures), or through the
``slurm_provider.hints`` entry point group (each entry point a function that calls it), loaded
on the first match. The operator appends matching hints to its failure message, and the UI
shows them to people, so the text is plain words with the exact setting to change.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points

from slurm_provider.state_vocabulary import SlurmState, parse_state

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "slurm_provider.hints"
"""Entry points of installed distributions that register hints (``register_hints``) when called."""

MEMORY_KILL = re.compile(r"oom[-_]kill event|Exceeded job memory limit|Out of memory: Killed process")
"""What Slurm (its cgroup's OOM events, or its own memory enforcement) and the kernel write to a job's
logs when they kill it for its memory: the memory hint's signature, and what tells such a kill apart
from one from outside the job (:func:`slurm_provider.resubmission.killed_from_outside`)."""


@dataclass(frozen=True)
class HintRule:
    key: str
    title: str
    hint: str
    source: str
    """Where the lesson comes from (for people who want the full story)."""
    pattern: re.Pattern[str] | None = None
    states: frozenset[SlurmState] = frozenset()


@dataclass(frozen=True)
class Hint:
    key: str
    title: str
    hint: str
    source: str
    evidence: str
    """The log line (or the state) that matched."""

    def __str__(self) -> str:
        return f"{self.title}: {self.hint}"


LOG_RULES: tuple[HintRule, ...] = (
    HintRule(
        key="too_many_processors",
        title="More CPUs requested than the node has",
        hint=(
            "A step asked for more CPUs than the job's nodes have (GPU nodes often have fewer cores than "
            "CPU nodes). Lower --ntasks-per-node x --cpus-per-task to fit the node ('sinfo -o \"%n %c\"')."
        ),
        source="srun",
        pattern=re.compile(r"More processors requested than permitted"),
    ),
    HintRule(
        key="host_out_of_memory",
        title="Host memory (RAM) exhausted",
        hint=(
            "The job used more RAM than it requested. Raise --mem (or --mem-per-gpu / --mem-per-cpu), or "
            "make the job use less (fewer data loader processes, smaller batches in memory)."
        ),
        source="Slurm OUT_OF_MEMORY state",
        pattern=MEMORY_KILL,
        states=frozenset({SlurmState.OUT_OF_MEMORY}),
    ),
    HintRule(
        key="time_limit",
        title="Time limit reached",
        hint=(
            "Slurm stopped the job at its --time. Raise --time up to the partition maximum "
            "('sinfo -o \"%P %l\"'), or let the job checkpoint and resubmit it (progress_path and "
            "resubmit_budgets) so it resumes where it stopped."
        ),
        source="Slurm TIMEOUT state",
        pattern=re.compile(r"DUE TO TIME LIMIT"),
        states=frozenset({SlurmState.TIMEOUT}),
    ),
)
"""Slurm's own signatures in a job's logs or final state."""

SUBMIT_RULES: tuple[HintRule, ...] = (
    HintRule(
        key="invalid_account",
        title="Account not valid for this user or partition",
        hint=(
            "Check --account and that your user is a member of it on this partition "
            "('sacctmgr show assoc user=$USER')."
        ),
        source="sbatch",
        pattern=re.compile(r"Invalid account or account/partition combination"),
    ),
    HintRule(
        key="invalid_partition",
        title="Unknown partition",
        hint="Use one of the cluster's partitions ('sinfo -s').",
        source="sbatch",
        pattern=re.compile(r"invalid partition specified|Invalid partition name specified"),
    ),
    HintRule(
        key="time_limit_invalid",
        title="Time limit above the partition maximum",
        hint="Lower --time to at most the partition's limit ('sinfo -o \"%P %l\"').",
        source="sbatch",
        pattern=re.compile(r"Requested time limit is invalid"),
    ),
    HintRule(
        key="qos_policy",
        title="Job violates accounting/QOS policy",
        hint=(
            "The request breaks a limit of the account or QOS (size, time, number of jobs), or the project's "
            "GPU-hour budget is used up. Check 'sshare'/'sacctmgr show assoc' and the project's "
            "remaining budget."
        ),
        source="sbatch",
        pattern=re.compile(r"Job violates accounting/QOS policy"),
    ),
    HintRule(
        key="node_configuration",
        title="No node can satisfy the request",
        hint=(
            "The combination of GPUs, CPUs per task and memory does not exist on any node of the partition "
            "(GPU nodes have fewer cores). Request fewer CPUs or less memory per GPU."
        ),
        source="sbatch",
        pattern=re.compile(r"Requested node configuration is not available"),
    ),
    HintRule(
        key="invalid_gres",
        title="Invalid GPU (GRES) request",
        hint="Check --gpus/--gres against what the partition's nodes have ('sinfo -o \"%P %G\"').",
        source="sbatch",
        pattern=re.compile(r"Invalid generic resource \(gres\) specification|Invalid GRES specification"),
    ),
    HintRule(
        key="not_a_batch_script",
        title="The job script has no #! line",
        hint="The first line of the script must be an interpreter line such as #!/bin/bash.",
        source="sbatch",
        pattern=re.compile(r"This does not look like a batch script"),
    ),
)
"""Signatures of sbatch refusing a job (its stderr)."""


class _Registry:
    """Rules and advice that projects and sites added, in the order they were registered."""

    def __init__(self) -> None:
        self.log_rules: dict[str, HintRule] = {}
        self.submit_rules: dict[str, HintRule] = {}
        self.advice: dict[str, str] = {}
        self.entry_points_loaded = False
        self.lock = threading.Lock()


_REGISTRY = _Registry()


def register_hints(*, log_rules: Iterable[HintRule] = (), submit_rules: Iterable[HintRule] = (),
                   advice: Mapping[str, str] | None = None) -> None:
    """Add a project's or site's hints for every later match in this process.

    ``log_rules`` and ``submit_rules`` are matched before the provider's own (a project's
    signature is the more specific one); registering a key again replaces that rule, so calling
    this twice is harmless. ``advice`` replaces the text of any rule by its key (the provider's
    own included), keeping the rule's signature; an operator's ``hint_overrides`` still wins.
    """
    with _REGISTRY.lock:
        for rule in log_rules:
            _REGISTRY.log_rules[rule.key] = rule
        for rule in submit_rules:
            _REGISTRY.submit_rules[rule.key] = rule
        _REGISTRY.advice.update(advice or {})


def _load_entry_points() -> None:
    if _REGISTRY.entry_points_loaded:
        return
    _REGISTRY.entry_points_loaded = True
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry.load()()
        except Exception:  # a broken registration must not hide the failure it would explain
            log.exception("cannot load Slurm hints from entry point %s = %s", entry.name, entry.value)


def log_rules() -> tuple[HintRule, ...]:
    """Every log rule in match order: the registered ones, then the provider's."""
    _load_entry_points()
    registered = tuple(_REGISTRY.log_rules.values())
    keys = {rule.key for rule in registered}
    return registered + tuple(rule for rule in LOG_RULES if rule.key not in keys)


def submit_rules() -> tuple[HintRule, ...]:
    """Every sbatch rule in match order: the registered ones, then the provider's."""
    _load_entry_points()
    registered = tuple(_REGISTRY.submit_rules.values())
    keys = {rule.key for rule in registered}
    return registered + tuple(rule for rule in SUBMIT_RULES if rule.key not in keys)


def _match(rules: Iterable[HintRule], text: str, state: SlurmState | None,
           overrides: Mapping[str, str] | None = None) -> list[Hint]:
    hints: list[Hint] = []
    lines = text.splitlines()
    for rule in rules:
        advice = (overrides or {}).get(rule.key) or _REGISTRY.advice.get(rule.key) or rule.hint
        if state is not None and state in rule.states:
            hints.append(Hint(rule.key, rule.title, advice, rule.source, f"job state {state.value}"))
            continue
        if rule.pattern is None:
            continue
        for line in reversed(lines):  # the newest evidence is the most relevant
            if rule.pattern.search(line):
                hints.append(Hint(rule.key, rule.title, advice, rule.source, line.strip()[:300]))
                break
    return hints


def find_hints(log_text: str | None, state: SlurmState | str | None = None,
               overrides: Mapping[str, str] | None = None) -> list[Hint]:
    """Hints for a job's log tail and/or its final state, in :func:`log_rules` order, each at most once.

    ``overrides`` replaces the advice of a rule by its key with a site's own (e.g. a cluster's
    advice for ``host_out_of_memory``); the signature stays the table's.
    """
    parsed = None if state is None else parse_state(state)
    return _match(log_rules(), log_text or "", parsed, overrides)


def find_submit_hints(sbatch_stderr: str | None) -> list[Hint]:
    """Hints for sbatch refusing a job (its stderr)."""
    return _match(submit_rules(), sbatch_stderr or "", None)


def format_hints(hints: Iterable[Hint]) -> str:
    """Hints as lines for a failure message (empty string when there are none)."""
    return "\n".join(f"Hint: {hint}" for hint in hints)


def hint_for(log_text: str | None, state: SlurmState | str | None = None,
             overrides: Mapping[str, str] | None = None) -> str | None:
    """Every matching hint as one text (for a message that prefixes it with ``Hint: ``), or None.

    Several hints are separated by a newline and ``Hint: `` so each stays on its own line.
    """
    hints = find_hints(log_text, state, overrides)
    return "\nHint: ".join(str(hint) for hint in hints) or None
