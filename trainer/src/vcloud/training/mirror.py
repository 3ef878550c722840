"""Copy a stage's files from node-local disk to shared storage at every checkpoint.

Why: where jobs train on node-local disk (the profile's ``staging.stage_outputs``, Cosmos), the job
script copies the outputs back to shared storage only when the job step ends or on the pre-timeout
signal. A node that fails takes its disk, and everything the job trained, with it. So the trainer
(global rank 0, the only writer of checkpoints) copies its stage directory to the run's shared
output directory, which the job script names in :data:`vcloud.contract.OUTPUTS_MIRROR_ENV`, right
after each checkpoint and the progress marker that describes it. A node failure then loses at most
the checkpoint interval: the requeued job stages the copy back to its node and resumes from it.

The shared copy is usable at every instant, wherever a pass stops (failure, or the node dying):

- each file is written to a temporary ``.<name>.<random>.mirror.tmp`` in its target directory,
  fsync'ed, given the source's modification time and renamed over the target (atomic within a file
  system), then the directory is fsync'ed: no part of a file ever appears under its real name.
  (Temporaries match ``.*.tmp``, which the job script's rsync never copies.)
- the files go in an order that keeps the directory consistent: first the files the trainer
  deleted (a stale ``COMPLETE``), then ``best.pt`` and everything else, then ``latest.prev.pt``,
  ``latest.pt``, ``progress.json`` and ``COMPLETE`` last. A marker never gets ahead of the
  checkpoint it describes, ``best.pt`` never lags the ``latest.pt`` that records it, and the first
  failure ends the pass. The shared ``latest.pt`` is replaced in one rename, so
  :func:`vcloud.checkpoint.load_latest` always finds a whole checkpoint there.
- a stage directory the trainer moved aside (``--restart``) is moved aside on the shared side too,
  under the same name, before anything is copied: old and new generations never mix.

Only what changed is copied. Like ``rsync -a`` (which staged the files in at job start), a target
with the source's size and modification time is up to date; small files (markers) are compared byte
for byte too, as they can be rewritten at the same size within the file system's clock tick. The new
``latest.prev.pt`` is the shared side's current ``latest.pt``: it is hard-linked there, not copied
again (copied where the file system refuses links).

A failed pass is logged as an error and the next checkpoint copies whatever is out of date then;
training goes on. The job script's copy-back at the end of the job stays. Standard library only.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from vcloud import contract
from vcloud.durable import fsync_dir, previous_generation

log = logging.getLogger(__name__)

TEMP_SUFFIX = ".mirror.tmp"
"""Suffix of the temporaries a pass writes (and of stale ones it removes) on the shared side."""

SMALL_FILE_BYTES = 1 << 20
"""Files up to this size are also compared by content before they count as up to date."""

_COPY_CHUNK = 16 << 20
_REPLACED_MARK = ".replaced-"  # vcloud.training.loop.move_stage_aside: stage{N}.replaced-<stamp>[-n]

# Copy order (see the module docstring); files not named here go first, deletions in reverse.
_LAST = (previous_generation(Path(contract.LATEST_CHECKPOINT)).name,
         contract.LATEST_CHECKPOINT, contract.PROGRESS_FILE, contract.COMPLETE_FILE)


@dataclass
class MirrorReport:
    """What one pass did, in order; paths relative to the stage directory."""

    moved_aside: str | None = None
    """The name the shared stage directory was moved aside to, as the trainer did locally."""
    removed: list[str] = field(default_factory=list)
    linked: list[str] = field(default_factory=list)
    """Files already on the shared side under another name, hard-linked there."""
    copied: list[str] = field(default_factory=list)
    bytes_copied: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.moved_aside or self.removed or self.linked or self.copied)


def mirror_root(env: Mapping[str, str] = os.environ) -> Path | None:
    """The shared run directory from :data:`~vcloud.contract.OUTPUTS_MIRROR_ENV`; None when unset."""
    raw = env.get(contract.OUTPUTS_MIRROR_ENV, "").strip()
    return Path(raw) if raw else None


def mirror_after_checkpoint(run_dir: Path, stage: int,
                            env: Mapping[str, str] = os.environ) -> MirrorReport | None:
    """Bring the shared copy of ``run_dir``'s stage directory up to date, if the job asked for one.

    Call on global rank 0 after a checkpoint and its progress marker are written. Never raises: a
    failure is logged as an error and retried by the next call. None when no mirror is configured
    or the pass failed."""
    root = mirror_root(env)
    if root is None:
        return None
    started = time.monotonic()
    try:
        report = mirror_stage(Path(run_dir), stage, root)
    except Exception as exc:  # never let a copy to shared storage stop training
        log.error("copying stage %d from %s to %s failed (%s: %s); training goes on and the next checkpoint "
                  "retries, but until a copy succeeds a node failure loses everything trained since the "
                  "last one",
                  stage, run_dir, root, type(exc).__name__, exc, exc_info=not isinstance(exc, OSError))
        return None
    if report.changed:
        megabytes = report.bytes_copied / 1e6
        parts = [f"copied {', '.join(report.copied)} ({megabytes:.1f} MB)" if report.copied else "",
                 f"linked {', '.join(report.linked)}" if report.linked else "",
                 f"removed {', '.join(report.removed)}" if report.removed else "",
                 f"moved the old stage directory aside to {report.moved_aside}" if report.moved_aside else ""]
        log.info("stage %d mirrored to %s: %s in %.1f s", stage, root / contract.stage_dir_name(stage),
                 "; ".join(p for p in parts if p), time.monotonic() - started)
    return report


def mirror_stage(run_dir: Path, stage: int, root: Path) -> MirrorReport:
    """One pass: make ``root/stage{N}`` hold what ``run_dir/stage{N}`` holds (see the module
    docstring for the order and atomicity). Raises ``OSError`` when a step fails; what was done
    until then is consistent."""
    name = contract.stage_dir_name(stage)
    source, target = run_dir / name, root / name
    report = MirrorReport()
    if not source.is_dir() or (target.exists() and os.path.samefile(source, target)):
        return report
    root.mkdir(parents=True, exist_ok=True)
    report.moved_aside = _mirror_move_aside(source, target)
    target.mkdir(exist_ok=True)
    ours = _regular_files(source)
    theirs = _regular_files(target, remove_stale=True)

    for rel in sorted(set(theirs) - set(ours), key=_order, reverse=True):
        if not Path(rel).name.startswith("."):  # others' temporaries (rsync's) are not ours to delete
            (target / rel).unlink(missing_ok=True)
            fsync_dir((target / rel).parent)
            report.removed.append(rel)
    theirs = {rel: st for rel, st in theirs.items() if rel not in report.removed}

    replaced: set[str] = set()
    for rel in sorted(ours, key=_order):
        src, dst = source / rel, target / rel
        if rel in theirs and _up_to_date(src, ours[rel], dst, theirs[rel]):
            continue
        if _link_existing_copy(rel, ours[rel], target, theirs, replaced):
            report.linked.append(rel)
        else:
            report.bytes_copied += copy_atomically(src, dst)
            report.copied.append(rel)
        replaced.add(rel)
    return report


def copy_atomically(src: Path, dst: Path) -> int:
    """Copy ``src`` to ``dst`` through a fsync'ed temporary beside ``dst`` and one rename, keeping its
    mode and modification time; returns the bytes copied. ``dst`` is the old file or the new one,
    whole, at every instant; the temporary is removed when the copy fails."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=TEMP_SUFFIX)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, open(src, "rb") as data:
            src_stat = os.fstat(data.fileno())
            os.fchmod(out.fileno(), stat.S_IMODE(src_stat.st_mode))
            shutil.copyfileobj(data, out, _COPY_CHUNK)
            out.flush()
            os.fsync(out.fileno())
        os.utime(tmp, ns=(src_stat.st_atime_ns, src_stat.st_mtime_ns))
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(dst.parent)
    return src_stat.st_size


# ---- pieces -----------------------------------------------------------------------------------

def _order(rel: str) -> tuple[int, str]:
    """Sort key: everything else first, then resume point and markers in the order of ``_LAST``."""
    top_level = "/" not in rel
    return (_LAST.index(rel) + 1 if top_level and rel in _LAST else 0, rel)


def _is_temporary(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def _regular_files(directory: Path, *, remove_stale: bool = False) -> dict[str, os.stat_result]:
    """Regular files under ``directory`` by relative path, temporaries left out; with
    ``remove_stale``, this module's own temporaries (left by a pass that was killed) are deleted."""
    found: dict[str, os.stat_result] = {}
    for folder, _dirs, names in os.walk(directory):
        for name in names:
            path = Path(folder) / name
            if _is_temporary(name):
                if remove_stale and name.endswith(TEMP_SUFFIX):
                    path.unlink(missing_ok=True)
                continue
            st = path.lstat()
            if stat.S_ISREG(st.st_mode):
                found[path.relative_to(directory).as_posix()] = st
    return found


def _up_to_date(src: Path, src_stat: os.stat_result, dst: Path, dst_stat: os.stat_result) -> bool:
    if (src_stat.st_size, src_stat.st_mtime_ns) != (dst_stat.st_size, dst_stat.st_mtime_ns):
        return False
    return src_stat.st_size > SMALL_FILE_BYTES or src.read_bytes() == dst.read_bytes()


def _link_existing_copy(rel: str, src_stat: os.stat_result, target: Path, theirs: dict[str, os.stat_result],
                        replaced: set[str]) -> bool:
    """Put ``rel`` in place as a hard link to a shared file that already holds it (``latest.prev.pt``
    is the previous ``latest.pt``), through a temporary and a rename. False when there is none or
    the file system refuses links."""
    if src_stat.st_size <= SMALL_FILE_BYTES:
        return False
    key = (src_stat.st_size, src_stat.st_mtime_ns)
    same = [other for other, st in theirs.items()
            if other != rel and other not in replaced and not Path(other).name.startswith(".")
            and (st.st_size, st.st_mtime_ns) == key]
    if not same:
        return False
    dst = target / rel
    tmp = dst.with_name(f".{dst.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}")
    try:
        os.link(target / same[0], tmp)
    except OSError:
        return False
    try:
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(dst.parent)
    return True


def _mirror_move_aside(source: Path, target: Path) -> str | None:
    """If the trainer moved its stage directory aside since the shared copy was made (the newest
    ``stage{N}.replaced-*`` here is missing there), rename the shared stage directory the same way."""
    if not target.is_dir():
        return None
    asides = sorted(p.name for p in source.parent.glob(f"{source.name}{_REPLACED_MARK}*") if p.is_dir())
    if not asides or (target.parent / asides[-1]).exists():
        return None
    os.rename(target, target.parent / asides[-1])
    fsync_dir(target.parent)
    log.warning("the stage directory was moved aside locally: moved the shared copy %s to %s too",
                target, asides[-1])
    return asides[-1]


