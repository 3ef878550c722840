"""Syncing the code to the cluster: rsync argv, anchored excludes, content hash and manifest.

The LUMI guide's costliest rsync lesson (seed 000): ``--exclude 'data'`` applies at every level,
silently leaves ``src/vcloud/data/`` behind, and the job dies on the cluster with
``ModuleNotFoundError: No module named 'vcloud.data'``. Here top-level excludes are anchored to
the transfer root (``/data``), and :func:`refuse_unanchored_excludes` refuses an unanchored
pattern that would match a directory deeper in the tree.

The same exclude rules feed :func:`code_hash`, a sha256 over the sorted relative paths and bytes
of exactly the files rsync transfers. It names the code's directory on the cluster, goes into the
manifest written there last and into every rendered job script, which refuses to start when the
manifest in its directory carries another hash or when the files there hash to another
(:mod:`vcloud.code_digest`, the one definition of the hash).
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import json
import os
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from vcloud.code_digest import digest_files

from vcloud_pipeline.plan.layout import MANIFEST_NAME

ARTIFACT_EXCLUDES = (
    "__pycache__/",
    "*.pyc",
    "core",
    "core.[0-9]*",
    "*.pt",
    "*.pth",
    "*.ckpt",
    ".venv/",
    "venv/",
    "*.egg-info/",
    ".pytest_cache/",
    ".mypy_cache/",
    ".ruff_cache/",
)
"""Unanchored on purpose: build artifacts, core dumps (a 1.1 GB ``core`` once blocked every git
push, seed 002) and checkpoints, wherever they appear. ``core.[0-9]*`` rather than ``core.*``,
which would also drop any module named ``core.py``."""

DEFAULT_EXCLUDES = ("/data", "/.git", "/.venv", "/venv", f"/{MANIFEST_NAME}") + ARTIFACT_EXCLUDES

DEFAULT_TOP_LEVEL = ("trainer",)
"""What of the project a job needs on the cluster: the trainer package and its configs."""


class ExcludeError(ValueError):
    """An exclude pattern that would silently leave code behind, or that we cannot mirror."""


# --------------------------------------------------------------------------- exclude rules


@dataclass(frozen=True)
class ExcludeRule:
    """The subset of rsync's exclude syntax that :func:`code_hash` mirrors exactly."""

    pattern: str

    def __post_init__(self) -> None:
        core = self.core
        if not core or "/" in core or "**" in core:
            raise ExcludeError(
                f"exclude {self.pattern!r} not supported: use a single name or glob, anchored to the "
                "transfer root with a leading '/' ('/data') or matching at every level ('__pycache__/'); "
                "a trailing '/' limits it to directories"
            )

    @property
    def anchored(self) -> bool:
        return self.pattern.startswith("/")

    @property
    def dir_only(self) -> bool:
        return self.pattern.endswith("/")

    @property
    def core(self) -> str:
        return self.pattern.strip("/")

    def matches(self, rel: PurePosixPath, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        if self.anchored and len(rel.parts) != 1:
            return False
        return fnmatch.fnmatchcase(rel.name, self.core)


def parse_excludes(excludes: Sequence[str]) -> tuple[ExcludeRule, ...]:
    return tuple(ExcludeRule(p) for p in excludes)


@dataclass(frozen=True)
class CodeTree:
    """The local tree to sync: ``root``, restricted to ``top_level`` entries, minus ``excludes``."""

    root: Path
    top_level: tuple[str, ...] | None = DEFAULT_TOP_LEVEL
    """Top-level entries to transfer; ``None`` transfers everything under ``root``."""
    excludes: tuple[str, ...] = DEFAULT_EXCLUDES

    def __post_init__(self) -> None:
        parse_excludes(self.excludes)
        for name in self.top_level or ():
            if not name or "/" in name or name in (".", ".."):
                raise ExcludeError(f"top-level entry {name!r} must be a single directory or file name")

    def rsync_filters(self) -> list[str]:
        """Filter options in rsync's first-match-wins order: excludes, then the top-level selection."""
        filters = [f"--exclude={p}" for p in self.excludes]
        if self.top_level is not None:
            filters += [f"--include=/{name}" for name in self.top_level]
            filters.append("--exclude=/*")
        return filters


def _entries(tree: CodeTree, rules: Sequence[ExcludeRule], *,
             keep_excluded: bool) -> Iterator[tuple[PurePosixPath, bool]]:
    """(relative path, is_dir) of the selected entries, never descending into excluded directories.

    With ``keep_excluded`` the excluded entries themselves are yielded too (for inspection).
    """
    top = set(tree.top_level) if tree.top_level is not None else None
    stack = [PurePosixPath()]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(tree.root / rel_dir) as scan:
            entries = sorted(scan, key=lambda e: e.name)
        for entry in entries:
            rel = rel_dir / entry.name
            if top is not None and len(rel.parts) == 1 and entry.name not in top:
                continue
            is_dir = entry.is_dir(follow_symlinks=False)
            excluded = any(rule.matches(rel, is_dir) for rule in rules)
            if not excluded or keep_excluded:
                yield rel, is_dir
            if is_dir and not excluded:
                stack.append(rel)


def refuse_unanchored_excludes(tree: CodeTree) -> None:
    """Raise :class:`ExcludeError` if an unanchored exclude would drop code deeper in the tree.

    Two ways that happens: a name that is meant for the top level (``data``) but also names a
    package directory further down, and an artifact glob that also matches a Python module
    (``core.*`` and ``core.py``). Artifact patterns may match directories at any depth.
    """
    rules = parse_excludes(tree.excludes)
    anchored = [r for r in rules if r.anchored]
    loose = [r for r in rules if not r.anchored]
    prune = anchored + [r for r in loose if r.pattern in ARTIFACT_EXCLUDES and r.dir_only]
    for rel, is_dir in _entries(tree, prune, keep_excluded=True):
        if any(r.matches(rel, is_dir) for r in anchored):
            continue
        for rule in loose:
            if not rule.matches(rel, is_dir):
                continue
            if is_dir and len(rel.parts) > 1 and rule.pattern not in ARTIFACT_EXCLUDES:
                module = ".".join(rel.parts[2:]) if rel.parts[:2] == ("trainer", "src") else rel.as_posix()
                raise ExcludeError(
                    f"exclude {rule.pattern!r} is not anchored: rsync applies it at every level, so it "
                    f"would also leave out {rel.as_posix()}/ and the job would fail on the cluster only, "
                    f"e.g. with \"ModuleNotFoundError: No module named '{module}'\" (seed 000). Anchor it "
                    f"to the transfer root: '/{rule.core}'"
                )
            if not is_dir and rel.suffix == ".py":
                raise ExcludeError(
                    f"exclude {rule.pattern!r} also matches the Python module {rel.as_posix()}, which "
                    f"would silently be missing on the cluster; use a narrower pattern "
                    f"(for core dumps: 'core' and 'core.[0-9]*')"
                )


# --------------------------------------------------------------------------- content hash and manifest


def tree_files(tree: CodeTree) -> list[PurePosixPath]:
    """Relative paths of the files (and symlinks) rsync transfers, sorted."""
    rules = parse_excludes(tree.excludes)
    files = [rel for rel, is_dir in _entries(tree, rules, keep_excluded=False) if not is_dir]
    return sorted(files, key=lambda p: p.as_posix())


def code_hash(root: Path, excludes: Sequence[str] = DEFAULT_EXCLUDES, *,
              top_level: Sequence[str] | None = DEFAULT_TOP_LEVEL) -> str:
    """sha256 hex over the sorted relative paths and contents of the files rsync transfers
    (:func:`vcloud.code_digest.digest_files`, which the job also runs over its code directory before
    the trainer starts). Symlinks contribute their target; modes and timestamps are left out.
    """
    tree = CodeTree(Path(root), tuple(top_level) if top_level is not None else None, tuple(excludes))
    return _hash_files(tree, tree_files(tree))


def _hash_files(tree: CodeTree, files: Sequence[PurePosixPath]) -> str:
    return digest_files(tree.root, files)


@dataclass(frozen=True)
class CodeManifest:
    """What was synced: written as ``.vcloud_manifest.json`` next to the code on the cluster."""

    hash: str
    files: int
    created_at: str

    def to_json(self) -> str:
        """One line, keys sorted: the job script reads the hash with ``sed``, not a JSON parser."""
        return json.dumps({"hash": self.hash, "files": self.files, "created_at": self.created_at},
                          sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "CodeManifest":
        try:
            data = json.loads(text)
            return cls(hash=str(data["hash"]), files=int(data["files"]), created_at=str(data["created_at"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a code manifest ({exc}): {text[:200]!r}") from exc


def build_manifest(tree: CodeTree, created_at: dt.datetime) -> CodeManifest:
    files = tree_files(tree)
    return CodeManifest(hash=_hash_files(tree, files), files=len(files),
                        created_at=created_at.astimezone(dt.timezone.utc).isoformat(timespec="seconds"))


# --------------------------------------------------------------------------- rsync argv


PROJECT_SHARED = ("--no-perms", "--omit-dir-times")
"""A project's members share its directories: what rsync creates is group-writable (the remote
rsync runs under umask 002, :func:`remote_rsync`; new directories inherit the setgid bit, so files
keep the project's group), and it never sets the permissions or times of what exists, which fails on
a directory another member created (rsync exit 23, "failed to set permissions on ...: Operation not
permitted"): a run's job scripts directory is the same for every member who triggers the run.
The permissions of what rsync creates are the ``chmod`` of :func:`rsync_argv`."""

SYNC_LOCK_WAIT = 900
"""Seconds a code sync waits for another writer of the same code to finish (:func:`remote_rsync`)."""


def remote_rsync(lock: PurePosixPath | str | None = None) -> str:
    """``--rsync-path``: the remote rsync under umask 002, and with ``lock`` under ``flock`` of that
    file, so that two writers of one directory (two deployments or two members syncing the same code
    at the same moment) take turns: a job checking its code never sees another writer's temporary
    files in a directory whose manifest already stands."""
    held = f"flock -w {SYNC_LOCK_WAIT} {shlex.quote(str(lock))} " if lock is not None else ""
    return f"--rsync-path=umask 002 && {held}rsync"

WRITABLE_WHILE_SYNCING = "ug+rwX"
"""A code tree while it arrives: made read-only (``vcloud_pipeline.code.upload``) once its manifest is written."""

READ_ONLY_FILES = "Dug+rwx,Fa-w,Fug+r"
"""Job scripts: read-only from the upload on (the inner script is also checked by its digest), in a
directory that stays group-writable, since every member who triggers the run adds scripts to it."""


def rsync_argv(source_dir: Path, destination: str, remote_dir: PurePosixPath | str,
               ssh_command: Sequence[str], *, filters: Sequence[str] = (), delete: bool = True,
               chmod: str = WRITABLE_WHILE_SYNCING, lock: PurePosixPath | str | None = None) -> list[str]:
    """``rsync -az [--delete] -e "ssh ..." <PROJECT_SHARED> --rsync-path=... --chmod=<chmod> <filters> source_dir/ destination:remote_dir/``.

    ``ssh_command`` and ``destination`` come from the cluster's connection
    (``SlurmHook.ssh_command()``), so rsync logs in exactly as the Slurm commands do.
    ``-s`` keeps the remote path away from the remote shell, so paths with spaces arrive intact.
    """
    if not ssh_command:
        raise ValueError("ssh_command must name the ssh client and its options, e.g. ['ssh', '-p', '2222']")
    argv = ["rsync", "-az", "-s"]
    if delete:
        argv.append("--delete")
    argv += ["-e", shlex.join(ssh_command), *PROJECT_SHARED, remote_rsync(lock), f"--chmod={chmod}", *filters]
    argv += [f"{str(source_dir).rstrip('/')}/", f"{destination}:{str(remote_dir).rstrip('/')}/"]
    return argv


def code_sync_argv(tree: CodeTree, destination: str, remote_code_dir: PurePosixPath | str,
                   ssh_command: Sequence[str], *, basis: str | None = None,
                   lock: PurePosixPath | str | None = None) -> list[str]:
    """Mirror the code tree into its hash's code directory (``--delete``: removed files go too).

    The manifest is excluded (``/.vcloud_manifest.json``), so ``--delete`` leaves it in place
    until the new one is uploaded after the transfer. ``basis`` names a sibling code directory
    (another hash) whose unchanged files rsync copies on the cluster instead of sending them
    (``--copy-dest``: copies, not hard links, so no two code directories share a file that an
    edit in one would change in both). ``lock``: the file whose ``flock`` the remote rsync holds
    (:func:`remote_rsync`).
    """
    if f"/{MANIFEST_NAME}" not in tree.excludes:
        raise ExcludeError(f"the code tree must exclude '/{MANIFEST_NAME}' so that rsync --delete "
                           "keeps the manifest on the cluster")
    filters = tree.rsync_filters()
    if basis is not None:
        if not basis or "/" in basis or basis in (".", ".."):
            raise ValueError(f"basis {basis!r} must name a sibling code directory")
        filters = [f"--copy-dest=../{basis}", *filters]
    return rsync_argv(tree.root, destination, remote_code_dir, ssh_command, filters=filters, lock=lock)


def scripts_sync_argv(local_jobs_dir: Path, destination: str, remote_jobs_dir: PurePosixPath | str,
                      ssh_command: Sequence[str]) -> list[str]:
    """Upload rendered job scripts, read-only (:data:`READ_ONLY_FILES`); never ``--delete``: scripts of
    queued jobs must stay."""
    return rsync_argv(local_jobs_dir, destination, remote_jobs_dir, ssh_command, delete=False,
                      chmod=READ_ONLY_FILES)
