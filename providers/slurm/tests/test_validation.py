"""Validation refuses unsafe values before anything runs, naming the field and the rule."""

from __future__ import annotations

import pytest

from slurm_provider.validation import (
    ValidationError,
    format_time_limit,
    parse_time_limit,
    validate_account,
    validate_dependency,
    validate_export_vars,
    validate_extra_sbatch_options,
    validate_job_id,
    validate_job_ids,
    validate_job_name,
    validate_partition,
    validate_qos,
    validate_remote_path,
    validate_reservation,
    validate_signal,
    validate_since,
    validate_time_limit,
    validate_user,
)

INJECTIONS = [
    "small-g; touch /tmp/pwned",
    "small-g && rm -rf ~",
    "$(touch /tmp/pwned)",
    "`id`",
    "small-g\ntouch /tmp/pwned",
    "small g",
    "-small",
    "",
]


@pytest.mark.parametrize("value", INJECTIONS)
@pytest.mark.parametrize(
    ("check", "field"),
    [
        (validate_partition, "partition"),
        (validate_account, "account"),
        (validate_qos, "qos"),
        (validate_reservation, "reservation"),
        (validate_job_name, "job_name"),
        (validate_user, "user"),
    ],
)
def test_injection_attempts_are_refused_naming_the_field(check, field: str, value: str) -> None:
    with pytest.raises(ValidationError) as caught:
        check(value)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")
    assert isinstance(caught.value, ValueError)


def test_partition_injection_message_quotes_the_value() -> None:
    with pytest.raises(ValidationError, match=r"partition: 'small-g; touch /tmp/pwned' is not a valid partition name"):
        validate_partition("small-g; touch /tmp/pwned")


@pytest.mark.parametrize("value", ["small-g", "standard-g", "dev-g", "small-g,standard-g", "gpu"])
def test_real_partitions(value: str) -> None:
    assert validate_partition(value) == value


def test_real_names() -> None:
    assert validate_account("project_465002500") == "project_465002500"
    assert validate_account("vcloud_local") == "vcloud_local"
    assert validate_job_name("vcloud.train_full.stage1") == "vcloud.train_full.stage1"
    assert validate_user("digifarm") == "digifarm"
    with pytest.raises(ValidationError, match="account"):
        validate_account("small-g,dev-g")  # lists only where Slurm takes lists
    with pytest.raises(ValidationError):
        validate_job_name("x" * 201)


def test_non_text_is_refused() -> None:
    with pytest.raises(ValidationError, match="expected text"):
        validate_partition(None)  # type: ignore[arg-type]


# --- time limits --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("30", 1800),
        (30, 1800),
        ("30:15", 1815),
        ("1:00:00", 3600),
        ("72:00:00", 259200),
        ("3-00:00:00", 259200),
        ("2-12", 216000),
        ("1-02:03", 93780),
        ("1-02:03:04", 93784),
        ("0:01:00", 60),
    ],
)
def test_time_limit_forms(value: str | int, seconds: int) -> None:
    assert parse_time_limit(value) == seconds
    assert parse_time_limit(validate_time_limit(value)) == seconds


@pytest.mark.parametrize("value", ["0", "0:00:00", "1:60:00", "1-24:00:00", "1:00:61", "3 days", "UNLIMITED", "-5", "1h", ""])
def test_bad_time_limits(value: str) -> None:
    with pytest.raises(ValidationError) as caught:
        validate_time_limit(value)
    assert caught.value.field == "time_limit"


def test_time_limit_cap_and_format() -> None:
    assert validate_time_limit("3-00:00:00", max_seconds=3 * 86400) == "3-00:00:00"
    with pytest.raises(ValidationError, match="longer than the allowed maximum 2-00:00:00"):
        validate_time_limit("3-00:00:00", field="time", max_seconds=2 * 86400)
    assert format_time_limit(90) == "0-00:01:30"


# --- paths --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/scratch/project_465002500/vcloud/logs/%x_%j.out",
        "/srv/vcloud/scratch/vcloud/run 1/log.out",
        "/srv/vcloud/it's here/log.out",
        '/srv/vcloud/say "hi"/log.out',
        "/srv/vcloud/$HOME;rm -rf/log.out",
        "relative/logs/x.out",
    ],
)
def test_paths_with_spaces_and_quotes_are_legal(path: str) -> None:
    assert validate_remote_path(path, "output") == path


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/a\nb", "newline"),
        ("/a\rb", "carriage return"),
        ("/a\x00b", "NUL"),
        ("/a|b", "'|'"),
        ("-rf", "starts with '-'"),
        ("", "must not be empty"),
    ],
)
def test_paths_that_would_break_parsing_are_refused(path: str, reason: str) -> None:
    with pytest.raises(ValidationError, match=reason) as caught:
        validate_remote_path(path, "output")
    assert caught.value.field == "output"


def test_absolute_paths_when_required() -> None:
    with pytest.raises(ValidationError, match="must be absolute"):
        validate_remote_path("logs/x.out", "chdir", absolute=True)


# --- extra sbatch options ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "flag"),
    [
        ("--job-name=evil", "--job-name"),
        ("--job=evil", "--job-name"),
        ("-J", "--job-name"),
        ("-Jevil", "--job-name"),
        ("-vJevil", "--job-name"),
        ("--output=/tmp/x", "--output"),
        ("--out=/tmp/x", "--output"),
        ("-o/tmp/x", "--output"),
        ("--error=/tmp/x", "--error"),
        ("-e", "--error"),
        ("--parsable", "--parsable"),
        ("--comment=x", "--comment"),
        ("--test-only", "--test-only"),
        ("--wrap=rm -rf /", "--wrap"),
        ("--wait", "--wait"),
        ("-W", "--wait"),
        ("--chdir=/tmp", "--chdir"),
        ("-D/tmp", "--chdir"),
        ("--export=ALL", "--export"),
        ("--dependency=afterok:1", "--dependency"),
    ],
)
def test_plugin_owned_flags_are_refused_by_name(option: str, flag: str) -> None:
    with pytest.raises(ValidationError) as caught:
        validate_extra_sbatch_options([option])
    assert caught.value.field == "extra_sbatch_options"
    assert flag in str(caught.value)


@pytest.mark.parametrize(
    "options",
    [
        ["--gpus=8", "--mem=64G", "--cpus-per-task=16", "--requeue"],
        ["-N2", "-n16", "-c4", "-psmall-g", "-t1:00:00"],
        ["--gres=gpu:a100_80:1", "--exclusive", "--export-file=/tmp/env", "--partition=small-g"],
        ["--signal=B:USR1@300", "--open-mode=append", "--array=0-3%1", "-H", "--clusters=vcloud-local"],
        ["--constraint=a100&nvme"],
    ],
)
def test_legal_extra_options_pass_unchanged(options: list[str]) -> None:
    assert validate_extra_sbatch_options(options) == tuple(options)


@pytest.mark.parametrize("option", ["script.sh", "1:00:00", "-", "--", "--=x", "--gpus=8\n--wrap=x"])
def test_non_options_are_refused(option: str) -> None:
    with pytest.raises(ValidationError):
        validate_extra_sbatch_options([option])


def test_options_must_be_a_list() -> None:
    with pytest.raises(ValidationError, match="expected a list"):
        validate_extra_sbatch_options("--gpus=8 --mem=64G")  # type: ignore[arg-type]
    assert validate_extra_sbatch_options(None) == ()


# --- ids, signals, dependencies, env ------------------------------------------------------------


def test_job_ids() -> None:
    assert validate_job_id("16082076") == "16082076"
    assert validate_job_id(42) == "42"
    assert validate_job_id("123_4") == "123_4"
    assert validate_job_ids(["1", 2, "1"]) == ("1", "2")
    for bad in ["0", "12;rm", "123.batch", "abc", "", "123_[1-3]", True]:
        with pytest.raises(ValidationError, match="job_id"):
            validate_job_id(bad)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="at least one"):
        validate_job_ids([])


def test_signals() -> None:
    assert validate_signal("USR1") == "USR1"
    assert validate_signal("SIGTERM") == "TERM"
    assert validate_signal("sigusr2") == "USR2"
    assert validate_signal(10) == "10"
    for bad in ["USR1; rm", "65", "FOO", "0"]:
        with pytest.raises(ValidationError, match="signal"):
            validate_signal(bad)


def test_dependencies() -> None:
    for good in ["afterok:123", "afterany:123:124", "afterok:123,singleton", "afternotok:5?afterany:6", "after:7+10"]:
        assert validate_dependency(good) == good
    for bad in ["afterok", "afterok:abc", "afterok:1;rm -rf /", "whenever:1"]:
        with pytest.raises(ValidationError, match="dependency"):
            validate_dependency(bad)


def test_export_vars() -> None:
    assert validate_export_vars({"START_STAGE": "2", "NOTE": "it's fine"}) == {"START_STAGE": "2", "NOTE": "it's fine"}
    with pytest.raises(ValidationError, match="comma"):
        validate_export_vars({"LIST": "a,b"})
    with pytest.raises(ValidationError, match="environment variable name"):
        validate_export_vars({"BAD-NAME": "1"})


def test_sacct_since() -> None:
    for good in ["now-7days", "now", "2026-02-01", "2026-02-01T08:00:00", "midnight", "now-3600"]:
        assert validate_since(good) == good
    for bad in ["yesterday; rm", "2026/02/01", "-7days"]:
        with pytest.raises(ValidationError, match="since"):
            validate_since(bad)
