"""The site's Slurm version: read from what its commands print, judged against the tested releases, said once."""

from __future__ import annotations

import logging
import uuid

import pytest

from slurm_provider.slurm_versions import (
    TESTED_RELEASES,
    SlurmVersion,
    note_site_version,
    parse_slurm_version,
    version_words,
)


@pytest.mark.parametrize("text, version", [
    ("slurm 22.05.8\n", SlurmVersion(22, 5, 8)),
    ("slurm-wlm 24.11.5", SlurmVersion(24, 11, 5)),
    ("22.05.8", SlurmVersion(22, 5, 8)),  # scontrol show config's SLURM_VERSION
    ("slurm 23.02.7-1", SlurmVersion(23, 2, 7)),  # a distribution's package suffix
    ("slurm 25.05", SlurmVersion(25, 5, None)),
    ("slurm 2.2.8", None),
    ("sinfo: command not found", None),
    ("", None),
    (None, None),
], ids=["sinfo", "debian-wlm", "config", "package-suffix", "no-micro", "too-old-to-read", "no-version", "empty",
        "none"])
def test_a_version_is_read_from_what_slurms_commands_print(text: str | None, version: SlurmVersion | None) -> None:
    assert parse_slurm_version(text) == version


def test_a_release_is_major_and_minor_and_the_tested_ones_are_known() -> None:
    assert SlurmVersion(22, 5, 8).release == "22.05" and str(SlurmVersion(22, 5, 8)) == "22.05.8"
    assert str(SlurmVersion(25, 5)) == "25.05"
    assert "22.05" in TESTED_RELEASES and SlurmVersion(22, 5, 2).tested
    assert not SlurmVersion(21, 8, 8).tested


def test_the_words_name_the_version_and_the_tested_releases() -> None:
    assert version_words(SlurmVersion(22, 5, 8), "sinfo --version") == \
        "Slurm 22.05.8 (a release this provider is tested against)"
    untested = version_words(SlurmVersion(24, 11, 5), "sinfo --version")
    assert untested.startswith("Slurm 24.11.5: release 24.11 is not one this provider is tested against (22.05)")
    assert "used all the same" in untested
    assert version_words(None, "scontrol show config") == \
        "Slurm's version could not be read from scontrol show config; this provider is tested against Slurm 22.05"


def test_a_version_is_said_once_per_connection_and_release(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("slurm_versions_test")
    first, second = (f"conn-{uuid.uuid4().hex[:8]}" for _ in range(2))
    with caplog.at_level(logging.INFO, logger=log.name):
        for _ in range(3):
            assert note_site_version(first, "slurm 24.11.5", "sinfo --version", log) == SlurmVersion(24, 11, 5)
        note_site_version(second, "slurm 24.11.5", "sinfo --version", log)  # another connection: said again
        note_site_version(first, "slurm 22.05.8", "sinfo --version", log)  # the site upgraded: said again
        assert note_site_version(first, "nonsense", "sinfo --version", log) is None
    said = [(r.levelname, r.getMessage().split(":")[0], r.getMessage()) for r in caplog.records]
    assert [(level, conn) for level, conn, _ in said] == [
        ("WARNING", first), ("WARNING", second), ("INFO", first), ("WARNING", first)], said
    assert "24.11.5" in said[0][2] and "22.05.8" in said[2][2] and "could not be read" in said[3][2]
