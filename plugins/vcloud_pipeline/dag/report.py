"""Print a run's outputs and the project's GPU-hour ledger: ``python -m vcloud_pipeline.dag.report``.

What ``make demo`` shows at the end, and what a person checks after a run: checkpoints, viewer
images and metrics as they are on the cluster, each stage's metrics from its ``COMPLETE`` record
(those of ``best.pt``, the weights handed on, and of the last epoch, and the earlier stages'
``best.pt`` it was built from) with why it stopped and what
its GPU-hours bought on validation (with ``--dag-run-id``: that DAG run's GPU-hours per stage), the
stages a run does not submit and why, where each stage's
training-curve PNG is (the export's ``curves/stage{N}.png``), what the project's jobs
have cost, and the allocation with the source of each figure (Slurm's limit on the account, or the
profile's ``billing.allocation``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping

from vcloud.stage_records import CompleteRecord

from vcloud_pipeline.plan.labels import JobLabel, training_label
from vcloud_pipeline.plan.request import RequestError, parse_request
from vcloud_pipeline.budget.billing import Allocation
from vcloud_pipeline.budget.pacing import Pace
from vcloud_pipeline.budget.preflight import read_budget
from vcloud_pipeline.plan.run_plan import RunPlan
from vcloud_pipeline.dag.tasks import build_plan, curve_pngs, stage_records, stage_yields, yield_line


def _size(size: int) -> str:
    n = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _metrics(values: dict | None) -> str:
    shown = ", ".join(f"{k} {v:.4g}" for k, v in (values or {}).items() if isinstance(v, (int, float)))
    return shown or "-"


def ledger_section(ledger, dag_run_id: str | None, unit: str) -> list[str]:
    """This DAG run's jobs one by one, then every run of the project in one line."""
    lines = [f"GPU-hour ledger ({unit}; this project's jobs as sacct knows them):"]
    if dag_run_id:
        mine = {label: hours for (run, label), hours in ledger.summary.by_stage.items() if run == dag_run_id}
        lines.append(f"  DAG run {dag_run_id}:")
        lines += [f"    {label:10} {hours:.4f}" for label, hours in sorted(mine.items())]
        lines.append(f"    {'total':10} {sum(mine.values()):.4f}")
    summary = ledger.summary
    lines.append(f"  project: {summary.total:.4f} over {summary.jobs} job(s) in {len(summary.by_run)} "
                 f"DAG run(s); {ledger.reserved:.4f} held by queued or running jobs")
    return lines


def allocation_section(allocation: Allocation, pace: Pace | None = None) -> list[str]:
    """The allocation the budget check uses: each figure with its source, what is left, and the pace."""
    lines = [f"Allocation ({allocation.unit}, from {allocation.source}):"]
    if allocation.limit is None:
        lines.append(f"  limit: none tracked ({allocation.limit_from})")
    else:
        lines.append(f"  limit: {allocation.limit:.4f} ({allocation.limit_from})")
    lines.append(f"  used:  {allocation.used:.4f} ({allocation.used_from})")
    lines.append(f"  held:  {allocation.held:.4f} ({allocation.held_from})")
    if allocation.left is not None:
        lines.append(f"  left:  {allocation.left:.4f}")
    if allocation.note:
        lines.append(f"  (not from Slurm: {allocation.note})")
    if pace is not None:
        lines.append(f"  pace:  {pace.words}")
    return lines


def curves_section(pngs: dict[str, str]) -> list[str]:
    """Where each stage's training-curve plot is (the export plots it from the stage's metrics.jsonl)."""
    lines = ["training curves (PNG, loss and validation PSNR over the steps of each stage):"]
    lines += [f"  {label}: {path}" for label, path in sorted(pngs.items())]
    if not pngs:
        lines.append("  none yet: the export job plots them")
    return lines


def yields_section(records: Mapping[JobLabel, CompleteRecord | None], ledger, dag_run_id: str | None) -> list[str]:
    """Per stage: GPU-hours (of DAG run ``dag_run_id``, from the ledger), validation gain over its
    start, gain per GPU-hour, why it stopped."""
    hours = {}
    if dag_run_id:
        hours = {label: h for (run, label), h in ledger.summary.by_stage.items()
                 if run == dag_run_id and training_label(label) is not None}
    title = f"GPU-hours of DAG run {dag_run_id}" if dag_run_id else "GPU-hours: pass --dag-run-id"
    lines = [f"what each stage bought on validation ({title}):"]
    yields = stage_yields(records, hours)
    lines += [f"  {yield_line(label, entry)}" for label, entry in yields.items()]
    if not yields:
        lines.append("  no stage complete yet")
    return lines


def render_report(plan: RunPlan, hook, dag_run_id: str | None = None) -> str:
    paths = plan.paths
    lines = [f"run {plan.run_name} on profile {plan.profile.name}", "", f"outputs: {paths.outputs_dir}"]
    lines += [f"  {_size(size):>10}  {rel}" for rel, size in hook.list_files(paths.outputs_dir)]
    lines += ["", f"viewer export: {paths.viewer_dir}"]
    lines += [f"  {_size(size):>10}  {rel}" for rel, size in hook.list_files(paths.viewer_dir)]
    metrics = hook.read_file(str(paths.viewer_dir / "metrics.json"))
    if metrics:
        lines += ["", "viewer metrics.json:", *("  " + line for line in metrics.strip().splitlines()[:40])]
    lines += ["", "stages (from COMPLETE):"]
    records = stage_records(plan, hook)
    for label, record in records.items():
        if record is None:
            reason = plan.without_work.get(label.stage) if label.stage is not None else None
            lines.append(f"  {label}: not complete" + (f" ({reason})" if reason else ""))
            continue
        best_epoch, best = record.best_epoch_and_metrics()
        lines.append(f"  {label}: {record.epochs} epochs; best.pt from epoch {best_epoch}: {_metrics(best)}; "
                     f"last epoch: {_metrics(record.final_metrics)}; {record.describe_lineage()}")
    budget = read_budget(hook, plan.profile)
    lines += ["", *yields_section(records, budget.ledger, dag_run_id)]
    lines += ["", *curves_section(curve_pngs(plan, hook))]
    lines += ["", *ledger_section(budget.ledger, dag_run_id, plan.profile.billing.unit)]
    lines += ["", *allocation_section(budget.allocation, budget.pace)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vcloud_pipeline.dag.report", description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="local")
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--run", required=True, help="run name (the outputs directory)")
    parser.add_argument("--dag-run-id", default=None, help="Airflow run id whose jobs the ledger lists one by one")
    args = parser.parse_args(argv)
    try:
        plan = build_plan(parse_request({"profile": args.profile, "config": args.config, "run_name": args.run}))
    except RequestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from slurm_provider import SlurmHook

    with SlurmHook(plan.profile.connection.conn_id) as hook:
        print(render_report(plan, hook, args.dag_run_id))
    return 0


if __name__ == "__main__":
    sys.exit(main())

