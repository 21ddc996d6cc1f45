"""One timing per device at a time: an exclusive lock held while a stage measures.

`dvc queue start -j 2` or a second terminal could otherwise time two variants
on one GPU at once, and both would record wrong numbers. The lock is an
flock on a file named after the device in the system's temp folder (or
BENCHLAB_LOCK_DIR), so the kernel releases it when its holder dies, however.
"""

import fcntl
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from benchlab.config import LockMode
from benchlab.errors import LabError


def lock_path(device: torch.device) -> Path:
    """The lock file of a device: one per GPU (by its UUID), one per host for the CPU."""
    folder = Path(os.environ.get("BENCHLAB_LOCK_DIR") or tempfile.gettempdir())
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        key = f"cuda-{torch.cuda.get_device_properties(index).uuid}"
    else:
        key = f"cpu-{socket.gethostname()}"
    return folder / f"benchlab-{key}.lock"


@contextmanager
def device_lock(device: torch.device, mode: LockMode, holder: str) -> Iterator[None]:
    """Hold the device's lock for the block; wait for it or fail at once, by `bench.lock`."""
    path = lock_path(device)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 512, 0).decode(errors="replace").strip() or "another process"
            if mode == "fail":
                raise LabError(f"{device.type} is being timed by {other} (lock {path}); wait for it to finish, "
                               "or set bench.lock=wait to queue behind it") from None
            print(f"{holder}: waiting for {other} to finish timing {device.type} ...", flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({holder}, since {time.strftime('%H:%M:%S')})".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing drops the flock
