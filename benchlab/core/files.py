"""Writing outputs so that a killed run never leaves a file that looks finished.

A stage that fails or is stopped removes what it wrote, and only that: another
run of the same stage (a second terminal, a queued experiment) may have
finished the same outputs while this one waited for the device, and its
result must stay.
"""

import errno
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchlab.core import parent_watch
from benchlab.core.errors import LabError

# The outputs of the stage running in this process, registered by `remove_outputs`; a failed or stopped
# stage removes a folder among them if nothing is left in it.
_outputs: list[Path] = []
# Every file this process renamed into place, with its (device, inode): a failed or stopped stage removes
# the ones still holding what it wrote, never a file another run put there since.
_written: dict[Path, tuple[int, int]] = {}
# The temporary files `atomic_path` is writing now: a stop that ends the process from the lifeline's watcher
# (os._exit, no finally blocks run) removes them with the rest.
_pending: set[Path] = set()
# A write failing with one of these is the machine's limit, not the lab's bug: one line says which.
FULL = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
        errno.EFBIG: "the file-size limit (ulimit -f) was reached"}


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling of `path`; rename it over `path` only if the block completes.

    A full disk or a file-size limit while the block writes becomes a LabError naming `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    _pending.add(tmp.absolute())
    try:
        try:
            yield tmp
        except OSError as err:
            if err.errno in FULL:
                raise disk_full(path, err) from None
            raise
        parent_watch.check()  # a stage whose starter died writes nothing more
        st = tmp.stat()  # a rename keeps the inode: noted first, so a stop right after it still finds the file
        _written[path.absolute()] = (st.st_dev, st.st_ino)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        _pending.discard(tmp.absolute())


def disk_full(path: str | Path, err: BaseException) -> Exception:
    """The LabError for a write of `path` that the disk or a limit stopped."""
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    why = FULL.get(getattr(err, "errno", None), f"the write stopped short ({first}): the disk is full or a file-size "
                                                "limit (ulimit -f) was reached")
    return LabError(f"writing {path} failed: {why}; nothing was recorded. Free space (or raise the limit) "
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


def remove_outputs(*paths: str | Path) -> None:
    """Delete stage outputs left from an earlier run, and remember them: a failure removes their folders again
    if nothing is left in them."""
    _outputs.extend(map(Path, paths))
    for p in map(Path, paths):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)


def forget_outputs() -> None:
    """A new stage run starts with no registered outputs and nothing written."""
    _outputs.clear()
    _written.clear()


def discard_outputs() -> None:
    """Remove what the failed or stopped stage wrote itself; what another run wrote stays."""
    for tmp in list(_pending):
        tmp.unlink(missing_ok=True)
    _pending.clear()
    for path, identity in _written.items():
        try:
            st = path.stat()
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == identity:
            path.unlink()
    for folder in _outputs:
        try:
            folder.rmdir()  # only an empty folder: another run's files in it stay
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
