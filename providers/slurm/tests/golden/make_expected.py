"""Write the expected parse result (<name>.json) next to each captured Slurm output.

Run after capture.sh, then read the diffs: a golden file is only as good as its review.

    .venv/bin/python providers/slurm/tests/golden/make_expected.py

The tests (cli/test_golden.py, test_job_status.py) call :func:`expected_for` on the raw file and
compare with the JSON written here, so both sides always use the same mapping.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))

from slurm_provider.cli.job_files import parse_log_chunk, parse_progress  # noqa: E402
from slurm_provider.cli.sacct import latest_job_rows, parse_sacct  # noqa: E402
from slurm_provider.cli.sbatch import SbatchRefused, parse_sbatch_parsable, parse_sbatch_test_only  # noqa: E402
from slurm_provider.cli.scontrol import (  # noqa: E402
    parse_scontrol_show_config,
    parse_scontrol_show_job,
    parse_scontrol_show_reservations,
)
from slurm_provider.cli.sinfo import parse_sinfo_unavailable  # noqa: E402
from slurm_provider.cli.squeue import parse_squeue  # noqa: E402
from slurm_provider.cli.sshare import account_tres_minutes, parse_sshare  # noqa: E402
from slurm_provider.cli.values import is_invalid_job_id_error, is_slurm_unavailable  # noqa: E402
from slurm_provider.scheduler_calls import is_rate_limited  # noqa: E402
from slurm_provider.job_status import resolve_statuses, statuses_from_sacct  # noqa: E402
from slurm_provider.watch.maintenance import maintenance_windows  # noqa: E402

# Byte offset each read_log capture asked for (see capture.sh).
LOG_REQUESTED_OFFSETS = {
    "read_log_start": 0,
    "read_log_middle": 20,
    "read_log_end": None,  # the file size; taken from the header
    "read_log_truncated": 10_000_000,
    "read_log_missing": 0,
}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _error(error: Exception) -> dict[str, str]:
    return {"error": type(error).__name__, "message": str(error)}


def expected_for(name: str) -> Any:
    """The parse result for golden file ``<name>.txt`` (or ``<name>.stderr.txt``), JSON-ready."""
    stdout_path = HERE / f"{name}.txt"
    stdout = stdout_path.read_text() if stdout_path.exists() else ""
    stderr_path = HERE / f"{name}.stderr.txt"
    stderr = stderr_path.read_text() if stderr_path.exists() else ""
    if name.startswith("squeue_"):
        rows = parse_squeue(stdout)
        ids = [r.job_id for r in rows]
        return {
            "rows": _plain(rows),
            "invalid_job_id_error": is_invalid_job_id_error(stderr),
            "statuses": {k: v.to_event() for k, v in resolve_statuses(ids, squeue_rows=rows).items()},
        }
    if name.startswith("sacct_"):
        rows = parse_sacct(stdout)
        return {
            "rows": _plain(rows),
            "latest": {k: v.row_index for k, v in latest_job_rows(rows).items()},
            "statuses": {k: v.to_event() for k, v in statuses_from_sacct(rows).items()},
        }
    if name.startswith("answer_"):  # a Slurm client that failed: away (waited out), busy, or an error it answered
        return {"slurm_unavailable": is_slurm_unavailable(stderr), "rate_limited": is_rate_limited(stderr)}
    if name.startswith("config_"):
        return {"settings": parse_scontrol_show_config(stdout)}
    if name in ("scontrol_show_reservation", "scontrol_no_reservation"):
        return {"reservations": parse_scontrol_show_reservations(stdout),
                "maintenance": [dataclasses.asdict(w) for w in maintenance_windows(
                    parse_scontrol_show_reservations(stdout))]}
    if name.startswith("scontrol_"):
        return {
            "records": parse_scontrol_show_job(stdout),
            "invalid_job_id_error": is_invalid_job_id_error(stderr),
        }
    if name.startswith("sbatch_test_only"):
        try:
            return _plain(parse_sbatch_test_only(stderr))
        except SbatchRefused as error:
            return _error(error)
    if name.startswith("sbatch_"):
        try:
            return _plain(parse_sbatch_parsable(stdout, stderr))
        except SbatchRefused as error:
            return _error(error)
    if name.startswith("read_log_"):
        offset = LOG_REQUESTED_OFFSETS[name]
        if offset is None:
            offset = int(stdout.split("size=")[1].split()[0])
        return _plain(parse_log_chunk(stdout, offset))
    if name.startswith("read_progress"):
        return {"progress": parse_progress(stdout)}
    if name.startswith("scancel"):
        return {"stdout": stdout, "stderr": stderr}  # scancel is silent, even for finished jobs
    if name.startswith("sshare_"):
        rows = parse_sshare(stdout)
        return {
            "rows": _plain(rows),
            "billing": {account: _plain(account_tres_minutes(rows, account))
                        for account in ("vcloud_local", "nosuch_account")},
        }
    if name.startswith("sinfo_"):
        return {"nodes": parse_sinfo_unavailable(stdout)}
    raise KeyError(f"no parser mapping for golden file {name!r}")


def golden_names() -> list[str]:
    names = set()
    for path in HERE.glob("*.txt"):
        stem = path.name.removesuffix(".txt").removesuffix(".stderr")
        if not stem.startswith("log_"):
            names.add(stem)
    return sorted(names)


def main() -> None:
    for name in golden_names():
        result = expected_for(name)
        (HERE / f"{name}.json").write_text(json.dumps(result, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
        print(f"wrote {name}.json")


if __name__ == "__main__":
    main()
