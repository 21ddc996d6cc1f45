"""Which params a stage read, noted as it reads them, so a test can hold dvc.yaml's params lists to the code.

A stage reruns when, and only when, a param that dvc.yaml lists for it changes. A key it reads but does not list
is a stale result waiting to happen; a key it lists but never reads is a needless rerun. dvc.yaml owns the lists
(DVC must read them there); `tests/unit/test_dvc_params.py` runs the pipeline with BENCHLAB_PARAM_READS set and checks
each stage's list against what this module noted. Unset (every user's run), nothing is noted and nothing written.
"""

import atexit
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

ENV = "BENCHLAB_PARAM_READS"  # a folder: each stage's process appends the dotted keys it read to <stage>.txt

_reads: set[str] | None = None
_path: Path | None = None


class Traced:
    """A section of params.yaml (a frozen dataclass) whose field reads are noted while `start` is in force, as
    `<SECTION>.<field>`; `Params` itself has no SECTION and notes its own fields by name."""

    SECTION: ClassVar[str] = ""

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if (_reads is not None and name in type(self).__dataclass_fields__  # type: ignore[attr-defined]
                and not isinstance(value, Traced) and name not in object.__getattribute__(self, "__dict__").get(
                    "_replaced", ())):
            section = type(self).SECTION
            _reads.add(f"{section}.{name}" if section else name)
        return value


def replaced(obj: Traced, names: frozenset[str]) -> None:
    """Mark fields whose values a stage put in itself (a time-to-loss arm's seed): reading them is no read of
    params.yaml."""
    object.__setattr__(obj, "_replaced", names)


def start() -> None:
    """Note every read from now on, and append them to BENCHLAB_PARAM_READS/<stage>.txt at exit, where that
    variable is set; the stage is DVC_STAGE's name (a bench repeat's child process inherits it)."""
    global _reads, _path
    folder = os.environ.get(ENV)
    if not folder or _reads is not None:
        return
    _reads = set()
    stage = os.environ.get("DVC_STAGE") or Path(sys.argv[0]).stem
    _path = Path(folder) / f"{stage.replace('/', '_')}.txt"
    atexit.register(write)


def note(key: str) -> None:
    """Note a read made without a section object (data.corpus, read alone by the corpus check)."""
    if _reads is not None:
        _reads.add(key)


@contextmanager
def quiet() -> Iterator[None]:
    """Note nothing inside: building Params with some values changed (`dataclasses.replace`) reads every field and
    checks them all again, which is no stage reading them."""
    global _reads
    kept, _reads = _reads, None
    try:
        yield
    finally:
        _reads = kept


def write() -> None:
    """Append what was read so far to the stage's file, where tracing is on; at exit, and before a process ends
    without its exit hooks (`os._exit`, benchlab.run.launch.end_process)."""
    if _reads and _path is not None:
        _path.parent.mkdir(parents=True, exist_ok=True)
        with _path.open("a") as f:
            f.write("".join(f"{key}\n" for key in sorted(_reads)))
        _reads.clear()
