"""Every captured output file parses to its reviewed expected result."""

from __future__ import annotations

import json

import pytest

from providers.slurm.tests.cli.captured_output import GOLDEN, make_expected


@pytest.mark.parametrize("name", make_expected.golden_names())
def test_golden(name: str) -> None:
    expected = json.loads((GOLDEN / f"{name}.json").read_text())
    assert json.loads(json.dumps(make_expected.expected_for(name))) == expected


def test_every_capture_has_an_expected_result() -> None:
    names = make_expected.golden_names()
    assert len(names) >= 30
    assert all((GOLDEN / f"{name}.json").exists() for name in names)
