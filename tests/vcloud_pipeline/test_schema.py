"""pydantic's findings as our sentences: dotted field names, the valid keys and values, no coercion."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pydantic
import pytest

from vcloud_pipeline.profile import ProfileError, load_profile
from vcloud_pipeline.schema import Document, Duration, Environment, Flag, Strings, Text, count, problems
from vcloud_pipeline.profile.site_facts import SiteFactsError, load_site_facts


class _Inner(Document):
    runtime: Literal["singularity", "none"]
    binds: Strings = ()


class _Outer(Document):
    name: Text
    nodes: count(2) = 2
    debug: Flag = False
    time: Duration = 60
    env: Environment = {}
    inner: _Inner | None = None
    parts: dict[str, _Inner] = {}


def sentences(data: object) -> list[str]:
    with pytest.raises(pydantic.ValidationError) as err:
        _Outer.model_validate(data)
    return problems(err.value, _Outer)


@pytest.mark.parametrize(("data", "expected"), [
    ({}, ["name is required"]),
    ({"name": None}, ["name is required"]),  # null is "not given"
    ({"name": " "}, ["name must be a non-empty string, got ' '"]),
    ({"name": "a", "nodes": "3"}, ["nodes must be an integer, got '3'"]),
    ({"name": "a", "nodes": 1}, ["nodes must be at least 2, got 1"]),
    ({"name": "a", "debug": "yes"}, ["debug must be true or false, got 'yes'"]),
    ({"name": "a", "time": 86400}, ["time must be a quoted Slurm duration such as '24:00:00' (got 86400; YAML reads "
                                    "an unquoted 24:00:00 as the number 86400)"]),
    ({"name": "a", "time": "2 days"}, ["time '2 days' is not a Slurm time limit; use one of Slurm's forms: MM, MM:SS, "
                                       "HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (e.g. 3-00:00:00 or 0:30:00)"]),
    ({"name": "a", "env": {"1X": "v"}}, ["env has an invalid variable name '1X'"]),
    ({"name": "a", "inner": {"runtime": "docker"}},
     ["inner.runtime 'docker' not allowed (allowed: singularity, none)"]),
    ({"name": "a", "inner": ["x"]}, ["inner must be a mapping, got list"]),
    ({"name": "a", "parts": {"p1": {"runtime": "none", "bind": []}}},
     ["unknown key 'bind' in parts.p1 (known: runtime, binds)"]),
    ({"name": "a", "nmae": "b", "naem": "c"}, ["unknown key 'nmae', 'naem' (known: name, nodes, debug, time, env, inner, "
                                               "parts)"]),
])
def test_each_problem_is_one_sentence_naming_the_field(data: object, expected: list[str]) -> None:
    assert sentences(data) == expected


def test_valid_values_are_kept_as_written() -> None:
    doc = _Outer.model_validate({"name": "a", "time": "1-00:00:00", "env": {"N": 4}, "inner": {"runtime": "none"}})
    assert (doc.time, doc.env, doc.inner, doc.nodes) == (86400, {"N": "4"}, _Inner(runtime="none"), 2)


def test_a_profile_with_several_problems_names_them_all() -> None:
    with pytest.raises(ProfileError) as err:
        load_profile("lumi", overrides={"accelerator.kind": None, "billing.factor": 0, "jobs.master_port": "80"})
    assert str(err.value) == (
        "profile lumi: accelerator.kind is required; profile lumi: billing.factor must be a positive number, got 0; "
        "profile lumi: jobs.master_port must be an integer, got '80'")


def test_a_moved_login_setting_says_where_it_lives_now() -> None:
    with pytest.raises(ProfileError, match=r"^profile local: connection.host, connection.port no longer belong in a "
                                           r"profile: how to log in lives in the Airflow connection "
                                           r"'vcloud_local_cluster' only \(host: its Host; port: its Port\)"):
        load_profile("local", overrides={"connection.host": "login", "connection.port": 22})


@pytest.mark.parametrize(("text", "message"), [
    ("lumi:\n  account: x\n  container.rocm: true\n", r"f.yaml: lumi.container.rocm is not a site fact; a site-facts "
                                                      r"file maps only account, connection.conn_id"),
    ("- lumi\n", r"f.yaml: must map profile names to their site facts"),
    ("lumi: 3\n", r"f.yaml: lumi must map dotted keys to values"),
])
def test_a_site_facts_file_holds_site_facts_only(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "f.yaml").write_text(text)
    with pytest.raises(SiteFactsError, match=message):
        load_site_facts(tmp_path / "f.yaml")
    (tmp_path / "f.yaml").write_text("lumi:\n  account: x\n  partitions.small-g.cpus_per_node: 4\n")
    assert load_site_facts(tmp_path / "f.yaml") == {"lumi": {"account": "x", "partitions.small-g.cpus_per_node": 4}}
