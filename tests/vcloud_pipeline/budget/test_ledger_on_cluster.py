"""The incremental ledger against the local cluster's real sacct and squeue.

The first read on a host reads the year and keeps the runs that ended; a job of the project then
runs and ends; the next read asks sacct only for the jobs alive since the first read, less the
overlap (``--starttime=now-<seconds>seconds``, which sacct 22.05 takes), and what the host then keeps
holds every run a read of the whole year lists as ended before it, the new job's as sacct bills it.
How many rows that spares is measured by ``benchmarks/ledger_reads.py`` (here the whole suite's jobs
are all younger than an hour).
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import pytest

from slurm_provider.cli.sbatch import JobComment
from slurm_provider.hooks import SlurmHook
from slurm_provider.job_status import JobStatus
from support.localcluster import LocalCluster, poll_until
from vcloud_pipeline.budget import ledger_cache
from vcloud_pipeline.budget.ledger_cache import OVERLAP_SECONDS, run_key
from vcloud_pipeline.budget.preflight import LEDGER_DAYS, PROJECT_TAG, read_ledger
from vcloud_pipeline.profile import load_profile

pytestmark = [pytest.mark.usefixtures("cluster_connection"), pytest.mark.timeout(300)]
QUERY = f'"project":"{PROJECT_TAG}"'


def test_an_incremental_read_asks_for_what_is_new_and_keeps_what_the_whole_year_lists(
        local_cluster: LocalCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    local = load_profile("local")
    profile = local.model_copy(update={"billing": local.billing.model_copy(update={"incremental_ledger": True})})
    logs = local_cluster.test_dir()
    with SlurmHook(profile.connection.conn_id) as hook, caplog.at_level(logging.INFO):
        read_ledger(hook, profile, cache_dir=str(tmp_path))
        first_read = time.time()
        comment = JobComment(dag="ledger_test", task="stage0", run="r1", attempt=1, stage="stage0",
                             project=PROJECT_TAG)
        job_id = str(hook.submit("#!/bin/bash\nsleep 2\n", job_name="ledger-test", comment=comment,
                                 output=f"{logs}/%x.%j.out", partition="debug", account=profile.account,
                                 time_limit="5").job_id)
        poll_until(lambda: (s := hook.statuses([job_id])[job_id]).is_terminal and s.source == "sacct",
                   timeout=120, what=f"job {job_id} ended in sacct")
        elapsed = time.time() - first_read
        read_ledger(hook, profile, cache_dir=str(tmp_path))
        second_read = time.time()
        whole = hook.find_jobs(comment_contains=QUERY, since=f"now-{LEDGER_DAYS}days", every_run=True)

    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ledger: ")]
    assert said[0].startswith("ledger: a year of accounting read: "), said
    since = int(re.search(r"accounting read since now-(\d+)seconds: ", said[1])[1])
    assert OVERLAP_SECONDS + elapsed - 2 <= since <= OVERLAP_SECONDS + elapsed + 2, (said, elapsed)
    kept = ledger_cache.load(ledger_cache.cache_file(profile.connection.conn_id, profile.account, str(tmp_path)))
    assert kept is not None
    ended_before = {run_key(s): s for s in whole if s.is_terminal and s.end and s.end != "Unknown"
                    and time.mktime(time.strptime(s.end, "%Y-%m-%dT%H:%M:%S")) < second_read - 5}
    assert set(ended_before) <= set(kept.runs), set(ended_before) - set(kept.runs)
    ours = [JobStatus.from_event(event) for event in kept.runs.values() if event["job_id"] == job_id]
    assert [(s.state.value, s.elapsed_s, s.tres) for s in ours] == \
        [(s.state.value, s.elapsed_s, s.tres) for s in whole if s.job_id == job_id]
    assert ours[0].state.value == "COMPLETED"
