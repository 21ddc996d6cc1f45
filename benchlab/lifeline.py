"""A stage stops when it is told to (Ctrl-C, SIGTERM) or when the process that started it dies.

DVC runs a stage as `sh -c 'python -m stages.x ...'`. If `dvc` is killed, the
stage would otherwise train on and write its outputs minutes after DVC has
restored them from its cache: a finished-looking result that no stage run
recorded. So at start-up each stage notes its parent (and the parent's
parent, when the parent is the shell DVC started), asks Linux to send it
SIGTERM when its parent dies, and watches those processes from a thread; if
one goes, the stage raises `Stopped` and `benchlab.io` refuses every write
from then on.

One signal stops a stage; another arriving while it cleans up (the watcher's
SIGTERM after Linux's, a second Ctrl-C) is ignored, so the cleanup is never
cut short and no traceback is printed from whatever code it lands in.
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


_state: dict = {"started": False, "orphaned": False, "signalled": False, "where": "", "pairs": [], "parent": ""}


def _ppid_of(pid: int) -> int | None:
    """The parent of `pid`, None once `pid` is gone; OSError when /proc cannot be read now (no free file
    descriptor), which says nothing about the process."""
    if pid == os.getpid():
        return os.getppid()  # a system call: needs no file descriptor
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # Field 4, after the command name in parentheses (which may itself hold spaces).
    return int(text.rsplit(")", 1)[1].split()[1])


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def watched() -> list[tuple[int, int | None]]:
    """(pid, its parent now) for this process, and for our parent when it is a shell."""
    me, parent = os.getpid(), os.getppid()
    pairs: list[tuple[int, int | None]] = [(me, parent)]
    if _comm(parent) in SHELLS:
        try:
            pairs.append((parent, _ppid_of(parent)))
        except (OSError, ValueError, IndexError):
            pass  # /proc unreadable: our own parent is still watched
    return pairs


def orphaned(pairs: list[tuple[int, int | None]]) -> bool:
    """Whether any watched process has a new parent: the one that started it died."""
    try:
        return any(_ppid_of(pid) != ppid for pid, ppid in pairs)
    except (OSError, ValueError, IndexError):
        return False  # cannot tell now (out of file descriptors, say): the next look decides


def _watch(pairs: list[tuple[int, int | None]]) -> None:
    while True:
        time.sleep(POLL_S)
        if orphaned(pairs):
            _state["orphaned"] = True
            if not _state["signalled"]:  # Linux's parent-death signal may have stopped the stage already
                os.kill(os.getpid(), signal.SIGTERM)
            return


def _stop_once() -> bool:
    """Whether this signal is the first: only the first one stops the stage."""
    first = not _state["signalled"]
    _state["signalled"] = True
    return first


def _on_term(signum: int, frame: object) -> None:
    if not _stop_once():
        return
    if _parent_gone():
        _state["orphaned"] = True
        raise Stopped(parent_died())
    raise Stopped("terminated")


def _parent_gone(wait_s: float = 0.2) -> bool:
    """Whether a SIGTERM came from our starter's death rather than from `kill`: both are SIGTERM.

    Linux sends the parent-death signal when the *thread* that started us exits, which can be while the rest
    of the dying process still holds on as our parent for a few milliseconds, so a stop looks a little while."""
    deadline = time.monotonic() + wait_s
    while not (_state["orphaned"] or orphaned(_state["pairs"])):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _on_int(signum: int, frame: object) -> None:
    if _stop_once():
        raise KeyboardInterrupt


def parent_died() -> str:
    """The cause of a stop whose starter is gone, naming that process."""
    return f"the process that started it ({_state['parent']}) died"


def signalled() -> bool:
    """Whether a signal stopped this stage (not an exception raised in its code)."""
    return _state["signalled"]


def start() -> None:
    """Arm the lifeline: the signal handlers for each stage run, and once per process the parent-death
    signal and the watcher thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    _state["signalled"] = False  # each stage run in the process may be stopped once
    signal.signal(signal.SIGTERM, _on_term)
    # A shell without job control starts background commands with SIGINT ignored, and Python then leaves
    # it so: `kill -INT` (or a test runner under `nohup ... &`) would not stop the stage. Ctrl-C always does.
    signal.signal(signal.SIGINT, _on_int)
    if _state["started"]:
        return
    _state["started"] = True
    _state["pairs"] = pairs = watched()
    starter = pairs[-1][1]  # DVC (or a terminal's shell), above the shell DVC ran
    _state["parent"] = f"{_comm(starter) or 'pid'} {starter}" if starter else "its parent"
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: the watcher thread alone covers it
    threading.Thread(target=_watch, args=(pairs,), daemon=True, name="lifeline").start()


def finish() -> None:
    """The stage has written its outputs: a signal from now on (its starter dying as it exits) ends the process
    quietly, where raising inside the interpreter's exit hooks printed a traceback."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)


def die_with_parent() -> None:
    """For a child this stage starts (torchrun): SIGTERM when this stage dies, however it dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def check() -> None:
    """Raise Stopped if the stage should no longer write anything."""
    if _state["orphaned"]:
        raise Stopped(parent_died())


def at(where: str) -> None:
    """Note what the stage is doing now ("train step 12 of 300"), for the message if it is stopped."""
    _state["where"] = where


def where() -> str:
    return _state["where"]
