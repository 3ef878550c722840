"""What one budget check asks of accounting: a year of the project's jobs, or only what is new.

The pipeline reads the ledger before each submit, after each job and in every preflight. With the
profile's ``billing.incremental_ledger`` a worker host keeps the runs that ended
(:mod:`vcloud_pipeline.budget.ledger_cache`) and ``sacct`` answers only for the jobs alive since its last
read. Side by side in one run, over the provider's own commands against the fake Slurm of
``tests/support/fake_slurm.py`` (which honours ``--starttime`` as sacct does) holding a year of N jobs
(every tenth requeued once), a submit every hour for a day (a job queued, one starting, one ending
each hour): the ``sacct`` and ``squeue`` calls and the rows they answer per read, and the seconds a read
takes here, for a read of the whole year and for the incremental read; each pair of ledgers must bill
the same.

    .venv/bin/python benchmarks/ledger_reads.py --jobs 1000 5000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "plugins"), str(REPO / "providers" / "slurm" / "src"),
                str(REPO / "trainer" / "src")]

from slurm_provider.cli.sbatch import JobComment  # noqa: E402
from slurm_provider.hooks import SlurmHook  # noqa: E402
from support.fake_slurm import FakeSlurm  # noqa: E402
from vcloud_pipeline.budget.preflight import PROJECT_TAG, Ledger, read_ledger  # noqa: E402
from vcloud_pipeline.profile import ClusterProfile, load_profile  # noqa: E402

HOURS = 24


def ours(stage: str) -> str:
    """A pipeline job's comment: the ledger bills these."""
    return JobComment(dag="vcloud_training", task=stage, run="r1", attempt=1, stage=stage,
                      project=PROJECT_TAG).to_json()


def a_year_of_jobs(fake: FakeSlurm, jobs: int, account: str) -> None:
    """``jobs`` ended jobs of the project over the year before the fake's clock, one every ``365 / jobs``
    days; every tenth requeued once (after a node failure). Finished jobs are in sacct only."""
    fake.table.clock -= timedelta(days=365)
    step = timedelta(days=365) / jobs
    for n in range(jobs):
        job_id = str(10_000 + n)
        fake.add(job_id, f"job{n}", comment=ours(f"stage{n % 4}"), account=account, partition="small-g",
                 tres="billing=1,cpu=16,gres/gpu=1,mem=64G,node=1", time_limit_s=6 * 3600)
        fake.start(job_id, node="nid005001")
        fake.table.clock += step / 3
        if n % 10 == 0:
            fake.requeue(job_id, ended="NODE_FAIL")
            fake.start(job_id, node="nid005002")
        fake.table.clock += step / 3
        fake.end(job_id)
        fake.vanish(job_id)  # slurmctld forgets a finished job after MinJobAge (300 s)
        fake.table.clock += step / 3


def an_hour_of_work(fake: FakeSlurm, hour: int, account: str) -> None:
    """This hour's submit, the previous submit's start and the one before's end."""
    n = 20_000 + hour
    fake.add(str(n), "new", comment=ours("stage2"), account=account, partition="small-g",
             tres="billing=2,cpu=32,gres/gpu=2,mem=128G,node=1", time_limit_s=4 * 3600)
    if hour >= 1:
        fake.start(str(n - 1), node="nid005003")
    if hour >= 2:
        fake.end(str(n - 2), state="TIMEOUT" if hour % 5 == 3 else "COMPLETED")
        fake.vanish(str(n - 2))
    fake.table.clock += timedelta(hours=1)


def with_billing(profile: ClusterProfile, incremental: bool) -> ClusterProfile:
    return profile.model_copy(update={"billing": profile.billing.model_copy(update={"incremental_ledger": incremental})})


def measured(fake: FakeSlurm, read: Callable[[], Ledger]) -> tuple[Ledger, int, int, float]:
    """The ledger, the Slurm calls and the rows they answered, and the seconds, of one read."""
    asked_before, answered = len(fake.asked), 0
    run = fake.run

    def counting(command: str, **kwargs: object) -> object:
        nonlocal answered
        result = run(command, **kwargs)  # type: ignore[arg-type]
        answered += sum(1 for line in result.stdout.splitlines() if line.strip())
        return result

    fake.run = counting  # type: ignore[method-assign]
    try:
        started = time.perf_counter()
        ledger = read()
        seconds = time.perf_counter() - started
    finally:
        fake.run = run  # type: ignore[method-assign]
    return ledger, len(fake.asked) - asked_before, answered, seconds


def compare(jobs: int, cache_dir: str) -> dict[str, float]:
    fake = FakeSlurm()
    profile = load_profile("lumi")
    a_year_of_jobs(fake, jobs, profile.account)
    hook = SlurmHook(ssh_conn_id="vcloud_lumi", runner=fake)
    whole, incremental = with_billing(profile, False), with_billing(profile, True)
    figures: dict[str, list[float]] = {key: [] for key in ("whole_calls", "whole_rows", "whole_s", "inc_calls",
                                                             "inc_rows", "inc_s")}
    for hour in range(HOURS):
        an_hour_of_work(fake, hour, profile.account)
        a, calls_a, rows_a, s_a = measured(fake, lambda: read_ledger(hook, whole))
        b, calls_b, rows_b, s_b = measured(fake, lambda: read_ledger(hook, incremental, cache_dir=cache_dir,
                                                                      now=fake.table.clock.timestamp()))
        if (round(a.used, 6), round(a.reserved, 6), a.summary.jobs) != (round(b.used, 6), round(b.reserved, 6),
                                                                         b.summary.jobs):
            raise SystemExit(f"hour {hour}: the incremental ledger bills {b.used}/{b.reserved}, the year {a.used}/"
                             f"{a.reserved}")
        for key, value in zip(figures, (calls_a, rows_a, s_a, calls_b, rows_b, s_b)):
            figures[key].append(value)
    first_inc_rows = figures["inc_rows"][0]
    later = {key: statistics.mean(values[1:]) for key, values in figures.items()}
    return {**later, "first_inc_rows": first_inc_rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1000, 5000])
    args = parser.parse_args()
    print(f"a submit every hour for {HOURS} h; per read after the first (the first incremental read reads the year)")
    print(f"{'jobs':>6} {'calls':>6} {'rows year':>10} {'rows new':>9} {'rows ratio':>11} {'s year':>8} {'s new':>8} "
          f"{'s ratio':>8} {'1st read rows':>14}")
    for jobs in args.jobs:
        with tempfile.TemporaryDirectory() as cache_dir:
            f = compare(jobs, cache_dir)
        print(f"{jobs:>6} {f['whole_calls']:>6.0f} {f['whole_rows']:>10.0f} {f['inc_rows']:>9.1f} "
              f"{f['whole_rows'] / max(f['inc_rows'], 1):>11.0f} {f['whole_s']:>8.3f} {f['inc_s']:>8.3f} "
              f"{f['whole_s'] / f['inc_s']:>8.1f} {f['first_inc_rows']:>14.0f}")


if __name__ == "__main__":
    main()
