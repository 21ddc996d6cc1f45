"""Writing outputs so that a killed run never leaves a file that looks finished."""

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchlab import lifeline

# The outputs of the stage running in this process, registered by `remove_outputs`,
# so that a stage that fails or is stopped leaves none of them behind.
_outputs: list[Path] = []


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling of `path`; rename it over `path` only if the block completes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        lifeline.check()  # a stage whose starter died writes nothing more
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


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
    """Delete stage outputs left from an earlier run, and remember them: a failure removes them again."""
    _outputs.extend(map(Path, paths))
    _delete(paths)


def forget_outputs() -> None:
    """A new stage run starts with no registered outputs."""
    _outputs.clear()


def discard_outputs() -> None:
    """Remove whatever the failed or stopped stage had written of its outputs."""
    _delete(_outputs)
    _outputs.clear()


def _delete(paths: "list[Path] | tuple[str | Path, ...]") -> None:
    for p in map(Path, paths):
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)


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
