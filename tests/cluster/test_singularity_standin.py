"""The local cluster's `singularity` stand-in (include/local_cluster/singularity): Singularity's
command line on Charliecloud's ch-run, run for real in the trainer image as the cluster user.

Everything runs in a directory the cluster user can reach (pytest's tmp_path sits under a 0700
directory of the user running pytest), created here and removed afterwards.
"""

from __future__ import annotations

import uuid

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "include" / "local_cluster" / "singularity"
IMAGE = Path(os.environ.get("VCLOUD_IMAGE", "/var/lib/vcloud-localcluster/images/vcloud-trainer"))
CLUSTER_USER = os.environ.get("VCLOUD_CLUSTER_USER", "vcloud")

pytestmark = pytest.mark.cluster


@pytest.fixture(autouse=True)
def _charliecloud_and_image() -> None:
    """`make test` installs ch-run and builds the image first: without them these tests fail, loudly."""
    if shutil.which("ch-run") is None:
        pytest.fail("ch-run is not installed (Debian package charliecloud-runtime; `make cluster-up` installs it)")
    if not (IMAGE / "usr" / "bin" / "bash").exists():
        pytest.fail(f"no Charliecloud trainer image at {IMAGE} (`make image` builds it)")


def _as_user() -> list[str]:
    """The prefix that runs a command as the unprivileged cluster user, as Slurm runs jobs."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(CLUSTER_USER)
    except KeyError:
        pytest.fail(f"cluster user {CLUSTER_USER!r} does not exist: `make cluster-up` creates it",
                    pytrace=False)
    return ["runuser", "-u", CLUSTER_USER, "--"]


def cluster_home() -> str:
    return pwd.getpwnam(CLUSTER_USER).pw_dir if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_dir


@pytest.fixture
def work() -> Iterator[Path]:
    """A fresh directory under /tmp owned by the cluster user (so visible inside by default)."""
    path = Path(tempfile.mkdtemp(prefix="vcloud-singularity-test-", dir="/tmp"))
    if os.geteuid() == 0:
        user = pwd.getpwnam(CLUSTER_USER)
        os.chown(path, user.pw_uid, user.pw_gid)
    yield path
    shutil.rmtree(path)


def singularity(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SINGULARITY", "APPTAINER"))}
    return subprocess.run([*_as_user(), str(STANDIN), *args], cwd=cwd, env={**environ, **(env or {})},
                          capture_output=True, text=True, timeout=120)


def inside(script: str, *options: str, cwd: Path, env: dict[str, str] | None = None,
           image: Path = IMAGE) -> subprocess.CompletedProcess:
    return singularity("exec", *options, str(image), "bash", "-c", script, cwd=cwd, env=env)


def test_version_says_it_is_the_standin(work: Path) -> None:
    out = singularity("--version", cwd=work)
    assert out.returncode == 0
    assert "vcloud stand-in" in out.stdout and "Charliecloud" in out.stdout


def test_runs_as_the_unprivileged_user_in_the_image(work: Path) -> None:
    out = inside('id -u; echo "$HOME"; cat /etc/vcloud-image.sha256', cwd=work)
    assert out.returncode == 0, out.stderr
    uid, home, image_hash = out.stdout.split("\n")[:3]
    assert uid == str(os.geteuid() if os.geteuid() else pwd.getpwnam(CLUSTER_USER).pw_uid)
    assert uid != "0"
    assert home == pwd.getpwuid(int(uid)).pw_dir
    assert image_hash  # a file of the image, not of the host


def test_bound_directory_and_file_appear_at_destinations_the_image_lacks(work: Path) -> None:
    (work / "data dir").mkdir()
    (work / "data dir" / "sample.txt").write_text("from the host dir\n")
    (work / "config.yaml").write_text("from the host file\n")
    script = ("cat '/data/in/sample.txt' /srv/run/config.yaml; test -f /srv/run/config.yaml && echo is-file; "
              "touch /srv/run/config.yaml 2>/dev/null || echo read-only")
    out = inside(script, "-B", f"{work}/data dir:/data/in",
                 "--bind", f"{work}/config.yaml:/srv/run/config.yaml:ro", cwd=work)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:4] == ["from the host dir", "from the host file", "is-file", "read-only"]
    assert not Path(f"{IMAGE}/data").exists(), "nothing is created in the image"


def test_bind_over_an_image_directory_survives_a_bind_beside_it(work: Path) -> None:
    for name in ("over", "beside"):
        (work / name).mkdir()
        (work / name / "id").write_text(name)
    out = inside("cat /opt/vcloud-localcluster/id /opt/beside/id",
                 "-B", f"{work}/over:/opt/vcloud-localcluster", "-B", f"{work}/beside:/opt/beside", cwd=work)
    assert (out.returncode, out.stdout) == (0, "overbeside"), out.stderr


def test_a_path_not_bound_is_missing_inside(work: Path) -> None:
    # Under /srv (bound by nobody by default; the checkout may sit under /tmp or $HOME, which are).
    outside = Path("/srv") / f"vcloud-standin-{uuid.uuid4().hex[:8]}"
    outside.mkdir(mode=0o755)
    try:
        forgotten = outside / "forgotten.txt"  # readable on the host, bound by nobody
        forgotten.write_text("host only\n")
        forgotten.chmod(0o644)
        out = inside(f"test -e '{forgotten}' && echo visible || echo missing; pwd", cwd=outside)
        assert out.returncode == 0, out.stderr
        missing, start = out.stdout.split("\n")[:2]
        assert missing == "missing"
        assert start == cluster_home()
        assert f"WARNING: current directory {outside} is not bound into the container" in out.stderr
    finally:
        shutil.rmtree(outside)


def test_current_directory_is_kept_when_visible(work: Path) -> None:
    out = inside("pwd", cwd=work)
    assert (out.returncode, out.stdout.strip(), out.stderr) == (0, str(work), "")


def test_missing_bind_source_fails_like_singularity(work: Path) -> None:
    source = work / "never-created"
    out = inside("echo ran", "-B", f"{source}:/data", cwd=work)
    assert out.returncode == 255
    assert out.stdout == ""
    assert out.stderr.split() == ("FATAL: container creation failed: mount hook function failure: mount "
                                  f"{source}->/data error: while mounting {source}: mount source {source} "
                                  "doesn't exist").split()


def test_singularity_bind_and_dash_b_combine(work: Path) -> None:
    for name in ("a", "b", "c"):
        (work / name).mkdir()
        (work / name / "id").write_text(name)
    out = inside("cat /mnt/a/id /opt/b/id /scratch/c/id", "-B", f"{work}/c:/scratch/c", cwd=work,
                 env={"SINGULARITY_BIND": f"{work}/a:/mnt/a,{work}/b:/opt/b:ro"})
    assert (out.returncode, out.stdout) == (0, "abc"), out.stderr


def test_containlibs_are_visible_on_ld_library_path(work: Path) -> None:
    lib = work / "libcxi.so.1"
    lib.write_text("not really a library")
    out = inside('cat /.singularity.d/libs/libcxi.so.1; echo; echo "$LD_LIBRARY_PATH"', cwd=work,
                 env={"SINGULARITY_CONTAINLIBS": str(lib)})
    assert out.returncode == 0, out.stderr
    content, ld_path = out.stdout.split("\n")[:2]
    assert content == "not really a library"
    assert "/.singularity.d/libs" in ld_path.split(":")


def test_missing_containlib_fails_clearly(work: Path) -> None:
    out = inside("echo ran", cwd=work, env={"SINGULARITY_CONTAINLIBS": f"{work}/libgone.so.7"})
    assert out.returncode == 255 and out.stdout == ""
    assert out.stderr.startswith("FATAL:")
    assert f"{work}/libgone.so.7" in out.stderr and "SINGULARITY_CONTAINLIBS" in out.stderr


def test_environment_passes_and_singularityenv_sets(work: Path) -> None:
    env = {"VCLOUD_HOST_VAR": "host", "SINGULARITYENV_VCLOUD_X": "from prefix",
           "PATH": "/nowhere:" + os.environ["PATH"]}
    script = 'echo "$VCLOUD_HOST_VAR|$VCLOUD_X|$VCLOUD_Y|$PATH|${SINGULARITYENV_VCLOUD_X:-unset}"'
    out = inside(script, "--env", "VCLOUD_Y=from flag", cwd=work, env=env)
    assert out.returncode == 0, out.stderr
    host, x, y, path, prefixed = out.stdout.strip().split("|")
    assert (host, x, y, prefixed) == ("host", "from prefix", "from flag", "unset")
    assert "/nowhere" not in path and "/usr/bin" in path.split(":")  # the container's PATH, as in Singularity


def test_cleanenv_starts_from_a_clean_environment(work: Path) -> None:
    script = 'echo "${VCLOUD_HOST_VAR:-unset}|$VCLOUD_X|${USER:-unset}|$HOME"'
    out = inside(script, "--cleanenv", cwd=work,
                 env={"VCLOUD_HOST_VAR": "host", "APPTAINERENV_VCLOUD_X": "kept"})
    assert out.returncode == 0, out.stderr
    host, x, user, home = out.stdout.strip().split("|")
    assert (host, x, user) == ("unset", "kept", "unset")
    assert home.startswith("/")


def test_pwd_sets_the_working_directory(work: Path) -> None:
    (work / "sub").mkdir()
    out = inside("pwd", "--pwd", "/code", "-B", f"{work}/sub:/code", cwd=REPO)
    assert (out.returncode, out.stdout.strip()) == (0, "/code"), out.stderr


def test_rocm_refused_with_sidecar_accepted_without(work: Path) -> None:
    sif = work / "lumi.sif"
    sif.symlink_to(IMAGE)
    accepted = inside("echo ran", "--rocm", cwd=work, image=sif)
    assert accepted.returncode == 0 and accepted.stdout == "ran\n", accepted.stderr
    assert accepted.stderr.count("--rocm") == 1 and "no host ROCm" in accepted.stderr

    breaks = "/usr/lib64/libdrm.so.2: version `GLIBC_2.33' not found (the container has GLIBC 2.31)\n"
    Path(f"{sif}.rocm-breaks").write_text(breaks)
    refused = inside("echo ran", "--rocm", cwd=work, image=sif)
    assert refused.returncode != 0 and refused.stdout == ""
    assert breaks.strip() in refused.stderr
    assert inside("echo ran", cwd=work, image=sif).stdout == "ran\n", "without --rocm the image still runs"


def test_missing_image_and_unknown_option_fail_clearly(work: Path) -> None:
    gone = work / "gone.sif"
    out = inside("echo ran", cwd=work, image=gone)
    assert out.returncode == 255 and str(gone) in out.stderr and out.stderr.startswith("FATAL:")
    out = inside("echo ran", "--fakeroot", cwd=work)
    assert out.returncode == 255 and "--fakeroot" in out.stderr
    for option in ("--bind", "--cleanenv", "--env", "--pwd", "--rocm", "--nv"):
        assert option in out.stderr
    out = singularity("build", "x.sif", "x.def", cwd=work)
    assert out.returncode == 255 and "exec" in out.stderr


@pytest.mark.parametrize("sig", [signal.SIGUSR2, signal.SIGTERM], ids=["USR2", "TERM"])
def test_signal_to_the_launcher_reaches_the_payload(work: Path, sig: signal.Signals) -> None:
    name = sig.name.removeprefix("SIG")
    # A short wait in a loop: bash misses a signal that lands between starting a job and `wait`.
    payload = f'trap "echo got {name}; exit 7" {name}; echo ready; while :; do sleep 0.2 & wait; done'
    # The shell prints its pid, then becomes the launcher: that pid is the one Slurm would signal.
    proc = subprocess.Popen([*_as_user(), "sh", "-c", 'echo $$; exec "$@"', "sh",
                             str(STANDIN), "exec", str(IMAGE), "bash", "-c", payload],
                            cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pid = int(proc.stdout.readline())
        assert proc.stdout.readline() == "ready\n"
        assert Path(f"/proc/{pid}/comm").read_text().strip() == "bash", "the launcher execs the payload"
        os.kill(pid, sig)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert (proc.returncode, out) == (7, f"got {name}\n"), err
