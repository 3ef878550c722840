"""A failing step of the bring-up names itself (include/local_cluster/steps.sh), never a bare exit.

These run the ERR trap in a throwaway script, no cluster needed; the bring-up itself is proven
from an empty state by `.ci/run` (cluster.sh purge, then make demo's bring-up).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

STEPS = Path(__file__).resolve().parents[2] / "include" / "local_cluster" / "steps.sh"


def _run(body: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "bring_up.sh"
    script.write_text(
        "set -euo pipefail\n"
        f'STEP_TAG="[test]" STEP_LOGS="{tmp_path}/log"\n'
        f'. "{STEPS}"\n' + body
    )
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30)


def test_a_failing_step_names_the_step_the_line_the_command_and_the_logs(tmp_path: Path) -> None:
    result = _run(
        "first() { true; }\n"
        "second() {\n"
        "  local x\n"
        "  x=$(sha256sum /nonexistent/sshd_config 2>/dev/null | cut -d' ' -f1)\n"
        "  echo \"unreachable $x\"\n"
        "}\n"
        "step first\n"
        "step second\n"
        "echo 'not reached'\n",
        tmp_path,
    )
    assert result.returncode != 0
    assert "not reached" not in result.stdout and "unreachable" not in result.stdout
    lines = [line for line in result.stderr.splitlines() if "ERROR" in line]
    assert len(lines) == 1, result.stderr  # said once, not again by the command substitution's shell
    assert lines[0].startswith('[test] ERROR: step "second" failed (exit 1) at ')
    assert "bring_up.sh line 7: x=$(sha256sum /nonexistent/sshd_config" in lines[0]
    assert f"the logs of this step are under {tmp_path}/log" in result.stderr


def test_a_step_that_succeeds_says_nothing(tmp_path: Path) -> None:
    result = _run("ok() { [[ -d / ]]; }\nstep ok\necho done\n", tmp_path)
    assert result.returncode == 0
    assert result.stdout == "done\n"
    assert result.stderr == ""


def test_a_condition_that_is_false_is_no_failure(tmp_path: Path) -> None:
    result = _run("probe() { if grep -q x /dev/null; then echo yes; fi; [[ -e /nonexistent ]] || true; }\n"
                  "step probe\necho done\n", tmp_path)
    assert result.returncode == 0 and result.stderr == "", result.stderr


SITE_IMAGES = STEPS.parent / "site_images.sh"


def test_the_sites_images_name_the_trainer_image_until_it_is_built_and_nothing_else_makes_them(
        tmp_path: Path) -> None:
    """`cluster.sh up` and `make image` run at once in `make bringup`: the cluster's step links the
    sites' images to the trainer image while that is not built yet (under the links' lock), and
    `make image`'s own run refuses to make them from an image that is not there."""
    image = tmp_path / "images" / "vcloud-trainer"
    env = {"PATH": "/usr/bin:/bin", "VCLOUD_IMAGE": str(image)}
    refused = subprocess.run(["bash", str(SITE_IMAGES)], env=env, capture_output=True, text=True, timeout=30)
    assert refused.returncode != 0 and "build it first (make image)" in refused.stderr, refused.stderr
    placeholders = subprocess.run(["bash", str(SITE_IMAGES), "--or-placeholders"], env=env,
                                  capture_output=True, text=True, timeout=30)
    assert placeholders.returncode == 0, placeholders.stderr
    sites = image.parent / "sites"
    assert {p.name: p.readlink() for p in sites.iterdir() if p.is_symlink()} == {
        "lumi.sif": Path("../vcloud-trainer"), "cosmos.sif": Path("../vcloud-trainer")}
