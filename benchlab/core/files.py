"""Writing outputs so that a failed or killed run never loses the earlier output, nor leaves a file that looks
finished.

A stage claims its outputs first (`claim_outputs`) and deletes nothing then. What it writes to them waits aside,
in hidden siblings, until the whole stage has succeeded; `commit_outputs` then moves each into place (an output
the new run did not write is removed: it belongs to the old run). A stage that fails or is stopped removes its
aside files, and the earlier outputs stay byte for byte: a bad param, a corpus found bad half way, a full disk.
Another run of the same stage (a second terminal, a queued experiment) may finish the same outputs while this
one waits for the device; since nothing is moved before the end, its result stays.
"""

import errno
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchlab.core import parent_watch
from benchlab.core.errors import LabError

# The outputs the stage running in this process claimed (files or folders): a write to one of them, or into one,
# waits aside until the stage has succeeded.
_claimed: list[Path] = []
# Each new output file written aside: its final path -> the hidden sibling holding it until `commit_outputs`.
_staged: dict[Path, Path] = {}
# Folders written whole beside the folder they replace (`aside`): final folder -> the folder being written.
_asides: dict[Path, Path] = {}
# Every file this process renamed into place outside a claimed output, with its (device, inode): a failed or
# stopped stage removes the ones still holding what it wrote, never a file another run put there since.
_written: dict[Path, tuple[int, int]] = {}
# The temporary files `atomic_path` is writing now: a stop that ends the process from the lifeline's watcher
# (os._exit, no finally blocks run) removes them with the rest.
_pending: set[Path] = set()
# Checks that must still hold when the stage moves its outputs into place (`guard`), such as params.yaml unchanged.
_guards: list[Callable[[], None]] = []
# A write failing with one of these is the machine's limit, not the lab's bug: one line says which.
FULL = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
        errno.EFBIG: "the file-size limit (ulimit -f) was reached"}


def _claimed_by(path: Path) -> bool:
    """Whether `path` is a claimed output or lies inside a claimed folder."""
    return any(path == out or out in path.parents for out in _claimed)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling of `path`; rename it over `path` only if the block completes (for a claimed
    output, only when the whole stage has: `commit_outputs`).

    A full disk or a file-size limit while the block writes becomes a LabError naming `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    target, kept = path.absolute(), False
    _pending.add(tmp.absolute())
    try:
        try:
            yield tmp
        except OSError as err:
            if err.errno in FULL:
                raise disk_full(path, err) from None
            raise
        parent_watch.check()  # a stage whose starter died writes nothing more
        if _claimed_by(target):
            _staged[target], kept = tmp.absolute(), True  # moved into place with the rest when the stage succeeds
            return
        st = tmp.stat()  # a rename keeps the inode: noted first, so a stop right after it still finds the file
        _written[target] = (st.st_dev, st.st_ino)
        os.replace(tmp, path)
    finally:
        if not kept:
            tmp.unlink(missing_ok=True)
            _pending.discard(tmp.absolute())
            if _staged.get(target) == tmp.absolute():  # a second write of the output failed: the first was the same file
                del _staged[target]


def disk_full(path: str | Path, err: BaseException) -> Exception:
    """The LabError for a write of `path` that the disk or a limit stopped."""
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    why = FULL.get(getattr(err, "errno", None), f"the write stopped short ({first}): the disk is full or a file-size "
                                                "limit (ulimit -f) was reached")
    return LabError(f"writing {final_name(path)} failed: {why}; nothing was recorded. Free space (or raise the limit) "
                    "and rerun the stage")


def write_json(path: str | Path, data: Any) -> None:
    """JSON, written atomically, with sorted keys so reruns diff cleanly."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def file_sha256(path: str | Path) -> str:
    """sha256 of a file, read in 1 MiB chunks so any size fits in memory."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def claim_outputs(*paths: str | Path) -> None:
    """Name the stage's outputs (files or folders). Nothing is removed now: what the stage writes to them waits
    aside, and replaces them in `commit_outputs` once the stage has succeeded."""
    _claimed.extend(Path(p).absolute() for p in paths)


def aside(folder: str | Path) -> Path:
    """An empty folder beside `folder` for a stage that writes a folder whole and reads it back as it goes
    (prepare): it replaces `folder` in `commit_outputs`, or is removed if the stage fails."""
    new = Path(folder).with_name(f".{Path(folder).name}.new-{os.getpid()}")
    shutil.rmtree(new, ignore_errors=True)  # left by a killed run whose pid this process now has
    new.mkdir(parents=True)
    _asides[Path(folder).absolute()] = new
    _claimed.append(Path(folder).absolute())
    return new


def final_name(path: str | Path) -> Path:
    """The output a path written aside stands for (prep/train.bin for prep/.prep.new-PID/train.bin), for messages."""
    path = Path(path)
    for final, new in _asides.items():
        if path.absolute() == new.absolute() or new.absolute() in path.absolute().parents:
            return Path(os.path.relpath(final)) / path.absolute().relative_to(new.absolute())
    return path


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _swap(new: Path, final: Path) -> None:
    """Put `new` (a file or a folder) where `final` is, removing the old one."""
    if final.is_dir() and not final.is_symlink():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        _remove(old)
        os.rename(final, old)
        os.rename(new, final)
        shutil.rmtree(old)
    else:
        os.replace(new, final)


def commit_outputs() -> None:
    """The stage succeeded: move every new output into place, and remove the claimed ones it did not write
    again (they belong to the earlier run)."""
    parent_watch.check()  # a stage whose starter died writes nothing more
    for check in _guards:
        check()
    for final in _claimed:
        if final in _asides:
            _swap(_asides.pop(final), final)
        elif final in _staged:
            _swap(_staged.pop(final), final)
        else:
            inside = {path: _staged.pop(path) for path in list(_staged) if final in path.parents}
            if inside:
                _swap(_gathered(final, inside), final)
            else:
                _remove(final)
    _pending.clear()  # the aside files, moved now
    forget_outputs()


def _gathered(folder: Path, files: dict[Path, Path]) -> Path:
    """A new folder beside `folder` holding the files written into it (final path -> aside file)."""
    new = folder.with_name(f".{folder.name}.new-{os.getpid()}")
    _remove(new)
    for path, tmp in files.items():
        (new / path.relative_to(folder)).parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, new / path.relative_to(folder))
    return new


def guard(check: Callable[[], None]) -> None:
    """Run `check` (which raises LabError) before the outputs move into place: what it refuses records nothing."""
    _guards.append(check)


def forget_outputs() -> None:
    """A new stage run starts with no claimed outputs, nothing written and no guard."""
    _guards.clear()
    _claimed.clear()
    _staged.clear()
    _asides.clear()
    _written.clear()


def discard_outputs() -> None:
    """The stage failed or was stopped: remove what it wrote aside and what it put in place itself; the earlier
    outputs, and what another run wrote, stay."""
    for tmp in [*_pending, *_staged.values()]:
        tmp.unlink(missing_ok=True)
    _pending.clear()
    for new in _asides.values():
        shutil.rmtree(new, ignore_errors=True)
    for path, identity in _written.items():
        try:
            st = path.stat()
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == identity:
            path.unlink()
    for folder in _claimed:
        try:
            folder.rmdir()  # only an empty folder, as atomic_path may have made it: files in it stay
        except OSError:
            pass
    forget_outputs()


def flat(prefix: str, data: dict[str, Any]) -> dict[str, Any]:
    """Nested dicts as dotted keys: result files stay flat."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}"
        if isinstance(value, dict):
            out.update(flat(name, value))
        else:
            out[name] = value
    return out
