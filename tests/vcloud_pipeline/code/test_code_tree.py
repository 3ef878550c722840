"""Code sync: exclude rules mirrored exactly (checked against real rsync), refusals, hash, argv."""

from __future__ import annotations

import datetime as dt
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path, PurePosixPath

import pytest

from slurm_provider.transport import OpenSSHTarget
from vcloud.code_digest import synced_tree_hash
from vcloud_pipeline.plan.layout import MANIFEST_NAME, run_paths
from vcloud_pipeline.profile import load_profile
from vcloud_pipeline.jobs.render import TEMPLATES_DIR
from vcloud_pipeline.code.tree import (
    DEFAULT_EXCLUDES,
    CodeManifest,
    CodeTree,
    ExcludeError,
    build_manifest,
    code_hash,
    code_sync_argv,
    refuse_unanchored_excludes,
    scripts_sync_argv,
    tree_files,
)

FILES = {
    "trainer/src/vcloud/__init__.py": "VERSION = 1\n",
    "trainer/src/vcloud/data/__init__.py": "",
    "trainer/src/vcloud/data/dataset.py": "class SeriesDataset: ...\n",
    "trainer/src/vcloud/models/core_blocks.py": "x = 1\n",
    "trainer/configs/model_tiny.yaml": "train: {}\n",
    "trainer/src/vcloud/__pycache__/__init__.cpython-311.pyc": "bytecode",
    "trainer/core": "a core dump",
    "trainer/core.4711": "another core dump",
    "trainer/outputs/stage0/best.pt": "weights",
    "trainer/.venv/lib/site.py": "venv",
    "trainer/vcloud.egg-info/PKG-INFO": "meta",
    "data/raw/series.tif": "top-level data",
    "data/README": "top-level data",
    ".git/HEAD": "ref: refs/heads/main",
    ".venv/bin/python": "interpreter",
    "plugins/vcloud_pipeline/jobs/render.py": "not needed on the cluster",
    MANIFEST_NAME: '{"hash": "old"}',
}


def make_tree(root: Path, files: dict[str, str] = FILES) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def real_rsync_files(tree: CodeTree, dest: Path) -> list[str]:
    """What rsync itself transfers with the tree's filters (local copy, same filter engine)."""
    subprocess.run(["rsync", "-a", *tree.rsync_filters(), f"{tree.root}/", f"{dest}/"], check=True)
    return sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file() or p.is_symlink())


@pytest.mark.parametrize("top_level", [("trainer",), None])
def test_hashed_files_are_exactly_what_rsync_transfers(tmp_path: Path, top_level: tuple[str, ...] | None) -> None:
    tree = CodeTree(make_tree(tmp_path / "src"), top_level=top_level)
    ours = [p.as_posix() for p in tree_files(tree)]
    assert ours == real_rsync_files(tree, tmp_path / "dst")
    assert "trainer/src/vcloud/data/dataset.py" in ours
    assert "trainer/src/vcloud/models/core_blocks.py" in ours
    for left_out in ("trainer/core", "trainer/core.4711", "trainer/outputs/stage0/best.pt", "data/README",
                     ".git/HEAD", MANIFEST_NAME, "trainer/.venv/lib/site.py"):
        assert left_out not in ours
    assert not any("__pycache__" in p or "egg-info" in p for p in ours)
    assert ("plugins/vcloud_pipeline/jobs/render.py" in ours) is (top_level is None)


def test_unanchored_data_exclude_is_refused_with_the_seeds_explanation(tmp_path: Path) -> None:
    tree = CodeTree(make_tree(tmp_path), excludes=("data", ".git") + DEFAULT_EXCLUDES[2:])
    with pytest.raises(ExcludeError) as err:
        refuse_unanchored_excludes(tree)
    message = str(err.value)
    assert "exclude 'data' is not anchored" in message
    assert "trainer/src/vcloud/data/" in message
    assert "ModuleNotFoundError: No module named 'vcloud.data'" in message
    assert "'/data'" in message
    # and rsync really would have dropped the module: the refusal is not hypothetical
    assert "trainer/src/vcloud/data/dataset.py" not in real_rsync_files(tree, tmp_path / "dst")


def test_unanchored_name_that_exists_only_at_the_top_is_accepted(tmp_path: Path) -> None:
    make_tree(tmp_path, {"trainer/src/vcloud/__init__.py": "", "scratch/x": ""})
    refuse_unanchored_excludes(CodeTree(tmp_path, top_level=None, excludes=("scratch",) + DEFAULT_EXCLUDES))


def test_default_excludes_pass_on_the_real_project() -> None:
    root = Path(__file__).resolve().parents[3]
    refuse_unanchored_excludes(CodeTree(root))
    assert any(p.as_posix() == "trainer/src/vcloud/data/__init__.py" for p in tree_files(CodeTree(root)))


def test_core_glob_that_matches_a_module_is_refused(tmp_path: Path) -> None:
    make_tree(tmp_path, {"trainer/src/vcloud/core.py": "x = 1\n"})
    refuse_unanchored_excludes(CodeTree(tmp_path))  # the default core.[0-9]* leaves core.py alone
    with pytest.raises(ExcludeError, match=r"'core\.\*' also matches the Python module trainer/src/vcloud/core.py"):
        refuse_unanchored_excludes(CodeTree(tmp_path, excludes=("core.*",)))


@pytest.mark.parametrize("pattern", ["src/data", "**/data", "/", ""])
def test_patterns_the_hash_cannot_mirror_are_refused(tmp_path: Path, pattern: str) -> None:
    with pytest.raises(ExcludeError, match="not supported"):
        CodeTree(tmp_path, excludes=(pattern,))


def test_hash_is_stable_across_copies_and_timestamps(tmp_path: Path) -> None:
    a = make_tree(tmp_path / "a")
    first = code_hash(a)
    assert re.fullmatch(r"[0-9a-f]{64}", first)
    assert code_hash(a) == first
    b = tmp_path / "b"
    shutil.copytree(a, b)
    os.utime(b / "trainer/src/vcloud/__init__.py", (0, 0))
    assert code_hash(b) == first


@pytest.mark.parametrize(
    ("change", "same"),
    [
        (lambda r: (r / "trainer/src/vcloud/data/dataset.py").write_text("class SeriesDataset: pass\n"), False),
        (lambda r: (r / "trainer/configs/model_tiny.yaml").rename(r / "trainer/configs/model_small.yaml"), False),
        (lambda r: (r / "trainer/src/vcloud/data/new.py").write_text(""), False),
        (lambda r: (r / "trainer/src/vcloud/data/dataset.py").unlink(), False),
        (lambda r: (r / "trainer/src/vcloud/__pycache__/x.pyc").write_text("other"), True),
        (lambda r: (r / "trainer/core.99").write_text("dump"), True),
        (lambda r: (r / "data/more.tif").write_text("data"), True),
        (lambda r: (r / "plugins/x.py").write_text("dag code"), True),
        (lambda r: (r / MANIFEST_NAME).write_text("{}"), True),
    ],
)
def test_hash_sees_code_changes_and_ignores_excluded_files(tmp_path: Path, change, same: bool) -> None:
    root = make_tree(tmp_path)
    before = code_hash(root)
    change(root)
    assert (code_hash(root) == before) is same


def test_hash_separates_path_from_content(tmp_path: Path) -> None:
    a = make_tree(tmp_path / "a", {"trainer/ab": "c"})
    b = make_tree(tmp_path / "b", {"trainer/a": "bc"})
    assert code_hash(a) != code_hash(b)


def test_manifest_round_trip_and_the_job_scripts_reader(tmp_path: Path) -> None:
    tree = CodeTree(make_tree(tmp_path / "src"))
    manifest = build_manifest(tree, dt.datetime(2026, 2, 16, 12, 0, tzinfo=dt.timezone.utc))
    assert manifest.hash == code_hash(tree.root) and manifest.files == len(tree_files(tree))
    assert manifest.created_at == "2026-02-16T12:00:00+00:00"
    text = manifest.to_json()
    assert CodeManifest.from_json(text) == manifest
    with pytest.raises(ValueError, match="not a code manifest"):
        CodeManifest.from_json('{"files": 1}')
    # the outer job script reads the hash with sed, without Python: use its own line
    outer = (TEMPLATES_DIR / "outer.sbatch").read_text()
    sed = next(line for line in outer.splitlines() if line.startswith("synced_hash="))
    path = tmp_path / "manifest.json"
    path.write_text(text)
    probe = f'CODE_MANIFEST={path}; {sed}; printf %s "$synced_hash"'
    assert subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout == manifest.hash


def test_lumi_code_sync_argv() -> None:
    lumi = load_profile("lumi")
    tree = CodeTree(Path("/home/me/vcloud"))
    # the ssh of LUMI's openssh connection: the alias's own ControlMaster, never a ControlPath of ours
    ssh = OpenSSHTarget(alias="lumi2").client_argv(log_file="/tmp/ssh.log", known_hosts=None)
    argv = code_sync_argv(tree, "lumi2", run_paths(lumi, "full").code("e" * 64).dir, ssh)
    assert argv[:4] == ["rsync", "-az", "-s", "--delete"]
    assert argv[4:6] == ["-e", "ssh -E /tmp/ssh.log -x -a -o BatchMode=yes -o LogLevel=ERROR "
                               "-o ConnectTimeout=10 -o ClearAllForwardings=yes"]
    assert argv[6:10] == ["--no-perms", "--omit-dir-times", "--rsync-path=umask 002 && rsync", "--chmod=ug+rwX"], \
        "the project's members share what it writes (until the sync makes it read-only)"
    assert "--exclude=/data" in argv and "--exclude=/.git" in argv and "--exclude=/.venv" in argv
    assert "--exclude=__pycache__/" in argv and "--exclude=core" in argv and "--exclude=*.pt" in argv
    assert argv.index("--include=/trainer") < argv.index("--exclude=/*")
    assert argv[-2:] == ["/home/me/vcloud/", f"lumi2:/scratch/project_465002500/vcloud/code/{'e' * 64}/"]
    assert not any(a.startswith("--copy-dest") for a in argv)


def test_the_remote_rsync_of_a_code_sync_holds_the_directorys_lock(tmp_path: Path) -> None:
    paths = run_paths(load_profile("lumi", overrides={"paths.base": "/scratch/my project/vcloud"}), "full")
    lock = paths.code_sync_lock("e" * 64)
    assert lock == PurePosixPath(f"/scratch/my project/vcloud/code/.{'e' * 64}.sync-lock")
    argv = code_sync_argv(CodeTree(tmp_path), "h", paths.code("e" * 64).dir, ["ssh"], lock=lock)
    # The remote shell runs it: the lock's path is one word there, spaces and all.
    [remote] = [a for a in argv if a.startswith("--rsync-path=")]
    assert remote == f"--rsync-path=umask 002 && flock -w 900 '{lock}' rsync"
    assert shlex.split(remote.split("=", 1)[1].split("&& ", 1)[1]) == ["flock", "-w", "900", str(lock), "rsync"]


def test_a_new_code_directory_copies_unchanged_files_from_its_sibling(tmp_path: Path) -> None:
    argv = code_sync_argv(CodeTree(tmp_path), "h", f"/x/code/{'e' * 64}", ["ssh"], basis="d" * 64)
    assert f"--copy-dest=../{'d' * 64}" in argv and "--link-dest" not in " ".join(argv)
    assert argv.index(f"--copy-dest=../{'d' * 64}") < argv.index("--exclude=/data")
    for bad in ("", "..", "a/b"):
        with pytest.raises(ValueError, match="sibling code directory"):
            code_sync_argv(CodeTree(tmp_path), "h", "/x", ["ssh"], basis=bad)


def test_scripts_sync_never_deletes_and_the_manifest_is_protected(tmp_path: Path) -> None:
    argv = scripts_sync_argv(Path("/tmp/jobs"), "vcloud-local", PurePosixPath("/srv/jobs/full"), ["ssh"])
    assert "--delete" not in argv and argv[-1] == "vcloud-local:/srv/jobs/full/"
    with pytest.raises(ExcludeError, match="keeps the manifest"):
        code_sync_argv(CodeTree(tmp_path, excludes=("/data",)), "h", "/x", ["ssh"])


def test_the_job_hashes_a_synced_tree_as_the_sync_named_it(tmp_path: Path) -> None:
    """One definition (vcloud.code_digest): what the sync sends hashes on the cluster, next to its manifest
    and the bytecode directories older jobs wrote, to the hash that names its directory."""
    repo = Path(__file__).resolve().parents[3]
    tree = CodeTree(repo)
    synced = tmp_path / "synced"
    for rel in tree_files(tree):
        (synced / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / rel, synced / rel, follow_symlinks=False)
    (synced / MANIFEST_NAME).write_text("{}\n")
    (synced / "trainer" / "src" / "vcloud" / "__pycache__").mkdir(exist_ok=True)
    (synced / "trainer" / "src" / "vcloud" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"")
    assert synced_tree_hash(synced) == code_hash(repo)
    (synced / "trainer" / "extra.txt").write_text("")
    assert synced_tree_hash(synced) != code_hash(repo)
