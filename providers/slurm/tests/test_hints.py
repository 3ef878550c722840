"""Slurm's own failure signatures map to a hint; projects add theirs through the registration API."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_provider.hints import (
    LOG_RULES,
    SUBMIT_RULES,
    find_hints,
    find_submit_hints,
    format_hints,
    hint_for,
)
from slurm_provider.state_vocabulary import SlurmState

GOLDEN = Path(__file__).parent / "golden"
PROVIDER_SRC = Path(__file__).resolve().parents[1] / "src"

LOG_EXCERPTS: dict[str, str] = {
    "too_many_processors": """\
srun: error: Unable to create step for job 5123456: More processors requested than permitted
""",
    "host_out_of_memory": """\
slurmstepd: error: Detected 1 oom_kill event in StepId=16082076.batch. Some of the step tasks have been OOM Killed.
""",
    "time_limit": """\
epoch 46/100 psnr=34.0
slurmstepd: error: *** JOB 16082076 ON nid005011 CANCELLED AT 2026-02-16T09:12:00 DUE TO TIME LIMIT ***
""",
}
RULE_TEXT = {rule.key: rule.hint for rule in LOG_RULES + SUBMIT_RULES}


def test_every_rule_has_an_excerpt() -> None:
    assert set(LOG_EXCERPTS) == {rule.key for rule in LOG_RULES}


@pytest.mark.parametrize("key", sorted(LOG_EXCERPTS))
def test_each_signature_gives_its_hint(key: str) -> None:
    hints = find_hints(LOG_EXCERPTS[key])
    keys = [h.key for h in hints]
    assert key in keys
    hint = hints[keys.index(key)]
    assert hint.evidence and hint.evidence in LOG_EXCERPTS[key]
    assert hint.hint.endswith(".") and hint.source


def test_the_provider_names_no_site() -> None:
    """Its advice is Slurm's; a site's own words come from a registration."""
    for rule in LOG_RULES + SUBMIT_RULES:
        text = f"{rule.title} {rule.hint} {rule.source}"
        assert not re.search(r"(?i)lumi|levante|cosmos|vcloud|project_\d", text), (rule.key, text)


def test_a_site_can_replace_the_advice_of_a_signature() -> None:
    advice = "Ask for at most 2-00:00:00 on this cluster."
    (hint,) = find_hints(LOG_EXCERPTS["time_limit"], overrides={"time_limit": advice})
    assert (hint.key, hint.title, hint.hint) == ("time_limit", "Time limit reached", advice)
    assert hint_for(LOG_EXCERPTS["time_limit"], overrides={"time_limit": advice}) == f"Time limit reached: {advice}"
    # other signatures keep their advice
    (oom,) = find_hints(LOG_EXCERPTS["host_out_of_memory"], overrides={"time_limit": advice})
    assert oom.hint == find_hints(LOG_EXCERPTS["host_out_of_memory"])[0].hint


@pytest.mark.parametrize(
    "benign",
    [
        "NCCL INFO NET/OFI Using aws-ofi-rccl 1.4.0; libfabric version 1.15.2\n",
        "wandb: Tracking run with wandb version 0.16.0\n",
        "epoch 12 psnr=35.1 memory=54.2GB\n",
        "Using MIOpen find mode 1\n",
        "",
    ],
)
def test_benign_lines_give_no_hint(benign: str) -> None:
    assert find_hints(benign) == []


def test_state_based_hints() -> None:
    assert [h.key for h in find_hints("", state=SlurmState.OUT_OF_MEMORY)] == ["host_out_of_memory"]
    assert [h.key for h in find_hints(None, state="TO")] == ["time_limit"]
    assert find_hints("", state="COMPLETED") == []


def test_logs_captured_on_the_real_cluster() -> None:
    read = lambda name: (GOLDEN / f"log_{name}.txt").read_text()  # noqa: E731
    assert [h.key for h in find_hints(read("oom"), state="FAILED")] == ["host_out_of_memory"]
    assert [h.key for h in find_hints(read("timeout"), state="TIMEOUT")] == ["time_limit"]
    assert find_hints(read("cancelled"), state="CANCELLED") == []
    assert find_hints(read("requeue"), state="COMPLETED") == []


def test_submit_hints_from_real_sbatch_errors() -> None:
    account = find_submit_hints((GOLDEN / "sbatch_bad_account.stderr.txt").read_text())
    assert [h.key for h in account] == ["invalid_account"]
    partition = find_submit_hints((GOLDEN / "sbatch_test_only_bad_partition.stderr.txt").read_text())
    assert [h.key for h in partition] == ["invalid_partition"]
    assert find_submit_hints("sbatch: Job 48 to start at 2026-11-22T00:04:03") == []


@pytest.mark.parametrize(
    ("stderr", "key"),
    [
        ("sbatch: error: Batch job submission failed: Requested time limit is invalid (missing or exceeds some limit)", "time_limit_invalid"),
        ("sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)", "qos_policy"),
        ("sbatch: error: Batch job submission failed: Requested node configuration is not available", "node_configuration"),
        ("sbatch: error: Invalid generic resource (gres) specification", "invalid_gres"),
        ("sbatch: error: This does not look like a batch script.  The first", "not_a_batch_script"),
    ],
)
def test_submit_rules(stderr: str, key: str) -> None:
    assert [h.key for h in find_submit_hints(stderr)] == [key]


def test_every_submit_rule_is_exercised() -> None:
    exercised = {"invalid_account", "invalid_partition", "time_limit_invalid", "qos_policy", "node_configuration", "invalid_gres", "not_a_batch_script"}
    assert exercised == {rule.key for rule in SUBMIT_RULES}


def test_format_hints() -> None:
    text = format_hints(find_hints(LOG_EXCERPTS["too_many_processors"]))
    assert text.startswith("Hint: More CPUs requested than the node has: ")
    assert format_hints([]) == ""


def test_hint_for_gives_one_text_or_none() -> None:
    text = hint_for(LOG_EXCERPTS["too_many_processors"], state="TIMEOUT")
    assert text is not None
    assert text.startswith("More CPUs requested than the node has: ")
    assert "\nHint: Time limit reached: " in text
    assert hint_for("all good\n", state="COMPLETED") is None


REGISTRATION_PROBE = """
import json
from slurm_provider.hints import HintRule, find_hints, find_submit_hints, log_rules, register_hints, submit_rules
import re
out = {"before": [r.key for r in log_rules()], "submit_before": [r.key for r in submit_rules()]}
rule = HintRule(key="site_scratch_quota", title="Scratch quota exceeded", hint="Clean up the scratch directory.",
                source="site notes", pattern=re.compile(r"Disk quota exceeded"))
register_hints(log_rules=[rule], advice={"time_limit": "Site: ask for at most 2 days."})
register_hints(log_rules=[rule])  # a second registration replaces, never duplicates
log = "write failed: Disk quota exceeded\\nslurmstepd: error: *** JOB 5 ON n1 CANCELLED AT x DUE TO TIME LIMIT ***"
out["after"] = [r.key for r in log_rules()]
out["found"] = [[h.key, h.hint] for h in find_hints(log)]
out["overridden"] = [h.hint for h in find_hints(log, overrides={"time_limit": "Task's own."})]
out["submit"] = [h.key for h in find_submit_hints("Invalid account or account/partition combination specified")]
print(json.dumps(out))
"""


def test_registration_in_a_process_with_only_the_provider(tmp_path: Path) -> None:
    """A fresh process with nothing but the provider (no project code) knows only Slurm's signatures;
    an installed distribution's ``slurm_provider.hints`` entry point and ``register_hints`` add to them."""
    site = tmp_path / "site"
    (site / "demo_site_hints-1.0.dist-info").mkdir(parents=True)
    (site / "demo_site_hints-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: demo-site-hints\nVersion: 1.0\n")
    (site / "demo_site_hints-1.0.dist-info" / "entry_points.txt").write_text(
        "[slurm_provider.hints]\ndemo = demo_site_hints:register\n")
    (site / "demo_site_hints.py").write_text(
        "import re\nfrom slurm_provider.hints import HintRule, register_hints\n"
        "def register():\n"
        "    register_hints(submit_rules=[HintRule(key='site_account', title='Site account', hint='Use project_x.',\n"
        "                   source='site', pattern=re.compile(r'Invalid account'))])\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROVIDER_SRC), str(site)])}
    proc = subprocess.run([sys.executable, "-c", REGISTRATION_PROBE], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["before"] == [rule.key for rule in LOG_RULES]
    assert out["submit_before"] == ["site_account"] + [rule.key for rule in SUBMIT_RULES]
    assert out["after"] == ["site_scratch_quota"] + [rule.key for rule in LOG_RULES]
    assert out["found"] == [["site_scratch_quota", "Clean up the scratch directory."],
                            ["time_limit", "Site: ask for at most 2 days."]]
    assert out["overridden"] == ["Clean up the scratch directory.", "Task's own."]
    assert out["submit"] == ["site_account", "invalid_account"]
