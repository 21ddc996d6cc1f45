"""The lab's file locks: one device timed by one run at a time, one output folder written by one run, and under DVC
one stage at a time in a workspace.

`dvc queue start -j 2` or a second terminal could otherwise time two variants on one GPU at once, and both would
record wrong numbers; two prepares into one folder would each delete the other's files half way. Each lock is an
flock on a file in the system's temp folder (or BENCHLAB_LOCK_DIR), named after what it guards, so the kernel drops
it however its holder dies, and experiments in their own workspaces never meet. A stage under DVC also holds an entry
in DVC's own experiments lock (exp_lock), which `dvc exp run` reads. torch is imported only to name a GPU's lock.
"""

import fcntl
import hashlib
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from benchlab.core import exp_lock, files, parent_watch
from benchlab.core.errors import LabError
from benchlab.core.exp_lock import SIDE_BY_SIDE
from benchlab.core.sections import LockMode

if TYPE_CHECKING:
    import torch


def _folder() -> Path:
    return Path(os.environ.get("BENCHLAB_LOCK_DIR") or tempfile.gettempdir())


@contextmanager
def _held(path: Path, holder: str, waiting: str | None) -> Iterator[str | None]:
    """Hold the flock on `path` for the block, writing who holds it. Busy: print `waiting` (with the holder's
    line for {other}) and wait; without `waiting`, yield the holder's line without the lock, for the caller to
    refuse."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 512, 0).decode(errors="replace").strip() or "another process"
            if waiting is None:
                yield other
                return
            print(waiting.replace("{other}", other), flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({holder}, since {time.strftime('%H:%M:%S')})".encode(), 0)
        yield None
    finally:
        os.close(fd)  # closing drops the flock


def lock_path(device: "torch.device") -> Path:
    """The lock file of a device: one per GPU (by its UUID), one per host for the CPU."""
    if device.type == "cuda":
        import torch

        index = device.index if device.index is not None else torch.cuda.current_device()
        key = f"cuda-{torch.cuda.get_device_properties(index).uuid}"
    else:
        key = f"cpu-{socket.gethostname()}"
    return _folder() / f"benchlab-{key}.lock"


@contextmanager
def device_lock(device: "torch.device", mode: LockMode, holder: str) -> Iterator[None]:
    """Hold the device's lock for the block; wait for it or fail at once, by `harness.lock`."""
    path = lock_path(device)
    waiting = f"{holder}: waiting for {{other}} to finish timing {device.type} ..." if mode == "wait" else None
    with _held(path, holder, waiting) as other:
        if other is not None:
            raise LabError(f"{device.type} is being timed by {other} (lock {path}); wait for it to finish, "
                           "or set harness.lock=wait to queue behind it")
        yield


@contextmanager
def sole_writer(path: str | Path, holder: str) -> Iterator[None]:
    """Write `path` in this run alone: a second run of the same stage on it fails at once, naming the first."""
    parent_watch.check()  # a stage whose starter died while it imported takes no lock and writes nothing
    key = hashlib.sha256(os.fsencode(Path(path).resolve())).hexdigest()[:16]  # the bytes: any name, any locale
    with _held(_folder() / f"benchlab-out-{key}.lock", holder, None) as other:
        if other is not None:
            raise LabError(f"{path} is being written by {other}; wait for it to finish, then rerun")
        yield


def _params_sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "unreadable"


def _params_of_run(note: Path, params: Path) -> str:
    """params.yaml's hash as the first stage of this DVC run saw it: that stage (this one, if it is the first) notes
    it in `note` with the run (parent_watch.dvc_run), so a later stage finds it there. Outside a DVC run, now's."""
    run, now = parent_watch.dvc_run(), _params_sha256(params)
    try:
        noted_run, noted = note.read_text().split()
    except (OSError, ValueError):
        noted_run = noted = ""
    if run and noted_run == run:
        return noted
    if run:
        note.write_text(f"{run} {now}")
    return now


@contextmanager
def one_dvc_run(params: str | Path = "params.yaml") -> Iterator[None]:
    """Under DVC, one stage at a time in a workspace, run with the params.yaml it started with.

    DVC lets go of its own lock while a stage runs, so a second `dvc exp run` in the same workspace rewrote
    params.yaml under the first: `-S precision=tf32` trained with bf16, and results were filed under params they
    were not run with. Here the stage holds DVC's experiments lock (exp_lock: taken already as the stage's program
    started, before its imports), so DVC refuses such a run before it writes anything, and a stage of a second DVC
    run is refused at once. One that gets in all the same, in the moment between two stages, is caught: a stage
    whose params.yaml differs from what its run's first stage saw does not start, and one whose params.yaml changed
    while it ran records nothing. Processes a stage starts are part of its run; outside DVC nothing is held."""
    if "DVC_STAGE" not in os.environ or parent_watch.started_by_stage():
        yield
        return
    path = Path(params)
    lock = _folder() / f"benchlab-workspace-{hashlib.sha256(os.fsencode(path.resolve())).hexdigest()[:16]}.lock"
    stage = os.environ["DVC_STAGE"]
    with _held(lock, f"stage {stage}", None) as other:
        if other is not None:
            raise LabError(f"another DVC run is running a stage in this workspace ({other}); two runs here at once "
                           f"would each use the other's params.yaml: {SIDE_BY_SIDE}")
        holder = exp_lock.hold(stage)
        if holder is not None:
            raise LabError(f"another DVC command holds this workspace ({holder}); a stage started under it would run "
                           f"with its params.yaml: {SIDE_BY_SIDE}")
        before = _params_of_run(lock.with_suffix(".run"), path)
        if _params_sha256(path) != before:
            raise LabError(f"params.yaml changed since this DVC run's first stage (another `dvc exp run` in this "
                           f"workspace?), so {stage} would run under params the run was not started with; "
                           f"{SIDE_BY_SIDE}")

        def unchanged() -> None:
            if _params_sha256(path) != before:
                raise LabError(f"params.yaml changed while {stage} ran (another `dvc exp run` in this workspace?), "
                               f"so nothing was recorded under params it did not run with; {SIDE_BY_SIDE}")
        files.guard(unchanged)
        try:
            yield
        finally:
            exp_lock.release()
