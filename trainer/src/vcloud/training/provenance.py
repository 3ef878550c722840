"""Which code produced a checkpoint (seed 000: "always version checkpoints with the code")."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

import vcloud


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
