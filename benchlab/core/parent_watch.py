"""A stage stops when it is told to (Ctrl-C, SIGTERM) or when the process that started it dies.

DVC runs a stage as `$SHELL -c 'python -m stages.x ...'`, and the shell may stay between them. If `dvc` is
killed, the stage would otherwise train on and write its outputs minutes after DVC has restored them from its
cache: a finished-looking result that no stage run recorded. So each stage imports this module first, before
torch (seconds of imports), and that import, in a process run as `python -m stages.<name>`, arms the lifeline:
it notes the chain of processes from the stage up to its starter (the parent, and above it the shell DVC ran,
or up to the stage that started this one: a repeat, a rank under torchrun), asks Linux to send it SIGTERM when
its parent dies, and watches that chain from a thread, which stops the stage on its own when a link changes
parent. A stage found already orphaned when it arms (its starter died while Python started) ends at once.
Stopped before `run_main` has started the stage's work, a stage simply ends, since it has written nothing;
stopped after, it raises `Stopped` and `benchlab.core.files` refuses every write from then on.

One signal stops a stage; another arriving while it cleans up (the watcher's SIGTERM after Linux's, a second
Ctrl-C) is ignored, so the cleanup is never cut short and no traceback is printed from whatever code it lands in.
"""

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from benchlab.core import exp_lock, process_chain
from benchlab.core.process_chain import STARTER

PR_SET_PDEATHSIG = 1
POLL_S = 0.5
# How long the watcher waits for its SIGTERM to stop the stage before it ends the process itself.
GRACE_S = 0.8


class Stopped(Exception):
    """The stage was told to stop (signal), or the process that started it is gone."""


_state: dict = {"started": False, "orphaned": False, "signalled": False, "where": "", "pairs": [], "parent": "",
                "before_work": False, "cleanup": None, "started_by_stage": False}


def _watch(pairs: list[tuple[int, int | None]]) -> None:
    while True:
        time.sleep(POLL_S)
        if process_chain.orphaned(pairs):
            _state["orphaned"] = True
            if not _state["signalled"]:  # Linux's parent-death signal may have stopped the stage already
                os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(GRACE_S)
            _force_stop()  # reached only if the stop has not ended the process by now
            return


def _force_stop() -> None:
    """End the stage from the watcher when the stop did not: its main thread is inside one long call of native
    code (a tokenizer's training runs for seconds without returning to Python, where a signal handler runs), or
    waits on one (a thread pool's shutdown for its encoding job). What the stage wrote is removed first, as
    run_main would have."""
    try:
        print(stop_line(parent_died()), file=sys.stderr, flush=True)
        if not _state["before_work"] and _state["cleanup"] is not None:
            _state["cleanup"]()
        sys.stdout.flush()
    finally:
        os._exit(143)


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
        _stop(parent_died(), 143)
    _stop("terminated", 143)


def _stop(why: str, code: int) -> None:
    """Stop the stage: raise Stopped into its work, or, before run_main has started it, end the process now
    (nothing is written yet, and a raise inside an import would print a traceback)."""
    if _state["before_work"]:
        print(stop_line(why), file=sys.stderr, flush=True)
        os._exit(code)
    if code == 130:
        raise KeyboardInterrupt
    raise Stopped(why)


def stop_line(why: str) -> str:
    """The one line a stopped stage prints: `why` is "terminated", "interrupted" or the cause of a dead parent."""
    by = "by the user" if why in ("terminated", "interrupted") else f"because {why}"
    at = f" at {_state['where']}" if _state["where"] else " before its first step"
    return f"stopped {by}{at}; nothing recorded"


def _parent_gone(wait_s: float = 0.2) -> bool:
    """Whether a SIGTERM came from our starter's death rather than from `kill`: both are SIGTERM.

    Linux sends the parent-death signal when the *thread* that started us exits, which can be while the rest
    of the dying process still holds on as our parent for a few milliseconds, so a stop looks a little while."""
    deadline = time.monotonic() + wait_s
    while not (_state["orphaned"] or process_chain.orphaned(_state["pairs"])):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _on_int(signum: int, frame: object) -> None:
    if _stop_once():
        _stop("interrupted", 130)


def parent_died() -> str:
    """The cause of a stop whose starter is gone, naming that process."""
    return f"the process that started it ({_state['parent']}) died"


def dvc_run() -> str:
    """The DVC process that started this stage as "pid:start time" (process_chain.dvc_run); empty without one."""
    return process_chain.dvc_run(_state["pairs"])


def started_by_stage() -> bool:
    """Whether another stage started this process (a repeat, a rank, the search's worker): part of that stage's run."""
    return _state["started_by_stage"]


def signalled() -> bool:
    """Whether a signal stopped this stage (not an exception raised in its code)."""
    return _state["signalled"]


def start(cleanup: Callable[[], None] | None = None) -> None:
    """Arm the lifeline for a stage's work (run_main): the signal handlers for each stage run, and once per
    process the parent-death signal and the watcher thread. `cleanup` removes what the stage wrote, for a stop
    the watcher has to make itself."""
    if threading.current_thread() is not threading.main_thread():
        return
    _state["before_work"], _state["cleanup"] = False, cleanup
    _arm()


def arm_early() -> None:
    """Arm the lifeline in a stage's program before its imports: a stop until run_main starts the stage's work
    ends the process at once; a starter already dead ends it now. The processes the stage starts inherit its
    pid (STARTER), so that they can tell whether it still runs. Under DVC, the stage also marks its workspace
    busy in DVC's experiments lock now rather than after torch's seconds of imports, in which a `dvc exp run`
    started in another terminal would rewrite params.yaml (exp_lock; run_main refuses the stage if it is busy)."""
    _state["before_work"] = True
    _state["started_by_stage"] = os.environ.get(STARTER, str(os.getpid())) != str(os.getpid())
    _arm()
    if process_chain.adopted(_state["pairs"]):  # the starter died before we looked: its death signal will never come
        _state["orphaned"] = _state["signalled"] = True
        _stop(parent_died(), 143)
    os.environ[STARTER] = str(os.getpid())
    if "DVC_STAGE" in os.environ and not _state["started_by_stage"]:
        exp_lock.hold(os.environ["DVC_STAGE"])


def _arm() -> None:
    _state["signalled"] = False  # each stage run in the process may be stopped once
    signal.signal(signal.SIGTERM, _on_term)
    # A shell without job control starts background commands with SIGINT ignored, and Python then leaves
    # it so: `kill -INT` (or a test runner under `nohup ... &`) would not stop the stage. Ctrl-C always does.
    signal.signal(signal.SIGINT, _on_int)
    if _state["started"]:
        return
    _state["started"] = True
    _state["pairs"] = pairs = process_chain.watched()
    starter = pairs[-1][1] if pairs else None  # DVC (or a terminal's shell), above the shell DVC ran
    _state["parent"] = f"{process_chain.comm(starter) or 'pid'} {starter}" if starter else "its parent"
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: the watcher thread alone covers it
    threading.Thread(target=_watch, args=(pairs,), daemon=True, name="lifeline").start()


def run_as_stage() -> bool:
    """Whether this process runs a stage module as its program (`python -m stages.<name>`)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", "").startswith("stages.")


def finish() -> None:
    """The stage has written its outputs: a signal from now on (its starter dying as it exits) ends the process
    quietly, where raising inside the interpreter's exit hooks printed a traceback."""
    if threading.current_thread() is threading.main_thread():
        _state["cleanup"] = None  # nothing is removed any more: the outputs are the stage's result
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)


def die_with_parent() -> None:
    """For a child this stage starts (torchrun): SIGTERM when this stage dies, however it dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def check() -> None:
    """Raise Stopped if the stage should no longer write anything: its starter is gone, seen now if no signal or
    look of the watcher has told yet."""
    if _state["orphaned"] or process_chain.orphaned(_state["pairs"]):
        _state["orphaned"] = True
        raise Stopped(parent_died())


def at(where: str) -> None:
    """Note what the stage is doing now ("train step 12 of 300"), for the message if it is stopped."""
    _state["where"] = where


def where() -> str:
    return _state["where"]


# A stage imports this module first: armed here, before the stage's other imports (torch takes seconds), a
# stage whose starter dies while it imports ends then, not after a run nobody will record.
if run_as_stage() and threading.current_thread() is threading.main_thread():
    arm_early()
