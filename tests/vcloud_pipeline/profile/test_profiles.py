"""Profiles: the shipped defaults, overrides, strict validation and the rules from the field notes."""

from __future__ import annotations

import pytest

from slurm_provider.validation import format_time_limit, parse_time_limit
from vcloud_pipeline.profile import (
    DEFAULT_PROFILE,
    ConnectionSpec,
    OVERRIDES_ENV,
    ProfileError,
    available_profiles,
    load_profile,
    merge_overrides,
    overrides_for,
    overrides_from_environ,
)
from tests.vcloud_pipeline.conftest import complete_profile


def test_four_profiles_ship_and_local_is_the_default() -> None:
    assert set(available_profiles()) >= {"lumi", "levante", "cosmos", "local"}
    assert DEFAULT_PROFILE == "local"
    assert load_profile().name == "local"


def test_lumi_defaults_are_the_users_settings() -> None:
    p = load_profile("lumi")
    assert p.connection == ConnectionSpec(conn_id="lumi")  # how to log in is the Airflow connection's
    assert p.account == "project_465002500"
    assert p.partition_names == ("small-g", "standard-g", "dev-g")
    assert p.partition("small-g").max_gpus_per_node == 4
    assert p.partition("small-g").max_time_seconds == 3 * 86400
    assert p.partition("standard-g").full_node and p.partition("standard-g").max_time_seconds == 2 * 86400
    assert p.partition("dev-g").debug and p.debug_partition == "dev-g"
    assert p.accelerator.per_node == 8 and p.accelerator.unit == "GCD"
    assert p.billing.factor == 1.0 and p.billing.allocation == 100_000
    assert p.paths.code == "/scratch/project_465002500/vcloud/code"
    assert p.paths.pylibs == "/projappl/project_465002500/pylibs"
    assert p.paths.fast_tmp == "/flash/project_465002500/vcloud_tmp"
    assert p.container is not None and p.container.runtime == "singularity"
    assert p.container.image == "/appl/local/csc/soft/ai/images/pytorch_2.5.1_lumi_rocm6.2.4_flash-attn-3.0.0.post1.sif"
    assert p.container.containlibs == ("/usr/lib64/libcxi.so.1", "/opt/rocm/lib/librocm_smi64.so.7")
    assert "/opt/cray" in p.container.bind_env and not p.container.rocm
    assert p.software.modules == ()
    assert p.software.env_dict == {"PYTORCH_HIP_ALLOC_CONF": "expandable_segments:True", "WANDB_MODE": "disabled"}
    assert p.software.miopen_cache_dir == "/tmp/miopen_cache_{job_id}"
    assert p.placeholders == ()


def test_local_profile_matches_the_local_cluster() -> None:
    p = load_profile("local")
    assert p.connection.conn_id == "vcloud_local_cluster" and p.account == "vcloud_local"
    assert p.partition_names[:3] == ("small-g", "standard-g", "dev-g")
    assert p.container is not None and p.container.runtime == "charliecloud" and p.accelerator.kind == "none"
    assert p.container.image == "/var/lib/vcloud-localcluster/images/vcloud-trainer"
    assert p.container.binds == ("/srv",) and "/tmp" in p.container.visible_paths  # ch-run shares /tmp
    assert p.software.python == "/opt/vcloud-localcluster/venv/bin/python"
    assert p.paths.base == "/srv/vcloud/scratch/vcloud"
    assert p.gpu_request.style == "gpus"
    assert p.partition("small-g").default_time_seconds <= 1800


def test_levante_and_cosmos_need_user_settings_and_paths_follow_them() -> None:
    for name in ("levante", "cosmos"):
        raw = load_profile(name, login="someone")
        assert set(raw.placeholders) == {"account"}
        with pytest.raises(ProfileError, match=r"account still set to CHANGE_ME"):
            raw.require_complete()
    levante = complete_profile("levante")
    levante.require_complete()
    assert levante.paths.base == "/work/bb1234/b381234/vcloud"
    assert levante.gpu_request.gres_type == "a100_80" and levante.partition("gpu").cpus_per_node == 64
    cosmos = complete_profile("cosmos")
    assert cosmos.paths.base == "/cosmos/vast/scratch/cosmouser/vcloud"
    assert cosmos.staging is not None and cosmos.staging.node_local_dir == "/scratch/cosmouser/job_{job_id}"
    assert cosmos.software.modules == ("rocm/6.3.0", "singularitypro/4.1.3")
    assert cosmos.software.env_dict["NCCL_SOCKET_IFNAME"] == "hsn0"
    assert cosmos.software.env_dict["RCCL_MSCCL_ENABLE"] == "1"
    assert cosmos.accelerator.per_node == 4
    assert cosmos.partition("default").max_nodes == 4
    assert cosmos.partition("default").max_time_seconds == 24 * 3600


def test_overrides_nested_and_dotted() -> None:
    p = load_profile("lumi", overrides={"account": "project_1", "paths": {"base": "/scratch/other/vc"},
                                        "partitions.small-g.max_gpus_per_node": 2})
    assert p.account == "project_1"
    assert p.paths.code == "/scratch/other/vc/code"
    assert p.paths.pylibs == "/projappl/project_1/pylibs"
    assert p.partition("small-g").max_gpus_per_node == 2
    assert p.partition("small-g").max_time_seconds == 3 * 86400  # untouched siblings survive the merge


def test_code_versions_kept_after_a_sync() -> None:
    assert load_profile("local").paths.code_keep == 5  # the default
    assert load_profile("lumi").paths.code_keep == 5
    assert load_profile("local", overrides={"paths.code_keep": 1}).paths.code_keep == 1
    for bad in (0, "3", 2.5):
        with pytest.raises(ProfileError, match="paths.code_keep must be"):
            load_profile("local", overrides={"paths.code_keep": bad})


def test_merge_overrides_does_not_touch_its_input() -> None:
    base = {"a": {"b": 1, "c": 2}}
    merged = merge_overrides(base, {"a.b": 5})
    assert merged == {"a": {"b": 5, "c": 2}} and base == {"a": {"b": 1, "c": 2}}


def test_overrides_from_environment_json() -> None:
    env = {OVERRIDES_ENV: '{"lumi": {"account": "project_2"}, "local": {}}'}
    assert overrides_from_environ("lumi", env) == {"account": "project_2"}
    assert overrides_from_environ("levante", env) == {}
    assert overrides_from_environ("lumi", {}) == {}
    with pytest.raises(ProfileError, match="not valid JSON"):
        overrides_for("lumi", "{not json")
    with pytest.raises(ProfileError, match="must be a mapping"):
        overrides_for("lumi", {"lumi": ["account"]})


def test_partition_error_names_the_known_partitions() -> None:
    with pytest.raises(ProfileError) as err:
        load_profile("lumi").partition("small-gx")
    assert str(err.value) == "partition 'small-gx' not in profile lumi (known: small-g, standard-g, dev-g)"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"contianer": {}}, r"unknown key 'contianer' \(known: site, description, account, connection"),
        ({"container.rocmm": True}, r"unknown key 'rocmm' in container \(known: runtime, image, .*rocm"),
        ({"connection.conn_id": ""}, r"connection.conn_id must be a non-empty string"),
        ({"connection.ssh_key": "~/.ssh/id"}, r"unknown key 'ssh_key' in connection \(known: conn_id, queue\)"),
        ({"site": "saga"}, r"site 'saga' not allowed \(allowed: lumi, levante, cosmos, local, other\)"),
        ({"default_partition": "gpu"}, r"default_partition 'gpu' not allowed \(allowed: small-g, standard-g, dev-g\)"),
        ({"partitions.small-g.max_time": 4320}, r"quoted Slurm duration .*YAML reads"),
        ({"paths.base": "/scratch/$USER/vcloud"}, r"paths.base .* uses a shell variable; write \{user\}"),
        ({"paths.code": "{base}/{project}/code"}, r"paths.code uses \{project\} \(known here: \{account\}, \{base\}, \{user\}\)"),
        ({"paths.logs": "relative/logs"}, r"paths.logs 'relative/logs' must be an absolute path"),
        ({"paths.logs": "/scratch/logs%j"}, r"contains '%': sbatch expands %"),
        ({"accelerator.per_node": 0}, r"accelerator.per_node must be at least 1"),
        ({"accelerator.per_node": "eight"}, r"accelerator.per_node must be an integer"),
        ({"partitions.small-g.max_gpus_per_node": 16}, r"max_gpus_per_node 16 exceeds accelerator.per_node 8"),
        ({"account": None}, r"profile lumi: account is required"),
    ],
)
def test_validation_errors_name_the_field_and_the_allowed_values(overrides: dict, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        load_profile("lumi", overrides=overrides)


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(ProfileError, match=r"no cluster profile 'saga' .*known: cosmos, levante, local, lumi"):
        load_profile("saga")
    with pytest.raises(ProfileError, match="not allowed"):
        load_profile("../lumi")


# --------------------------------------------------------------------------- field-note rules


@pytest.mark.parametrize("overrides", [{"container.rocm": True}, {"container.exec_args": ["--rocm"]}])
def test_lumi_refuses_singularity_rocm_flag(overrides: dict) -> None:
    with pytest.raises(ProfileError, match=r"refused on LUMI: .*GLIBC 2\.33.*GLIBC 2\.31"):
        load_profile("lumi", overrides=overrides)


def test_lumi_refuses_module_load() -> None:
    with pytest.raises(ProfileError, match=r"software.modules must be empty on LUMI .*lua5\.3"):
        load_profile("lumi", overrides={"software.modules": ["singularity-AI-bindings/24.03"]})


def test_rocm_flag_is_a_lumi_rule_not_a_general_one() -> None:
    assert complete_profile("cosmos").container.rocm  # type: ignore[union-attr]


def test_lumi_requires_the_gpu_bindings() -> None:
    with pytest.raises(ProfileError, match=r"containlibs must include /opt/rocm/lib/librocm_smi64.so.7.*No HIP GPUs"):
        load_profile("lumi", overrides={"container.containlibs": ["/usr/lib64/libcxi.so.1"]})
    with pytest.raises(ProfileError, match=r"/opt/cray/libfabric must be bound.*libfabric/CXI"):
        load_profile("lumi", overrides={"container.bind_env": ["/scratch", "/projappl", "/flash"]})
    # the guide's -B flags satisfy the rule as well as SINGULARITY_BIND does
    p = load_profile("lumi", overrides={"container.bind_env": [], "container.binds": [
        "/opt/cray/libfabric", "/scratch/{account}", "/projappl/{account}", "/flash/{account}"]})
    assert "/opt/cray/libfabric" in p.container.binds  # type: ignore[union-attr]


# --------------------------------------------------------------------------- GPUs required


def test_real_accelerators_require_gpus_and_say_what_to_do_without_them() -> None:
    for name in ("lumi", "levante", "cosmos"):
        accelerator = complete_profile(name).accelerator
        assert accelerator.gpus_required and accelerator.missing_gpu_hint
        assert "\n" not in accelerator.missing_gpu_hint  # folded to one line of a log or a message
    local = load_profile("local").accelerator
    assert local.kind == "none" and not local.gpus_required
    assert "keep accelerator.kind none" in (local.missing_gpu_hint or "")
    assert load_profile("local", overrides={"accelerator.kind": "cuda"}).accelerator.gpus_required


def test_a_real_accelerator_without_a_hint_is_refused() -> None:
    with pytest.raises(ProfileError, match=r"accelerator.missing_gpu_hint is required when accelerator.kind is 'cuda'"):
        complete_profile("levante", {"accelerator.missing_gpu_hint": None})
    with pytest.raises(ProfileError, match=r"missing_gpu_hint is required when accelerator.kind is 'rocm'"):
        load_profile("local", overrides={"accelerator.kind": "rocm", "accelerator.missing_gpu_hint": None,
                                         "software.miopen_cache_dir": "/tmp/miopen_{job_id}"})
    assert load_profile("local", overrides={"accelerator.missing_gpu_hint": None}).accelerator.missing_gpu_hint is None
    with pytest.raises(ProfileError, match=r"longer than 600 characters"):
        complete_profile("levante", {"accelerator.missing_gpu_hint": "check the partition " * 40})


@pytest.mark.parametrize(
    ("hint", "message"),
    [
        ("Bind /opt/cray/libfabric and set SINGULARITY_CONTAINLIBS=/usr/lib64/libcxi.so.1.",
         r"must name /opt/rocm/lib/librocm_smi64.so.7: on LUMI PyTorch sees no GCD"),
        ("Run singularity exec --rocm with SINGULARITY_CONTAINLIBS=/usr/lib64/libcxi.so.1,"
         "/opt/rocm/lib/librocm_smi64.so.7 and -B /opt/cray/libfabric.", r"suggests '--rocm'.*GLIBC 2\.33"),
    ],
)
def test_lumis_gpu_hint_is_the_seed_fix(hint: str, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        load_profile("lumi", overrides={"accelerator.missing_gpu_hint": hint})


def test_lumis_shipped_hint_names_the_bindings_and_warns_off_rocm() -> None:
    hint = load_profile("lumi").accelerator.missing_gpu_hint or ""
    assert "SINGULARITY_CONTAINLIBS=/usr/lib64/libcxi.so.1,/opt/rocm/lib/librocm_smi64.so.7" in hint
    assert "-B /opt/cray/libfabric" in hint and "never add --rocm" in hint


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WANDB_MODE": "online"}, r"WANDB_MODE must be 'disabled'; WandB hangs"),
        ({"PYTORCH_HIP_ALLOC_CONF": "garbage_collection_threshold:0.8"}, r"expandable_segments:True.*40 GB"),
    ],
)
def test_lumi_environment_rules(env: dict, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        load_profile("lumi", overrides={"software": {"env": env}})


def test_miopen_cache_rules() -> None:
    with pytest.raises(ProfileError, match=r"MIOPEN_DISABLE_CACHE.*No suitable algorithm"):
        load_profile("lumi", overrides={"software.env.MIOPEN_DISABLE_CACHE": "1"})
    with pytest.raises(ProfileError, match=r"not on node-local disk .*lock each other out"):
        load_profile("lumi", overrides={"software.miopen_cache_dir": "/scratch/{account}/miopen_{job_id}"})
    with pytest.raises(ProfileError, match=r"must contain \{job_id\}"):
        load_profile("lumi", overrides={"software.miopen_cache_dir": "/tmp/miopen_cache"})
    with pytest.raises(ProfileError, match=r"miopen_cache_dir is required for ROCm"):
        load_profile("lumi", overrides={"software.miopen_cache_dir": None})


def test_job_id_only_where_it_exists_per_job() -> None:
    with pytest.raises(ProfileError, match=r"paths.outputs uses \{job_id\}"):
        load_profile("local", overrides={"paths.outputs": "/srv/out_{job_id}"})


def test_container_must_see_every_job_path() -> None:
    with pytest.raises(ProfileError, match=r"staging.node_local_dir /scratch/u not visible|is not visible inside the container"):
        complete_profile("cosmos", {"container.binds": ["/cosmos/vast/scratch/{user}"]})


@pytest.mark.parametrize(("key", "lives"), [
    ("host", "its Host"), ("port", "its Port"), ("user", "its Login"),
    ("transport", 'its extra "transport"'), ("ssh_alias", 'its extra "ssh_alias"'),
    ("ssh_config_file", 'its extra "ssh_config_file"'), ("control_path", "the ssh_config alias"),
])
def test_login_settings_in_a_profile_say_where_they_live_now(key: str, lives: str) -> None:
    with pytest.raises(ProfileError) as err:
        load_profile("lumi", overrides={f"connection.{key}": "x"})
    message = str(err.value)
    assert message.startswith(f"profile lumi: connection.{key} no longer belong in a profile: how to log in "
                              "lives in the Airflow connection 'lumi' only (")
    assert f"{key}: {lives}" in message and message.endswith("Keep only connection.conn_id in the profile")


def test_the_connection_is_chosen_by_a_dotted_override() -> None:
    p = load_profile("local", overrides={"connection.conn_id": "vcloud_local_cluster_openssh"})
    assert p.connection == ConnectionSpec(conn_id="vcloud_local_cluster_openssh")
    assert p.paths == load_profile("local").paths


def test_user_in_paths_is_the_connections_login_and_is_required_to_render() -> None:
    without = load_profile("cosmos", overrides={"account": "csd999"})
    assert without.paths.base == "/cosmos/vast/scratch/{user}/vcloud"
    assert without.login_fields[:2] == ("paths.base", "paths.code")
    assert "staging.node_local_dir" in without.login_fields and "container.binds" in without.login_fields
    with pytest.raises(ProfileError, match=r"profile cosmos: paths.base, paths.code and 8 more use \{user\}, "
                                           r"the login of the Airflow connection 'cosmos': load the profile "
                                           r"with login="):
        without.require_complete()
    with_login = load_profile("cosmos", overrides={"account": "csd999"}, login="alice")
    assert with_login.login_fields == () and with_login.paths.base == "/cosmos/vast/scratch/alice/vcloud"
    with_login.require_complete()
    assert load_profile("lumi").login_fields == ()  # LUMI's paths follow the account only
    with pytest.raises(ProfileError, match="is not a user name"):
        load_profile("cosmos", login="../x")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30", 1800), ("05:30", 330), ("02:00:00", 7200), ("3-00:00:00", 259200), ("1-12", 129600), (90, 5400)],
)
def test_slurm_durations(text: str | int, seconds: int) -> None:
    assert parse_time_limit(text) == seconds


def test_slurm_duration_round_trip_and_errors() -> None:
    assert format_time_limit(259200) == "3-00:00:00"
    assert parse_time_limit(format_time_limit(93784)) == 93784
    for bad in ("", "abc", "1:2:3:4", "0"):
        with pytest.raises(ValueError):
            parse_time_limit(bad)


def test_runtime_none_is_a_bare_run_and_keeps_the_other_container_keys() -> None:
    bare = load_profile("local", overrides={"container.runtime": "none"})
    assert bare.container is None
    assert load_profile("local", overrides={"container": None}).container is None
    with pytest.raises(ProfileError, match=r"container.runtime 'docker' not allowed "
                                           r"\(allowed: singularity, apptainer, charliecloud, none\)"):
        load_profile("local", overrides={"container.runtime": "docker"})


@pytest.mark.parametrize("key, value", [("containlibs", ["/usr/lib64/libcxi.so.1"]), ("bind_env", ["/srv"]),
                                        ("rocm", True)])
def test_singularity_only_keys_are_refused_for_charliecloud(key: str, value: object) -> None:
    with pytest.raises(ProfileError, match=rf"container.{key} only exist for Singularity/Apptainer, not for "
                                           r"runtime 'charliecloud'; bind host paths with container.binds"):
        load_profile("local", overrides={f"container.{key}": value})


def test_charliecloud_must_bind_the_project_filesystem() -> None:
    with pytest.raises(ProfileError, match=r"paths.code /srv/vcloud/scratch/vcloud/code is not visible inside the "
                                           r"container; .* \(visible now: /opt, /tmp\)"):
        load_profile("local", overrides={"container.binds": ["/opt"]})
    staged = load_profile("local", overrides={"staging": {"node_local_dir": "/tmp/vcloud_{job_id}"}})
    assert staged.staging is not None  # node-local staging under /tmp needs no bind with ch-run


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"partitions.standard-g.billing.kind": "nodes"},
         r"partitions.standard-g.billing.kind 'nodes' not allowed \(allowed: gpu, node, resources\)"),
        ({"partitions.standard-g.billing.per_node": None}, r"kind node needs per_node \(kind node reads per_node\)"),
        ({"partitions.small-g.billing.per_node": 4},
         r"kind resources does not read per_node: remove it or choose the kind that does"),
        ({"partitions.small-g.billing.cores_per_slice": None}, r"kind resources needs cores_per_slice"),
        ({"partitions.small-g.billing.mem_per_slice": "64 GB"},
         r"mem_per_slice must be a positive Slurm memory size such as '64G' or '500M', got '64 GB'"),
        ({"partitions.standard-g.full_node": False}, r"billing of kind node bills whole nodes: set full_node: true"),
        ({"partitions.dev-g.mem_per_gpu": None}, r"partitions.dev-g billing of kind resources counts the job's "
                                                 r"memory: set mem_per_gpu"),
        ({"billing.allocation_source": "sacct"},
         r"billing.allocation_source 'sacct' not allowed \(allowed: slurm, profile, command\)"),
        ({"billing.allocation_command": None}, r"allocation_source command needs billing.allocation_command"),
        ({"billing.allocation_source": "slurm", "billing.slurm_tres": "none"},
         r"allocation_source slurm reads GrpTRESMins of billing.slurm_tres, which is none"),
        ({"billing.allocation_source": "profile"},
         r"allocation_command is read only with allocation_source command \(it is profile\)"),
        ({"billing.allocation_command.format": "sacct"},
         r"billing.allocation_command.format 'sacct' not allowed \(allowed: lumi-allocations\)"),
        ({"billing.allocation_command.run": "lumi-allocations -p {project}"},
         r"billing.allocation_command.run uses \{project\} \(known here: \{account\}\)"),
    ],
)
def test_billing_rules_and_the_allocation_source_are_checked_with_what_to_do(overrides: dict,
                                                                             message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        load_profile("lumi", overrides=overrides)


def test_a_partition_without_a_billing_rule_bills_the_flat_factor() -> None:
    levante = load_profile("levante")
    assert all(spec.billing.kind == "gpu" for spec in levante.partitions.values())
    assert levante.billing.source == "profile" and load_profile("local").billing.source == "slurm"
    dumped = load_profile("lumi").model_dump(mode="json")
    assert dumped["partitions"]["standard-g"]["billing"]["kind"] == "node"
    assert dumped["billing"]["allocation_source"] == "command"
