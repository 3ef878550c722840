"""Every fact the orchestrator and the trainer share is defined once (``vcloud.contract``), and each
side's use of it agrees: paths, the dataset index, exit codes, metric directions, the
``progress.json``/``COMPLETE`` fields and the job environment, down to the rendered job scripts."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

import pytest
import yaml

from hpc_view.records import JobRecord, profile_budget
from slurm_provider.cli.job_files import expand_filename_pattern, job_log_name
from slurm_provider.cli.sbatch import JobComment
from slurm_provider.exit_codes import explain_exit
from slurm_provider.operators import SlurmSubmitOperator, job_name_for
from slurm_provider.resubmission import Submission, SubmissionHistory, progress_made
from slurm_provider.state_vocabulary import SlurmState
from slurm_provider.job_status import JobStatus
from slurm_provider.job_task import ending, naming
from vcloud import contract, exit_record, exitcodes
from vcloud.config import ConfigError, config_from_dict
from vcloud.data.index import INDEX_NAME
from vcloud.stage_records import BestCheckpoint, CompleteRecord, ProgressRecord, StopRecord
from vcloud.training import distributed, markers, mirror, provenance
from vcloud.training.best import improves
from vcloud.training.paths import StagePaths
from vcloud_pipeline.jobs import exits as job_exits, render
from vcloud_pipeline.budget.billing import billed_hours, worst_case
from vcloud_pipeline.dag.job_operator import PipelineJobOperator
from vcloud_pipeline.plan.jobspec import JobSpec
from vcloud_pipeline.plan.layout import run_paths
from vcloud_pipeline.budget.preflight import PROJECT_TAG, ledger_from_statuses, usage_of
from vcloud_pipeline.profile import load_profile
from vcloud_pipeline.jobs.render import render_job
from vcloud_pipeline.plan.stages import StagePlan

from support.task_context import StateStore, task_context

GOLDEN = Path(__file__).parent / "vcloud_pipeline" / "golden"
OUTERS = sorted(GOLDEN.glob("*.outer.sbatch"))
INNERS = sorted(GOLDEN.glob("*.inner.sh"))
TINY_CONFIG = Path(__file__).parents[1] / "trainer" / "configs" / "model_tiny.yaml"
EXITS = {name: value for name, value in vars(contract).items() if name.startswith("EXIT_")}


# --------------------------------------------------------------------------- files of a run


@pytest.mark.parametrize("stage", contract.STAGES)
def test_the_trainer_and_the_orchestrator_name_a_stages_files_alike(stage: int) -> None:
    remote = run_paths(load_profile("lumi"), "full")
    local = StagePaths(Path(str(remote.outputs_dir)), stage)
    assert str(local.dir) == str(remote.stage_dir(stage))
    assert str(local.latest) == str(remote.latest_checkpoint(stage))
    assert str(local.best) == str(remote.best_checkpoint(stage))
    assert str(local.progress) == str(remote.progress_path(stage))
    assert str(local.complete) == str(remote.complete_path(stage))
    assert str(local.metrics) == str(remote.metrics_path(stage))  # what the HPC view reads
    assert (local.dir.name, local.latest.name, local.best.name, local.progress.name, local.complete.name) == (
        contract.stage_dir_name(stage), contract.LATEST_CHECKPOINT, contract.BEST_CHECKPOINT,
        contract.PROGRESS_FILE, contract.COMPLETE_FILE)


def _train_line(step: int, loss: float | None) -> str:
    return json.dumps(contract.metrics_train_record(global_step=step, epoch=1, loss=loss, lr=1e-3,
                                                    samples_per_s=8.0, time=1.7e9))


def _val_line(step: int, psnr: float) -> str:
    return json.dumps(contract.metrics_val_record(global_step=step, epoch=step // 10,
                                                  metrics={"psnr": psnr, "ssim": 0.5}, time=1.7e9))


def test_the_training_curve_is_read_from_metrics_jsonl_while_the_trainer_appends() -> None:
    text = "\n".join([_val_line(0, 20.0), _train_line(5, 0.9), _train_line(10, 0.7), _val_line(10, 22.5)])
    complete = contract.training_curve(text + "\n")
    assert complete == contract.TrainingCurve(loss=((5, 0.9), (10, 0.7)), val_psnr=((0, 20.0), (10, 22.5)))
    # the trainer is in the middle of writing the next line: the lines before it are the curve
    torn = contract.training_curve(text + "\n" + _train_line(15, 0.6)[:25])
    assert torn == complete
    assert complete.to_json() == {"loss": [[5, 0.9], [10, 0.7]], "val_psnr": [[0, 20.0], [10, 22.5]]}


def test_the_training_curve_of_a_resumed_or_empty_file() -> None:
    # Resumed at step 10: lines up to the checkpoint, then the resumed run's (each step once) ...
    resumed = "\n".join([_train_line(5, 0.9), _train_line(10, 0.7), _train_line(15, 0.6), _val_line(20, 23.0)])
    assert contract.training_curve(resumed).loss == ((5, 0.9), (10, 0.7), (15, 0.6))
    # ... and a copy read before the cut (a torn line, then the steps again): the last line of a step wins
    uncut = "\n".join([_train_line(5, 0.9), _train_line(10, 0.7), _train_line(15, 0.65), '{"kind": "tr',
                       _train_line(15, 0.6), _train_line(20, 0.5)])
    assert contract.training_curve(uncut).loss == ((5, 0.9), (10, 0.7), (15, 0.6), (20, 0.5))
    # a diverged step (NaN written as null) is a gap, not a point
    assert contract.training_curve(_train_line(5, None) + "\n" + _train_line(10, 0.7)).loss == ((10, 0.7),)
    for nothing in ("", "\n", '{"kind": "train", "global'):
        curve = contract.training_curve(nothing)
        assert curve.empty and curve == contract.TrainingCurve()


def test_the_dataset_index_the_trainer_writes_is_the_one_the_dag_looks_for() -> None:
    paths = run_paths(load_profile("local"), "r", synthetic_preset="tiny")
    assert paths.data_index.name == INDEX_NAME == contract.DATA_INDEX
    assert paths.data_index.parent == paths.data_dir


def test_the_export_task_stamps_the_files_the_export_job_stamps(tmp_path: Path) -> None:
    """The decision's stamps (``stat`` on the login node, by the provider's verb) and the job's
    (``os.stat``) digest alike for the same files: an exported run is recognised as exported."""
    import subprocess

    from slurm_provider.cli.job_files import build_file_stamps, parse_file_stamps
    from vcloud.export import input_stamps

    profile = load_profile("local", overrides={"paths.base": str(tmp_path)})
    paths = run_paths(profile, "r")
    for name in ("stage0/best.pt", "stage0/COMPLETE", "stage1/best.pt"):
        Path(paths.outputs_dir / name).parent.mkdir(parents=True, exist_ok=True)
        Path(paths.outputs_dir / name).write_bytes(b"x" * len(name))
    wanted = [str(p) for p in paths.export_inputs().values()]
    found = parse_file_stamps(subprocess.run(["sh", "-c", build_file_stamps(wanted)], capture_output=True,
                                             text=True, check=True).stdout, wanted)
    by_name = {name: found[str(path)] for name, path in paths.export_inputs().items() if str(path) in found}
    assert by_name == input_stamps(Path(paths.outputs_dir))
    assert contract.export_inputs_digest(by_name) == contract.export_inputs_digest(input_stamps(Path(paths.outputs_dir)))
    assert paths.exported_marker.name == contract.EXPORTED_FILE and paths.exported_marker.parent == paths.viewer_dir


def test_the_dag_trains_exactly_the_trainers_stages() -> None:
    from vcloud_pipeline.plan.request import parse_request

    plan = StagePlan.build(parse_request({"profile": "local", "config": "tiny"}), load_profile("local"))
    assert plan.stages == contract.STAGES
    assert [label for label in plan.job_specs() if label.startswith("stage")] == [
        contract.stage_dir_name(s) for s in contract.STAGES]


# --------------------------------------------------------------------------- exit codes


def test_exit_codes_are_distinct_and_the_trainers_are_the_contracts() -> None:
    assert len(set(EXITS.values())) == len(EXITS)
    assert (exitcodes.STAGE_COMPLETE, exitcodes.ERROR, exitcodes.BAD_CONFIG, exitcodes.REQUEUE,
            exitcodes.GPUS_MISSING, exitcodes.RESUME_REFUSED) == (
        contract.EXIT_OK, contract.EXIT_ERROR, contract.EXIT_BAD_CONFIG, contract.EXIT_REQUEUE,
        contract.EXIT_GPUS_MISSING, contract.EXIT_RESUME_REFUSED)


def test_every_failing_exit_code_is_explained_to_the_task() -> None:
    failing = {value for value in EXITS.values() if value != contract.EXIT_OK}
    assert set(job_exits.MEANINGS) == failing
    for code in failing:
        assert explain_exit(code, 0, job_exits.MEANINGS) == f"Exit code {code}: {job_exits.MEANINGS[code]}"


@pytest.mark.parametrize("golden", OUTERS, ids=lambda p: p.name)
def test_rendered_outer_scripts_use_the_contracts_exit_codes(golden: Path) -> None:
    text = golden.read_text()
    assert f"readonly EXIT_REQUEUE={contract.EXIT_REQUEUE}\n" in text
    assert f"readonly EXIT_CODE_MISMATCH={contract.EXIT_CODE_MISMATCH}\n" in text


@pytest.mark.parametrize("golden", INNERS, ids=lambda p: p.name)
def test_rendered_inner_scripts_use_the_contracts_exit_codes_and_environment(golden: Path) -> None:
    text = golden.read_text()
    found = re.findall(r"\brc=(\d+)|-eq (\d+)|int\(\"(\d+)\"\)", text)
    codes = {int(n) for groups in found for n in groups if n} - {contract.EXIT_OK, 255}  # 255: status unknown
    assert codes <= {contract.EXIT_REQUEUE, contract.EXIT_GPUS_MISSING, contract.EXIT_ERROR}
    if "preflight" in golden.name:
        assert f'EXIT_GPUS_MISSING = int("{contract.EXIT_GPUS_MISSING}")' in text
    assert f"export {contract.CODE_HASH_ENV}=" in text
    variables = set(re.findall(r"\bVCLOUD_[A-Z_]+", text))
    assert variables <= {contract.CODE_HASH_ENV, contract.GPUS_REQUIRED_ENV, contract.GPU_HINT_ENV,
                         contract.OUTPUTS_MIRROR_ENV, contract.RANK_EXITS_DIR_ENV}


def test_the_job_environment_names_are_the_contracts_on_both_sides() -> None:
    assert (render.CODE_HASH_ENV, render.GPUS_REQUIRED_ENV, render.GPU_HINT_ENV) == (
        provenance.CODE_HASH_ENV, distributed.GPUS_REQUIRED_ENV, distributed.GPU_HINT_ENV) == (
        contract.CODE_HASH_ENV, contract.GPUS_REQUIRED_ENV, contract.GPU_HINT_ENV)
    assert render.OUTPUTS_MIRROR_ENV == contract.OUTPUTS_MIRROR_ENV
    shared = "/shared/outputs/run"
    assert mirror.mirror_root({contract.OUTPUTS_MIRROR_ENV: shared}) == Path(shared)
    assert render.RANK_EXITS_DIR_ENV == contract.RANK_EXITS_DIR_ENV
    records = "/shared/logs/run/.job.77.exits"
    assert exit_record.records_dir({contract.RANK_EXITS_DIR_ENV: records}) == Path(records)


# --------------------------------------------------------------------------- metric directions


@pytest.mark.parametrize("metric", contract.METRIC_NAMES)
def test_best_pt_is_chosen_in_the_contracts_direction(metric: str) -> None:
    higher = contract.HIGHER_IS_BETTER[metric]
    assert improves(metric, 2.0, 1.0) is higher
    assert improves(metric, 1.0, 2.0) is not higher


def test_the_trainer_reports_and_selects_by_exactly_the_contracts_metrics() -> None:
    import torch

    from vcloud.metrics import evaluate

    assert tuple(evaluate(torch.rand(2, 13, 8, 8), torch.rand(2, 13, 8, 8))) == contract.METRIC_NAMES
    raw = yaml.safe_load(TINY_CONFIG.read_text())
    for metric in contract.METRIC_NAMES:
        raw["train"]["best_metric"] = metric
        assert config_from_dict(raw).train.best_metric == metric
    raw["train"]["best_metric"] = "accuracy"
    with pytest.raises(ConfigError, match="best_metric"):
        config_from_dict(raw)


# --------------------------------------------------------------------------- progress.json and COMPLETE


def _best(epoch: int) -> dict:
    return {"name": "psnr", "value": 30.0 + epoch, "epoch": epoch, "metrics": {"psnr": 30.0 + epoch, "sam": 4.0}}


def test_the_dag_reads_complete_as_the_trainer_writes_it(tmp_path: Path) -> None:
    path = tmp_path / contract.COMPLETE_FILE
    written = markers.CompleteRecord(stage=1, epochs=5, step=50, final_metrics={"psnr": 31.0},
                                     best=BestCheckpoint.from_json(_best(3)), code_version="v", code_hash="h")
    markers.write_json(path, written.to_json())
    record = CompleteRecord.parse(path.read_text())
    assert record == written
    assert record.best_epoch_and_metrics() == (3, {"psnr": 33.0, "sam": 4.0})
    assert (record.epochs, record.final_metrics, record.code_hash) == (5, {"psnr": 31.0}, "h")
    assert json.loads(path.read_text())["best_metric"] == _best(3), "best.pt's record as the trainer keeps it"
    assert CompleteRecord.parse(None) is None and CompleteRecord.parse("not json") is None
    assert CompleteRecord.parse("[1]") is None


def test_the_provider_sees_the_trainers_progress_move_forward(tmp_path: Path) -> None:
    def progress(epoch: int, step: int) -> str:
        record = markers.ProgressRecord(
            stage=0, status=contract.STATUS_RUNNING, epoch=epoch, epochs_total=5, step=step, batch_in_epoch=0,
            batches_per_epoch=10, best=_best(epoch), last_metrics={}, history=(), world_size=1, device="cpu")
        return json.dumps(record.to_json())

    assert progress_made(progress(1, 10), progress(1, 12))
    assert progress_made(progress(1, 10), progress(2, 20))
    assert not progress_made(progress(2, 20), progress(2, 20))
    stop = StopRecord(contract.STOP_EPOCHS, "trained its 3 epochs", 3)
    done = ProgressRecord.from_json(json.loads(progress(2, 20))).completed(
        epoch=3, epochs_total=3, step=30, best=_best(3), history=[], stop=stop)
    assert done.status == contract.STATUS_COMPLETE and done.device == "cpu" and done.stop == stop
    assert ProgressRecord.from_json(json.loads(json.dumps(done.to_json()))) == done
    assert progress_made(progress(2, 20), json.dumps(done.to_json()))


# --------------------------------------------------------------------------- log files


@pytest.mark.parametrize("golden", OUTERS, ids=lambda p: p.name)
def test_rendered_scripts_name_their_logs_as_the_operator_does(golden: Path) -> None:
    directives = dict(re.findall(r"^#SBATCH --(output|error)=(\S+)$", golden.read_text(), re.MULTILINE))
    assert PurePosixPath(directives["output"]).name == job_log_name("%x", "%j", "out")
    assert PurePosixPath(directives["error"]).name == job_log_name("%x", "%j", "err")


def test_the_operator_reads_the_log_files_a_rendered_job_writes() -> None:
    profile = load_profile("lumi")
    paths = run_paths(profile, "full")
    job = render_job(profile, JobSpec.train(1, config="trainer/configs/model_full.yaml"), paths, "ab" * 32)
    operator = SlurmSubmitOperator(task_id="stage1", conn_id="lumi", script=job.outer, log_dir=str(paths.logs_dir))
    context = task_context("manual__1", StateStore(), dag_id="vcloud_training", task_id="stage1")
    name = job_name_for("vcloud_training", "stage1", "manual__1")  # sbatch --job-name overrides the script's
    for stream, pattern in (("out", job.stdout_pattern), ("err", job.stderr_pattern)):
        written = expand_filename_pattern(str(pattern), job_id="4242", job_name=name)
        assert naming.log_path(operator, context, "4242", stream) == written == f"{paths.logs_dir}/{name}.4242.{stream}"


# --------------------------------------------------------------------------- GPU-hours

LUMI_RUNS = [
    # a stage on two whole nodes, requeued once: both runs are billed, 4 GPU-hours per node-hour
    ("11", "standard-g", "nid[005000-005001]", 16, 3600, "cpu=112,gres/gpu=16,node=2"),
    ("11", "standard-g", "nid[005002-005003]", 16, 1800, "cpu=112,gres/gpu=16,node=2"),
    # an export on a full-node partition: Slurm allocated one GCD, the site bills the node
    ("12", "standard-g", "nid005004", 1, 1800, "cpu=7,gres/gpu=1,node=1"),
    # a shared partition bills the largest of cores / 8, memory / 64G and GCDs, at 0.5 each
    ("13", "small-g", "nid005005", 2, 5400, "cpu=32,gres/gpu=2,mem=128G,node=1"),
]


def _lumi_run(job_id: str, partition: str, nodes: str, gpus: int, elapsed: int, tres: str) -> JobStatus:
    comment = JobComment(dag="vcloud_training", task="stage1", run="r1", attempt=1, stage="stage1",
                         project=PROJECT_TAG).to_json()
    return JobStatus(job_id=job_id, state=SlurmState.COMPLETED, gpus=gpus, elapsed_s=elapsed, partition=partition,
                     account="project_465002500", comment=comment, node_list=nodes, source="sacct", tres=tres)


class RunsHook:
    """What ``_finish`` asks of the hook: every run of a job as sacct lists it."""

    def __init__(self, runs: list[JobStatus]) -> None:
        self._runs = runs

    def runs(self, job_id: str) -> list[JobStatus]:
        return [run for run in self._runs if run.job_id == job_id]


def test_the_hpc_view_charts_the_gpu_hours_the_budget_bills() -> None:
    lumi = load_profile("lumi")
    runs = [_lumi_run(*row) for row in LUMI_RUNS]
    billed = ledger_from_statuses(lumi, runs).summary.total
    assert billed == pytest.approx(2 * 4 * 1.0 + 2 * 4 * 0.5 + 1 * 4 * 0.5 + 0.5 * 4 * 1.5)

    operator = PipelineJobOperator(task_id="stage1", job="stage1")
    operator.cluster_profile = lumi  # as _bind sets it from the plan
    history = SubmissionHistory()
    for number, job_id in enumerate(dict.fromkeys(r.job_id for r in runs), start=1):
        history.add(Submission(job_id, number, "initial" if number == 1 else "TIMEOUT", 1))
    context = task_context("manual__1", StateStore(), dag_id="vcloud_training", task_id="stage1")
    summary = ending.finish(operator, context, RunsHook(runs), history, runs[-1])
    assert summary["gpu_hours"] == pytest.approx(billed, abs=1e-4)

    record = JobRecord(dag_id="vcloud_training", run_id="manual__1", task_id="stage1", map_index=-1,
                       task_state="success", profile="lumi", run_name="r1", stage="stage1", job_id="13",
                       job_ids=tuple(summary["job_ids"]), state="COMPLETED", gpu_hours=summary["gpu_hours"],
                       finished_at=datetime(2026, 3, 1, tzinfo=timezone.utc), final=True)
    charted = profile_budget("lumi", [record], allocation=lumi.billing.allocation)
    assert charted.total == pytest.approx(billed, abs=1e-4)


def test_one_gpu_hour_formula_for_worst_case_ledger_and_provider() -> None:
    """What a job asks (the worst case) and what sacct says it held (the ledger) are billed by the one
    rule of its partition; a profile without rules bills as the provider's flat formula does."""
    lumi = load_profile("lumi")
    nodes = worst_case(lumi, JobSpec.train(1, config="c.yaml", partition="standard-g", nodes=2, gpus_per_node=8,
                                           time_limit="02:00:00"))
    ran = _lumi_run("11", "standard-g", "nid[005000-005001]", 16, 7200, "cpu=112,gres/gpu=16,node=2")
    assert nodes.amount == billed_hours(lumi, usage_of(lumi, ran)) == pytest.approx(16.0)
    shared = worst_case(lumi, JobSpec.train(1, config="c.yaml", gpus_per_node=4, time_limit="02:00:00"))
    ran = _lumi_run("12", "small-g", "nid005000", 4, 7200, "cpu=56,gres/gpu=4,mem=256G,node=1")
    assert shared.amount == billed_hours(lumi, usage_of(lumi, ran)) == pytest.approx(0.5 * 7 * 2)
    local = load_profile("local")
    run = JobStatus(job_id="5", state=SlurmState.COMPLETED, gpus=2, elapsed_s=7200,
                    partition=local.default_partition, node_list="c1", tres="cpu=4,gres/gpu=2,node=1")
    assert run.gpu_hours(local.billing.factor) == billed_hours(local, usage_of(local, run)) == pytest.approx(4.0)
    assert worst_case(local, JobSpec.train(0, gpus_per_node=2, time_limit="02:00:00")).amount == pytest.approx(4.0)


def test_the_run_summary_says_the_exports_scores_and_how_sure_a_refiner_is() -> None:
    from vcloud.contract import export_scores_words

    draft = {"stage": 1, "series": 8, "split": "test", "samples": 1,
             "mean": {"psnr": 31.234, "ssim": 0.9123, "sam": 3.456}}
    assert export_scores_words(draft) == ("export of stage 1 on 8 test series: PSNR 31.23 dB, SSIM 0.912, "
                                          "SAM 3.46 deg")
    refiner = {**draft, "stage": 2, "samples": 4,
               "uncertainty": {"uncertainty": 0.01234, "uncertainty_error_corr": 0.41, "spread_skill": 0.87}}
    assert export_scores_words(refiner).endswith(
        "; the mean of 4 samples, mean uncertainty 0.0123 (reflectance), its correlation with the error 0.41, "
        "spread-skill ratio 0.87")
    assert export_scores_words(None) is None and export_scores_words({"mean": {"psnr": "x"}}) is None
