"""File operations on the login node that a workflow needs besides Slurm's own verbs: make
directories, write a file atomically, list a tree, check a path, keep records of who uses what,
list and remove versioned directories. Each builder returns one POSIX ``sh`` command line with every
path :func:`shlex.quote`-d; each parser reads back exactly what its command prints.

What is created is group-writable (``umask 002``): a project's members share its directories, and
inside a setgid project directory new entries keep the project's group.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from slurm_provider.cli.values import SlurmOutputError

SHARED_UMASK = "umask 002"
"""A project's members share its directories: what is created there is group-writable."""

Path = PurePosixPath | str


def _q(path: Path) -> str:
    return shlex.quote(str(path))


def _absolute(paths: Sequence[Path]) -> list[str]:
    texts = [str(p) for p in paths]
    for text in texts:
        if not text.startswith("/") or "\n" in text or "\0" in text:
            raise ValueError(f"path {text!r} must be absolute, on one line")
    return texts


def build_make_dirs(directories: Sequence[Path]) -> str:
    """``mkdir -p`` of every directory, group-writable."""
    return f"{SHARED_UMASK}; mkdir -p -- {' '.join(map(shlex.quote, _absolute(directories)))}"


def build_write_file(path: Path) -> str:
    """Write stdin to ``path`` atomically: a temp file ``mktemp`` creates exclusively in the same
    directory (a name nobody can foresee: a link another member of a group-writable directory planted
    is never followed), readable by all, then a rename. The file's mtime is set after the rename, so it
    is not older than its directory's (a manifest written last relies on being the newest entry of its
    tree). Two writers of one file at once each rename their own temp file."""
    target = _q(path)
    template = shlex.quote(f"{path}.XXXXXX")
    return (f"{SHARED_UMASK}; tmp=\"$(mktemp {template})\" || exit 1; "
            f"if cat > \"$tmp\" && chmod 0644 \"$tmp\" && mv -f -- \"$tmp\" {target}; "
            f"then touch -c -- {target}; else rm -f -- \"$tmp\"; exit 1; fi")


def build_path_exists(path: Path) -> str:
    return f"test -e {_q(path)}"


def build_readable(path: Path, *, directory: bool = False) -> str:
    """Exit 0 when ``path`` is readable (and a directory, with ``directory``)."""
    return f"test -d {_q(path)} && test -r {_q(path)}" if directory else f"test -r {_q(path)}"


def build_command_exists(program: str) -> str:
    return f"command -v {shlex.quote(program)}"


def build_list_files(root: Path, depth: int = 3) -> str:
    """``<size> <relative path>`` of every file under ``root`` (down to ``depth``), sorted; nothing
    when ``root`` does not exist."""
    return (f"if [ -d {_q(root)} ]; then cd {_q(root)} && "
            f"find . -maxdepth {int(depth)} -type f -printf '%s %P\\n' | LC_ALL=C sort -k2; fi")


def parse_list_files(stdout: str) -> list[tuple[str, int]]:
    rows = []
    for text in stdout.splitlines():
        size, _, rel = text.partition(" ")
        if size.isdigit() and rel:
            rows.append((rel, int(size)))
    return rows


NEWER_MARK = "__SLURM_PROVIDER_NEWER_THAN__"


def build_read_if_unchanged(file: Path, tree: Path, needle: str) -> str:
    """Print ``file``, a mark, and the first entry under ``tree`` newer than ``file`` (an empty line if
    none); when nothing is newer and ``file`` contains ``needle``, touch it (it stays the newest; only
    its owner can touch a read-only file, and the answer is the same when that fails). Prints nothing
    when ``file`` does not exist."""
    f, t = _q(file), _q(tree)
    return (f"[ -f {f} ] || exit 0; cat {f}; echo; echo {NEWER_MARK}; "
            f"newer=\"$(find {t} -newer {f} -print -quit)\"; printf '%s\\n' \"$newer\"; "
            f"if [ -z \"$newer\" ] && grep -qF {shlex.quote(needle)} {f}; "
            f"then touch -c -- {f} 2>/dev/null || true; fi")


def parse_read_if_unchanged(stdout: str) -> tuple[str, bool] | None:
    """(the file's text, whether nothing under the tree is newer), or None when the file is missing."""
    if NEWER_MARK not in stdout:
        return None
    text, _, newer = stdout.partition(NEWER_MARK)
    return text, not newer.strip()


@dataclass(frozen=True)
class DirInventory:
    """The directories under a root, as the login node sees them, on its clock."""

    now: float
    """The login node's clock when it listed them."""
    dirs: dict[str, float] = field(default_factory=dict)
    """Directory name -> ctime (the last time an entry was created or removed in it)."""
    marked: dict[str, float] = field(default_factory=dict)
    """Directory name -> mtime of its marker file, for those that have one."""
    records: dict[str, float] = field(default_factory=dict)
    """File name -> mtime of each file in the records directory."""


def build_dir_inventory(root: Path, marker: str, records: Path) -> str:
    """The login node's clock, every directory under ``root`` with its ctime, the file ``marker`` in
    each with its mtime, and every file in ``records`` with its mtime (ages are measured on the
    cluster's clock, not the caller's)."""
    return (f"echo \"now $(date +%s)\"; [ -d {_q(root)} ] || exit 0; "
            f"find {_q(root)} -mindepth 1 -maxdepth 1 -type d -printf 'dir %C@ %f\\n'; "
            f"find {_q(root)} -mindepth 2 -maxdepth 2 -type f -name {shlex.quote(marker)} "
            f"-printf 'manifest %T@ %h\\n'; "
            f"[ -d {_q(records)} ] || exit 0; find {_q(records)} -mindepth 1 -maxdepth 1 -type f -printf 'run %T@ %f\\n'")


def parse_dir_inventory(stdout: str) -> DirInventory:
    """What :func:`build_dir_inventory` printed; lines it did not print are ignored."""
    dirs: dict[str, float] = {}
    marked: dict[str, float] = {}
    records: dict[str, float] = {}
    now: float | None = None
    for line in stdout.splitlines():
        kind, _, rest = line.partition(" ")
        stamp, _, name = rest.partition(" ")
        try:
            when = float(stamp)
        except ValueError:
            continue
        if kind == "now":
            now = when
        elif kind == "dir":
            dirs[name] = when
        elif kind == "manifest":
            marked[PurePosixPath(name).name] = when
        elif kind == "run":
            records[name] = when
    if now is None:
        raise SlurmOutputError(f"the directory listing lacks the login node's clock: {stdout[:200]!r}")
    return DirInventory(now=now, dirs=dirs, marked=marked, records=records)


def build_remove_dirs(renames: Sequence[tuple[Path, Path]], leftovers: Sequence[Path] = (),
                      record_files: Sequence[Path] = ()) -> str | None:
    """Delete ``record_files``; rename each directory to its hidden name first, then delete it (nothing ever
    sees half of one); delete ``leftovers`` (renamed by a removal that did not finish). Only the
    caller's own directories go: a tree made read-only (:func:`build_make_read_only`) is given back its
    owner's write permission first, and another member's is left to that member. None when there is
    nothing to do."""
    if not renames and not leftovers and not record_files:
        return None
    parts = [f"rm -f -- {_q(path)}" for path in record_files]
    parts += [f"if [ -O {_q(src)} ]; then mv -T -- {_q(src)} {_q(dst)} && {_remove_tree(dst)}; fi" for src, dst in renames]
    parts += [f"if [ -O {_q(path)} ]; then {_remove_tree(path)}; fi" for path in leftovers]
    return "set -e; " + "; ".join(parts)


def _remove_tree(path: Path) -> str:
    return f"{{ chmod -R u+w -- {_q(path)} 2>/dev/null; rm -rf -- {_q(path)}; }}"


def build_make_read_only(paths: Sequence[Path]) -> str:
    """Take write permission from everyone (owner, group, others) on every file and directory of the
    caller's under each path: what a sync or an install finished writing stays as it was, while the
    directory that holds it keeps its own permissions (group-writable: members still add new
    siblings). What another member wrote there is theirs to change (chmod would be refused)."""
    quoted = " ".join(map(shlex.quote, _absolute(paths)))
    return f"find {quoted} \\( -type f -o -type d \\) -user \"$(id -u)\" -perm /222 -exec chmod a-w -- {{}} +"


def build_make_owner_writable(paths: Sequence[Path]) -> str:
    """Give the owner back write permission under each path that exists and is the caller's (before
    its owner writes into a tree made read-only again); what is not the caller's is left alone."""
    quoted = " ".join(map(shlex.quote, _absolute(paths)))
    return f"for p in {quoted}; do if [ -O \"$p\" ]; then chmod -R u+w -- \"$p\"; fi; done; true"


def build_replace_record(directory: Path, name: str, text: str, prefix: str) -> str:
    """Write ``<directory>/<name>`` (group-writable, as every file and directory these commands create)
    holding ``text`` (whole, in a temp file ``mktemp`` creates exclusively, then renamed into place) and
    remove the other records of ``directory`` whose names start with ``prefix``."""
    record = f"{directory}/{name}"
    template = shlex.quote(f"{directory}/.{name}.XXXXXX")
    return (f"{SHARED_UMASK}; set -e; mkdir -p {_q(directory)}; tmp=\"$(mktemp {template})\"; "
            f"trap 'rm -f -- \"$tmp\"' EXIT; printf '%s\\n' {shlex.quote(text)} > \"$tmp\"; chmod 0664 \"$tmp\"; "
            f"for old in {_q(directory)}/{_glob_prefix(prefix)}*; do [ \"$old\" = {_q(record)} ] || rm -f -- \"$old\"; done; "
            f"mv -f -- \"$tmp\" {_q(record)}")


def build_touch_record(directory: Path, name: str) -> str:
    """Refresh (or create) ``<directory>/<name>``."""
    return f"{SHARED_UMASK}; mkdir -p {_q(directory)} && touch -- {_q(f'{directory}/{name}')}"


def build_remove_records(directory: Path, prefix: str) -> str:
    """Remove the records of ``directory`` whose names start with ``prefix``."""
    return f"rm -f -- {_q(directory)}/{_glob_prefix(prefix)}*"


def _glob_prefix(prefix: str) -> str:
    if not prefix or any(c in prefix for c in "*?[]/\\ '\"$`\n"):
        raise ValueError(f"record prefix {prefix!r} must be a plain file name prefix")
    return prefix
