"""The DAG file: imports cleanly, is wired in the pipeline's order, and refuses bad params up front."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ORDER = ["plan", "sync_code", "preflight_checks", "provision_env", "prepare_data", "preflight_imports",
         "stage0", "stage1", "stage2", "stage3", "export", "summary"]


@pytest.fixture(scope="module")
def dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    return bag.dags["vcloud_training"]


def test_dag_imports_without_errors_and_runs_the_pipeline_in_order(dag) -> None:
    assert dag is not None
    assert sorted(dag.task_ids) == sorted(ORDER + ["verdict"])
    for upstream, downstream in zip(ORDER[1:-1], ORDER[2:]):
        assert upstream in dag.get_task(downstream).upstream_task_ids, (upstream, downstream)
    assert "plan" in dag.get_task("sync_code").upstream_task_ids


def test_skipped_stages_do_not_block_later_ones_but_failures_do(dag) -> None:
    for task_id in ORDER[3:-1]:
        assert dag.get_task(task_id).trigger_rule == "none_failed", task_id
    assert dag.get_task("summary").trigger_rule == "all_done"


def test_a_failed_job_or_check_fails_the_dag_run(dag) -> None:
    # The summary runs whatever happened (all_done): without a verdict after it, a run whose stage
    # failed would be marked a success.
    verdict = dag.get_task("verdict")
    assert verdict.trigger_rule == "none_failed"
    assert set(ORDER[1:]) <= verdict.upstream_task_ids
    assert sorted(t.task_id for t in dag.leaves) == ["verdict"]


def test_stage_checkpoints_and_viewer_export_are_assets(dag) -> None:
    for stage in range(4):
        (outlet,) = dag.get_task(f"stage{stage}").outlets
        assert outlet.uri == f"vcloud://training/stage{stage}/best.pt"
    (viewer,) = dag.get_task("export").outlets
    assert viewer.name == "vcloud_viewer_export"


def test_retraining_schedule_without_catchup_and_runs_at_the_same_time(dag) -> None:
    from airflow.configuration import conf

    assert dag.catchup is False
    # A multi-week run does not hold the others back; each cluster's pool bounds the jobs.
    assert dag.max_active_runs == conf.getint("core", "max_active_runs_per_dag") > 1
    assert dag.timetable.expression == "0 0 1 * *"  # @monthly, VCLOUD_TRAINING_SCHEDULE changes it


def test_params_form_has_a_described_field_for_every_request_field(dag) -> None:
    from vcloud_pipeline.plan.request import FIELDS

    params = dag.params
    assert set(FIELDS) == set(params.keys())
    for name in FIELDS:
        assert params.get_param(name).description, name
    assert params["config"] == "tiny" and params["stages"] == [0, 1, 2, 3] and params["mode"] == "resume"
    assert params.get_param("config").schema["enum"] == ["tiny", "small", "full"]


def test_the_dag_file_is_wiring_only() -> None:
    text = (REPO / "dags" / "vcloud_training.py").read_text()
    for forbidden in ("open(", "subprocess", "load_profile", "yaml", "Variable.get", "requests"):
        assert forbidden not in text, forbidden


@pytest.mark.usefixtures("airflow_home")
def test_injection_in_the_form_is_refused_before_the_run_starts(dag) -> None:
    from airflow.sdk.definitions.param import ParamValidationError

    with pytest.raises(ParamValidationError, match="profile"):
        dag.test(run_conf={"profile": "local; rm -rf ~"})
    with pytest.raises(ParamValidationError, match="config"):
        dag.test(run_conf={"config": "$(reboot)"})


@pytest.mark.usefixtures("airflow_home")
def test_an_unknown_profile_is_refused_by_the_form_and_by_the_plan(dag) -> None:
    from airflow.sdk.definitions.param import ParamValidationError

    from vcloud_pipeline.plan.request import RequestError
    from vcloud_pipeline.dag.tasks import plan_run

    # The form offers the installed profiles only: no run starts, so nothing can be submitted.
    with pytest.raises(ParamValidationError, match=r"'nosuch' is not one of \['cosmos', 'levante', 'local', 'lumi'\]"):
        dag.test(run_conf={"profile": "nosuch", "run_name": "never"})
    # A conf that reaches the plan some other way fails there, before any I/O on a cluster.
    with pytest.raises(RequestError, match=r"profile 'nosuch' not known \(known: cosmos, levante, local, lumi\)"):
        plan_run({"profile": "nosuch", "run_name": "never"})


def test_the_form_offers_the_installed_profiles_and_groups_the_advanced_params(dag) -> None:
    from vcloud_pipeline.plan.request import ADVANCED, RequestError, dag_params
    from vcloud_pipeline.profile import available_profiles

    params = dag.params
    assert params.get_param("profile").schema["enum"] == list(available_profiles()) == [
        "cosmos", "levante", "local", "lumi"]
    advanced = {name for name in params.keys() if params.get_param(name).schema.get("section") == ADVANCED}
    assert advanced == {"start_stage", "max_resubmits", "time_limit", "max_epochs", "partition", "nodes",
                        "gpus_per_node", "on_code_change", "force_stages"}
    assert params.get_param("on_code_change").schema["enum"] == ["keep_weights", "refuse"]
    assert params["on_code_change"] == "keep_weights"
    # The UI shows sections in the order of their first field: the everyday fields stay on top.
    order = list(params.keys())
    assert max(order.index(name) for name in order if name not in advanced) < min(order.index(n) for n in advanced)
    # The UI renders the form from the serialized DAG: the drop-down and the sections survive it.
    from airflow.serialization.serialized_objects import DagSerialization

    served = DagSerialization.from_dict(DagSerialization.to_dict(dag)).params
    assert served.get_param("profile").schema["enum"] == ["cosmos", "levante", "local", "lumi"]
    assert served.get_param("nodes").schema["section"] == ADVANCED
    assert dag_params("lumi", profiles=("local", "lumi"))["profile"].schema["enum"] == ["local", "lumi"]
    with pytest.raises(RequestError, match=r"default profile 'saga' is not installed \(installed: local, lumi\); "
                                           "set VCLOUD_DEFAULT_PROFILE"):
        dag_params("saga", profiles=("local", "lumi"))


JOB_TASKS = ["prepare_data", "preflight_imports", "stage0", "stage1", "stage2", "stage3", "export"]


def test_job_tasks_retry_a_lost_watch_by_default_as_the_scheduler_sees_them(dag) -> None:
    # The scheduler decides retries from the serialized DAG, not from the parsed file.
    from airflow.serialization.serialized_objects import DagSerialization

    from slurm_provider.operators import DEFAULT_MAX_RETRY_DELAY, DEFAULT_RETRIES, DEFAULT_RETRY_DELAY

    serialized = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    for task_id in JOB_TASKS:
        task = serialized.get_task(task_id)
        assert (task.retries, task.retry_delay, task.retry_exponential_backoff, task.max_retry_delay) == \
            (DEFAULT_RETRIES, DEFAULT_RETRY_DELAY, 2.0, DEFAULT_MAX_RETRY_DELAY), task_id
    assert serialized.get_task("plan").retries == 0  # a bad param stays bad: no retry
    for task_id in ("sync_code", "preflight_checks", "summary"):  # they talk to the cluster: ride out an outage
        task = serialized.get_task(task_id)
        assert (task.retries, task.retry_delay, task.retry_exponential_backoff, task.max_retry_delay) == \
            (DEFAULT_RETRIES, DEFAULT_RETRY_DELAY, 2.0, DEFAULT_MAX_RETRY_DELAY), task_id


def test_a_deployment_sets_the_first_retry_delay_of_every_task_that_talks_to_the_cluster(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import timedelta

    from vcloud_pipeline.dag.tasks import cluster_step_retries

    assert cluster_step_retries({})["retry_delay"] == cluster_step_retries({"VCLOUD_RETRY_DELAY": " "})["retry_delay"] \
        == timedelta(minutes=2)
    assert cluster_step_retries({"VCLOUD_RETRY_DELAY": "15"})["retry_delay"] == timedelta(seconds=15)
    for wrong in ("0", "-5", "2m"):
        with pytest.raises(ValueError, match=f"VCLOUD_RETRY_DELAY='{wrong}': give the seconds before a first retry"):
            cluster_step_retries({"VCLOUD_RETRY_DELAY": wrong})
    monkeypatch.setenv("VCLOUD_RETRY_DELAY", "15")
    from airflow.dag_processing.dagbag import DagBag

    parsed = DagBag(dag_folder=str(REPO / "dags")).dags["vcloud_training"]
    for task_id in [*JOB_TASKS, "sync_code", "preflight_checks", "provision_env", "summary"]:
        assert parsed.get_task(task_id).retry_delay == timedelta(seconds=15), task_id
    assert parsed.get_task("plan").retries == 0


class _RunXComs:
    """What ``context["ti"].xcom_pull`` returns in a run: the plan's and the sync's values."""

    def __init__(self, values: dict) -> None:
        self.values = values

    def xcom_pull(self, task_ids: str) -> dict:
        return self.values[task_ids]


def test_job_tasks_show_the_script_they_submit_never_rendered_by_jinja(dag) -> None:
    """Airflow records a job task's template fields after ``render_template_fields``: there the task binds
    the sync's script, which Jinja must leave alone (bash has ``${#x}``; a comment may hold ``{{``)."""
    import copy

    from vcloud_pipeline.plan.labels import JobLabel
    from vcloud_pipeline.plan.run_plan import SyncedCode
    from vcloud_pipeline.dag.tasks import plan_run

    task = copy.deepcopy(dag.get_task("preflight_imports"))  # binding changes it; the DAG's stays unbound
    assert "script" in task.template_fields and task.template_fields_renderers["script"] == "bash"
    planned = plan_run({"profile": "local", "config": "tiny", "run_name": "shown"})
    script = '#!/bin/bash\n# {{ ds }} {% raw %} {# not a comment #}\necho "${#BASH_ARGV[@]}"\n'
    synced = SyncedCode.recording("c" * 64, {JobLabel.PREFLIGHT: script}).model_dump(mode="json")
    task.render_template_fields({"ti": _RunXComs({"plan": planned, "sync_code": synced})},
                                jinja_env=dag.get_template_env())
    assert task.script == script
    assert task.code_version == "c" * 64 and task.log_dir.endswith("/logs/shown")
