"""Cost of turning a year of a project's accounting into job statuses (the budget ledger).

Every stage task reads the ledger before it submits and after its job ends (``sacct -D`` of the
project's jobs since a year ago, one status per job plus the earlier runs of requeued ones). Builds
sacct answers of N jobs (each with its batch and extern steps, every tenth job requeued once) and,
side by side in one run, times:
  * grouped: one pass over the rows (:func:`slurm_provider.cli.sacct.rows_by_job`), what the
    provider does;
  * per job: every job's runs and steps looked up in the whole answer (``runs_of``/``steps_of``
    per job), which grows with the square of the jobs.

    .venv/bin/python benchmarks/ledger_scaling.py --jobs 500 1000 2000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "providers" / "slurm" / "src")]

from slurm_provider.cli.sacct import SacctRow, parse_sacct, rows_by_job, runs_of, steps_of  # noqa: E402
from slurm_provider.job_status import JobStatus, statuses_from_sacct  # noqa: E402

COMMENT = '{"dag":"vcloud_training","project":"vcloud","run":"manual__r","task":"stage0"}'


def sacct_answer(jobs: int) -> str:
    """sacct --parsable2 rows of `jobs` jobs in the field order the provider asks for."""
    lines = []
    for job in range(1000, 1000 + jobs):
        runs = ["REQUEUED", "COMPLETED"] if job % 10 == 0 else ["COMPLETED"]
        for index, state in enumerate(runs):
            submit = f"2026-11-{1 + index:02d}T10:00:00"
            lines.append(f"{job}|{job}|vc-stage0|{state}|0:0|0:0|None|00:10:00|600|{submit}|{submit}|{submit}|"
                         f"nid005001|billing=8,cpu=8,gres/gpu=1,node=1|small-g|vcloud_local|vcloud|01:00:00|"
                         f"/scratch/vcloud|{COMMENT}")
        for step in ("batch", "extern"):
            lines.append(f"{job}.{step}|{job}.{step}|{step}|COMPLETED|0:0|0:0||00:10:00|600|"
                         f"2026-11-01T10:00:00|2026-11-01T10:00:00|2026-11-01T10:10:00|nid005001|"
                         f"cpu=8,gres/gpu=1,node=1||vcloud_local|vcloud|||")
    return "\n".join(lines) + "\n"


def per_job(rows: list[SacctRow]) -> dict[str, JobStatus]:
    """Each job's rows looked up in the whole answer."""
    ids = sorted({row.job_id for row in rows if not row.is_step})
    return {job_id: JobStatus.from_sacct((runs := runs_of(rows, job_id))[-1], restarts=len(runs) - 1,
                                         steps=steps_of(rows, job_id)) for job_id in ids}


def timed(function, rows: list[SacctRow]) -> tuple[float, dict[str, JobStatus]]:
    fresh = uncached_copies(rows)
    start = time.perf_counter()
    result = function(fresh)
    return time.perf_counter() - start, result


def uncached_copies(rows: list[SacctRow]) -> list[SacctRow]:
    """New row objects, so neither side profits from ids the other already parsed."""
    return [SacctRow(**{k: v for k, v in vars(row).items() if k != "id_parts"}) for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[500, 1000, 2000])
    args = parser.parse_args()
    print(f"{'jobs':>6} {'rows':>6} {'grouped s':>10} {'per job s':>10} {'per job / grouped':>18}")
    for jobs in args.jobs:
        rows = parse_sacct(sacct_answer(jobs))
        grouped_s, grouped = timed(statuses_from_sacct, rows)
        per_job_s, looked_up = timed(per_job, rows)
        assert grouped == looked_up, "the two ways disagree"
        assert len(grouped) == jobs and len(rows_by_job(rows)) == jobs
        print(f"{jobs:>6} {len(rows):>6} {grouped_s:>10.3f} {per_job_s:>10.3f} {per_job_s / grouped_s:>18.1f}")


if __name__ == "__main__":
    main()
