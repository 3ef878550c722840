"""Which code produced a checkpoint (seed 000: "always version checkpoints with the code").

Two answers: :func:`code_version` (package version, git describe where there is a checkout) and
:func:`code_hash`, the content hash of the synced code tree that the job scripts set in
``VCLOUD_CODE_HASH``: the name of the code directory on the cluster the job ran from.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path

import vcloud
from vcloud.contract import CODE_HASH_ENV


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """``VCLOUD_CODE_VERSION`` if the deployment set it (code rsync'ed without ``.git``), else the
    package version plus ``git describe`` of the source tree when available."""
    override = os.environ.get("VCLOUD_CODE_VERSION", "").strip()
    if override:
        return override
    version = f"vcloud {vcloud.__version__}"
    try:
        described = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=Path(__file__).parent,
            capture_output=True, text=True, timeout=10, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return version
    if described.returncode == 0 and described.stdout.strip():
        return f"{version} ({described.stdout.strip()})"
    return version


_CODE_HASH = re.compile(r"^[0-9a-f]{64}$")


def code_hash() -> str | None:
    """The synced code's content hash from ``VCLOUD_CODE_HASH`` (set by the job scripts), or None
    outside such a job (tests, a local run); anything that is not a sha256 hex digest is ignored."""
    value = os.environ.get(CODE_HASH_ENV, "").strip()
    return value if _CODE_HASH.match(value) else None
