"""A stage stops when it is told to (Ctrl-C, SIGTERM) or when the process that started it dies.

DVC runs a stage as `sh -c 'python -m stages.x ...'`. If `dvc` is killed, the
stage would otherwise train on and write its outputs minutes after DVC has
restored them from its cache: a finished-looking result that no stage run
recorded. So at start-up each stage notes its parent (and the parent's
parent, when the parent is the shell DVC started), asks Linux to send it
SIGTERM when its parent dies, and watches those processes from a thread; if
one goes, the stage raises `Stopped` and `benchlab.io` refuses every write
from then on.
"""

import ctypes
import os
import signal
import threading
import time

SHELLS = {"sh", "bash", "dash", "zsh", "fish", "ksh"}
PR_SET_PDEATHSIG = 1
POLL_S = 0.5


class Stopped(Exception):
    """The stage was told to stop (signal), or the process that started it is gone."""


_state: dict = {"started": False, "orphaned": False, "where": ""}


def _ppid_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            # Field 4, after the command name in parentheses (which may itself hold spaces).
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def watched() -> list[tuple[int, int | None]]:
    """(pid, its parent now) for this process, and for our parent when it is a shell."""
    me, parent = os.getpid(), os.getppid()
    pairs = [(me, parent)]
    if _comm(parent) in SHELLS:
        pairs.append((parent, _ppid_of(parent)))
    return pairs


def orphaned(pairs: list[tuple[int, int | None]]) -> bool:
    """Whether any watched process has a new parent: the one that started it died."""
    return any(_ppid_of(pid) != ppid for pid, ppid in pairs)


def _watch(pairs: list[tuple[int, int | None]]) -> None:
    while True:
        time.sleep(POLL_S)
        if orphaned(pairs):
            _state["orphaned"] = True
            os.kill(os.getpid(), signal.SIGTERM)
            return


def _on_term(signum: int, frame: object) -> None:
    raise Stopped("the process that started this stage exited" if _state["orphaned"] else "terminated")


def start() -> None:
    """Arm the lifeline once per process: parent-death signal, SIGTERM handler, watcher thread."""
    if _state["started"] or threading.current_thread() is not threading.main_thread():
        return
    _state["started"] = True
    signal.signal(signal.SIGTERM, _on_term)
    # A shell without job control starts background commands with SIGINT ignored, and Python then leaves
    # it so: `kill -INT` (or a test runner under `nohup ... &`) would not stop the stage. Ctrl-C always does.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: the watcher thread alone covers it
    threading.Thread(target=_watch, args=(watched(),), daemon=True, name="lifeline").start()


def die_with_parent() -> None:
    """For a child this stage starts (torchrun): SIGTERM when this stage dies, however it dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def check() -> None:
    """Raise Stopped if the stage should no longer write anything."""
    if _state["orphaned"]:
        raise Stopped("the process that started this stage exited")


def at(where: str) -> None:
    """Note what the stage is doing now ("train step 12 of 300"), for the message if it is stopped."""
    _state["where"] = where


def where() -> str:
    return _state["where"]
