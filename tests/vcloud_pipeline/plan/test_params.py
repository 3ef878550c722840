"""The trigger form's validation: bad names and injection attempts fail before anything is submitted."""

from __future__ import annotations

import datetime as dt

import pytest

from vcloud_pipeline.plan.request import RequestError, TrainingRequest, default_run_name, parse_request

PROFILES = ("cosmos", "levante", "local", "lumi")


def parse(**conf):
    return parse_request(conf, known_profiles=PROFILES)


def test_defaults_train_every_stage_of_the_tiny_config_on_the_local_cluster() -> None:
    request = parse()
    assert request.profile == "local"
    assert request.config == "tiny"
    assert request.stages == (0, 1, 2, 3)
    assert request.mode == "resume"
    assert request.run_name == "tiny"
    assert request.export and not request.dry_run
    assert request.on_code_change == "keep_weights"
    assert request.config_path == "trainer/configs/model_tiny.yaml"


def test_start_stage_skips_the_stages_before_it_like_the_seed_start_stage() -> None:
    assert parse(start_stage=2).stages == (2, 3)
    assert parse(stages=[3, 1, 1], start_stage="1").stages == (1, 3)
    with pytest.raises(RequestError, match="start_stage 3 leaves none of the stages"):
        parse(stages=[0, 1], start_stage=3)


@pytest.mark.parametrize(("conf", "message"), [
    ({"profile": "lumi2"}, r"profile 'lumi2' not known \(known: cosmos, levante, local, lumi\)"),
    ({"profile": "../../etc/passwd"}, "profile '../../etc/passwd' not known"),
    ({"profile": "local; rm -rf ~"}, "not known"),
    ({"config": "huge"}, r"config 'huge' not allowed \(allowed: tiny, small, full\)"),
    ({"config": "tiny$(id)"}, "config 'tiny\\$\\(id\\)' not allowed"),
    ({"stages": [4]}, "stages entry must be from 0 to 3, got 4"),
    ({"stages": ["1; ls"]}, "stages entry must be an integer"),
    ({"stages": {"a": 1}}, "stages must be a list"),
    ({"start_stage": -1}, "start_stage must be from 0 to 3"),
    ({"mode": "fresh"}, r"mode 'fresh' not allowed \(allowed: resume, restart\)"),
    ({"max_resubmits": 1000}, "max_resubmits must be from 0 to 50"),
    ({"max_resubmits": True}, "max_resubmits must be an integer"),
    ({"dry_run": "yes"}, "dry_run must be true or false"),
    ({"run_name": "a b"}, "run name 'a b' is not allowed"),
    ({"run_name": "x;touch /tmp/p"}, "is not allowed"),
    ({"run_name": "../other"}, "is not allowed"),
    ({"run_name": "-rf"}, "is not allowed"),
    ({"time_limit": "01:00:00; scancel -u vcloud"}, "time_limit '01:00:00; scancel -u vcloud' is not a Slurm "
                                                     "time limit; use one of Slurm's forms: MM, MM:SS"),
    ({"time_limit": 60}, "must be a Slurm duration string"),
    ({"max_epochs": 0}, "max_epochs must be from 1"),
    ({"partition": "dev-g; scancel -u vcloud"}, "partition must be a Slurm partition name"),
    ({"nodes": 0}, "nodes must be from 1 to 1024"),
    ({"gpus_per_node": "two"}, "gpus_per_node must be an integer"),
    ({"on_code_change": "ignore"}, r"on_code_change 'ignore' not allowed \(allowed: keep_weights, refuse\)"),
    ({"stage": [2]}, r"unknown param\(s\) stage \(known: profile, config, stages"),
])
def test_bad_values_are_refused_naming_the_field_and_the_allowed_values(conf, message) -> None:
    with pytest.raises(RequestError, match=message):
        parse(**conf)


def test_default_run_name_continues_manual_runs_and_separates_scheduled_ones() -> None:
    day = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)
    assert default_run_name("full", "manual", day) == "full"
    assert default_run_name("full", "scheduled", day) == "full-20260301"
    assert default_run_name("small", "backfill", day) == "small-20260301"
    assert parse_request({}, run_type="scheduled", logical_date=day, known_profiles=PROFILES).run_name == "tiny-20260301"


def test_the_task_sdks_run_type_enum_names_scheduled_and_backfill_runs() -> None:
    # str() of the task SDK's enum is "DagRunType.SCHEDULED": the plan must use its value.
    from airflow.sdk.api.datamodels._generated import DagRunType

    from vcloud_pipeline.dag.tasks import plan_run, run_type_name

    assert run_type_name(DagRunType.SCHEDULED) == "scheduled"
    assert run_type_name(DagRunType.BACKFILL) == "backfill"
    assert run_type_name("manual") == "manual" and run_type_name(None) is None
    day = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)
    planned = plan_run({"profile": "local", "config": "tiny"}, run_type=DagRunType.SCHEDULED, logical_date=day)
    assert planned["request"]["run_name"] == "tiny-20260301"


def test_request_round_trips_through_xcom() -> None:
    request = parse(stages=[1, 2], mode="restart", run_name="r1", time_limit="00:10:00", max_epochs=2,
                    partition="standard-g", nodes=2, gpus_per_node=8, on_code_change="refuse")
    assert TrainingRequest.model_validate(request.model_dump(mode="json")) == request
    assert request.on_code_change == "refuse"
    assert (request.partition, request.nodes, request.gpus_per_node) == ("standard-g", 2, 8)


def test_training_jobs_take_the_requested_partition_nodes_and_gpus() -> None:
    from vcloud_pipeline.plan.jobspec import resolve_resources
    from vcloud_pipeline.profile import load_profile
    from vcloud_pipeline.plan.stages import StagePlan

    request = parse_request({"profile": "lumi", "partition": "standard-g", "nodes": 2, "gpus_per_node": 8})
    plan = StagePlan(request=request, synthetic_data=False)
    spec = plan.job_specs()["stage1"]
    resources = resolve_resources(load_profile("lumi"), spec)
    assert (resources.partition.name, resources.nodes, resources.gpus_per_node) == ("standard-g", 2, 8)
    assert plan.job_specs()["preflight"].nodes == 1  # only training jobs span nodes


def test_profiles_are_looked_up_in_include_profiles_by_default() -> None:
    assert parse_request({"profile": "lumi"}).profile == "lumi"
    with pytest.raises(RequestError, match="known: .*local.*lumi"):
        parse_request({"profile": "nosuch"})


@pytest.mark.parametrize("transport", ["key", "openssh"])
def test_user_in_a_profiles_paths_is_the_login_of_its_connection(transport: str, tmp_path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from vcloud_pipeline.dag.tasks import build_plan

    if transport == "key":
        pin = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA+FyJGmYfy8zo5LMRX2V3JhRuUVxh6TdNGOkT63oaCH"
        conn = {"conn_type": "ssh", "host": "cosmos.sdsc.edu", "login": "alice", "extra": {"host_key": pin}}
    else:  # the user is what ssh resolves for the alias (`ssh -G`), whatever the connection's login says
        config = tmp_path / "ssh_config"
        config.write_text("Host cosmos\n    HostName cosmos.sdsc.edu\n    User alice\n")
        conn = {"conn_type": "ssh", "login": "not-used", "extra": {
            "transport": "openssh", "ssh_alias": "cosmos", "ssh_config_file": str(config)}}
    monkeypatch.setenv("AIRFLOW_CONN_COSMOS", json.dumps(conn))
    monkeypatch.setenv("VCLOUD_PROFILE_OVERRIDES", json.dumps({"cosmos": {"account": "csd999"}}))
    ctx = build_plan(parse_request({"profile": "cosmos", "config": "full"}))
    assert ctx.profile.paths.base == "/cosmos/vast/scratch/alice/vcloud"
    assert str(ctx.paths.outputs_dir).startswith("/cosmos/vast/scratch/alice/vcloud/outputs/")
    assert ctx.profile.staging is not None
    assert ctx.profile.staging.node_local_dir == "/scratch/alice/job_{job_id}"


def test_the_config_choices_are_the_configs_shipped() -> None:
    from typing import get_args

    from vcloud_pipeline.plan.request import CONFIGS, FIELDS, ConfigName, TrainingRequest

    assert get_args(ConfigName) == tuple(CONFIGS)
    assert FIELDS == tuple(TrainingRequest.model_fields) and "start_stage" in FIELDS


def test_force_stages_only_forces_stages_the_run_selects() -> None:
    assert parse_request({"profile": "local"}).force_stages == ()
    request = parse_request({"profile": "local", "force_stages": ["3"]})
    assert request.force_stages == (3,) and request.forced(3) and not request.forced(2)
    assert TrainingRequest.model_validate(request.model_dump(mode="json")) == request
    unselected = parse_request({"profile": "local", "stages": [0, 1], "force_stages": [3]})
    assert unselected.stages == (0, 1) and not unselected.forced(3), "forcing does not select"
    with pytest.raises(RequestError, match=r"force_stages"):
        parse_request({"profile": "local", "force_stages": [4]})


def test_the_plan_carries_the_stages_without_work_to_every_later_task() -> None:
    from vcloud_pipeline.dag.tasks import plan_run
    from vcloud_pipeline.plan.run_plan import RunPlan

    planned = plan_run({"profile": "local", "config": "tiny", "run_name": "carried"})
    assert list(planned["without_work"]) == ["3"]
    assert RunPlan.from_xcom(planned).stage_plan.without_work == {3: planned["without_work"]["3"]}
    forced = plan_run({"profile": "local", "config": "tiny", "run_name": "carried", "force_stages": [3]})
    assert forced["without_work"] == {} and RunPlan.from_xcom(forced).stage_plan.stages == (0, 1, 2, 3)
