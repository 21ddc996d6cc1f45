"""benchlab/core/parent_watch.py piece by piece: each safety net on its own, so that one covering for another in the
end-to-end tests (tests/integration/test_faults.py: Linux's parent-death signal stops a stage before the watcher looks)
cannot hide a broken one."""

import importlib.machinery
import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from benchlab.core import parent_watch, process_chain

REAL_THREAD = threading.Thread  # the arming fixture replaces threading.Thread


def recording_libc(calls: list) -> type:
    """A stand-in for ctypes.CDLL that records the library opened and each prctl call instead of making it."""
    class Libc:
        def __init__(self, name: object, use_errno: bool = False) -> None:
            calls.append(("CDLL", name, use_errno))

        def prctl(self, option: int, sig: int) -> None:
            calls.append(("prctl", option, sig))

    return Libc


@pytest.fixture()
def state(monkeypatch: pytest.MonkeyPatch) -> dict:
    """The lifeline's state, put back after the test."""
    for key, value in {"orphaned": False, "signalled": False, "where": "", "pairs": [], "parent": "dvc 41",
                       "before_work": False, "cleanup": None}.items():
        monkeypatch.setitem(parent_watch._state, key, value)
    return parent_watch._state


class Sleeps(list):
    """A stand-in for time.sleep that records each wait and fails the test past `limit` of them, so a watcher
    that never returns ends the test instead of filling memory."""

    def __init__(self, limit: int = 50) -> None:
        super().__init__()
        self.limit = limit

    def __call__(self, seconds: float) -> None:
        self.append(seconds)
        if len(self) > self.limit:
            raise AssertionError(f"the watcher slept {len(self)} times without returning")


def test_the_watcher_stops_the_stage_once_its_starter_is_gone(state: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    looks, sleeps, kills, forced = iter([False, False, True]), Sleeps(), [], []
    pairs = [(os.getpid(), 41)]

    def orphaned(seen: list) -> bool:
        assert seen is pairs
        return next(looks)

    monkeypatch.setattr(process_chain, "orphaned", orphaned)
    monkeypatch.setattr(parent_watch.time, "sleep", sleeps)
    monkeypatch.setattr(process_chain.os, "kill", lambda pid, sig: kills.append((pid, sig)))
    monkeypatch.setattr(parent_watch, "_force_stop", lambda: forced.append(list(sleeps)))
    parent_watch._watch(pairs)  # returns after the third look
    assert sleeps == [parent_watch.POLL_S] * 3 + [parent_watch.GRACE_S]
    assert kills == [(os.getpid(), signal.SIGTERM)] and state["orphaned"] is True
    assert forced == [sleeps]  # the stage is ended after the grace, if the signal has not ended it by then


def test_a_watcher_that_never_sees_its_starter_go_is_stopped_by_the_test(state: dict,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process_chain, "orphaned", lambda pairs: False)
    monkeypatch.setattr(parent_watch.time, "sleep", Sleeps(limit=5))
    with pytest.raises(AssertionError, match="slept 6 times"):
        parent_watch._watch([(os.getpid(), 41)])


def test_the_watcher_does_not_signal_a_stage_the_parent_death_signal_already_stopped(
        state: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    state["signalled"] = True
    forced = []
    monkeypatch.setattr(process_chain, "orphaned", lambda pairs: True)
    monkeypatch.setattr(parent_watch.time, "sleep", Sleeps())
    monkeypatch.setattr(process_chain.os, "kill", lambda pid, sig: pytest.fail("signalled twice"))
    monkeypatch.setattr(parent_watch, "_force_stop", lambda: forced.append(True))
    parent_watch._watch([(os.getpid(), 41)])
    assert state["orphaned"] is True and forced == [True]


def test_a_sigterm_says_whether_the_starter_died(state: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parent_watch, "_parent_gone", lambda: True)
    with pytest.raises(parent_watch.Stopped) as stop:
        parent_watch._on_term(signal.SIGTERM, None)
    assert str(stop.value) == "the process that started it (dvc 41) died" and state["orphaned"] is True
    assert parent_watch.signalled() is True
    parent_watch._on_term(signal.SIGTERM, None)  # a second signal while stopping: ignored


def test_a_plain_sigterm_is_a_stop(state: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parent_watch, "_parent_gone", lambda: False)
    with pytest.raises(parent_watch.Stopped) as stop:
        parent_watch._on_term(signal.SIGTERM, None)
    assert str(stop.value) == "terminated" and state["orphaned"] is False


def test_a_stop_waits_a_little_for_the_starter_to_be_seen_gone(state: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    state["pairs"] = [(os.getpid(), os.getppid())]  # our parent is alive: never orphaned
    began = time.monotonic()
    assert parent_watch._parent_gone(0.15) is False
    assert 0.15 <= time.monotonic() - began < 0.6
    began = time.monotonic()
    assert parent_watch._parent_gone() is False
    assert 0.2 <= time.monotonic() - began < 0.7  # the default wait
    state["orphaned"] = True  # the watcher saw it first
    began = time.monotonic()
    assert parent_watch._parent_gone(5.0) is True and time.monotonic() - began < 0.5
    state["orphaned"] = False
    looks = iter([False, False, True])
    monkeypatch.setattr(process_chain, "orphaned", lambda pairs: next(looks))
    assert parent_watch._parent_gone(5.0) is True


def test_a_shell_between_dvc_and_the_stage_is_watched_too(monkeypatch: pytest.MonkeyPatch) -> None:
    me, parent = os.getpid(), os.getppid()
    monkeypatch.setattr(process_chain, "comm", lambda pid: {parent: "bash"}.get(pid, "python3"))
    monkeypatch.setattr(process_chain, "ppid_of", lambda pid: {parent: 7}[pid])
    assert process_chain.watched() == [(me, parent), (parent, 7)]
    monkeypatch.setattr(process_chain, "comm", lambda pid: "dvc")
    assert process_chain.watched() == [(me, parent)]

    def unreadable(pid: int) -> int:
        raise OSError("no free file descriptor")

    monkeypatch.setattr(process_chain, "comm", lambda pid: "sh")
    monkeypatch.setattr(process_chain, "ppid_of", unreadable)
    assert process_chain.watched() == [(me, parent)]


def test_a_process_that_is_gone_has_no_name() -> None:
    assert process_chain.comm(2**22 + 12345) == ""  # above Linux's largest pid
    assert process_chain.comm(os.getpid()) != ""


def test_children_ask_for_the_parent_death_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    monkeypatch.setattr(parent_watch.ctypes, "CDLL", recording_libc(calls))
    parent_watch.die_with_parent()
    assert calls == [("CDLL", None, True), ("prctl", 1, signal.SIGTERM)]

    def no_libc(*args: object, **kwargs: object) -> None:
        raise OSError("not Linux")

    monkeypatch.setattr(parent_watch.ctypes, "CDLL", no_libc)
    parent_watch.die_with_parent()  # no error: the watcher thread covers it


def test_where_a_stage_was_is_kept_for_its_stop_message(state: dict) -> None:
    parent_watch.at("step 12 of 300")
    assert parent_watch.where() == "step 12 of 300"


@pytest.fixture()
def arming(state: dict, monkeypatch: pytest.MonkeyPatch) -> list:
    """start() with every system call it makes recorded instead of made."""
    calls: list = []
    monkeypatch.setitem(state, "started", False)
    monkeypatch.setattr(parent_watch.signal, "signal", lambda sig, handler: calls.append(("signal", sig, handler)))
    monkeypatch.setattr(process_chain, "watched", lambda: [(10, 20), (20, 41)])
    monkeypatch.setattr(process_chain, "comm", lambda pid: {41: "dvc"}.get(pid, ""))

    class Thread:
        def __init__(self, **kwargs: object) -> None:
            calls.append(("Thread", kwargs))

        def start(self) -> None:
            calls.append("thread started")

    monkeypatch.setattr(parent_watch.ctypes, "CDLL", recording_libc(calls))
    monkeypatch.setattr(parent_watch.threading, "Thread", Thread)
    return calls


def test_arming_sets_the_handlers_each_time_and_the_watchers_once(state: dict, arming: list) -> None:
    state["signalled"] = True  # a stop in an earlier stage run of this process
    parent_watch.start()
    assert arming == [("signal", signal.SIGTERM, parent_watch._on_term), ("signal", signal.SIGINT, parent_watch._on_int),
                      ("CDLL", None, True), ("prctl", 1, signal.SIGTERM),
                      ("Thread", {"target": parent_watch._watch, "args": ([(10, 20), (20, 41)],), "daemon": True,
                                  "name": "lifeline"}), "thread started"]
    assert state["signalled"] is False and state["started"] is True
    assert state["pairs"] == [(10, 20), (20, 41)] and state["parent"] == "dvc 41"
    arming.clear()
    parent_watch.start()
    assert arming == [("signal", signal.SIGTERM, parent_watch._on_term), ("signal", signal.SIGINT, parent_watch._on_int)]


@pytest.mark.parametrize(("pairs", "parent"), [([(10, None)], "its parent"), ([(10, 77)], "pid 77")])
def test_the_starter_is_named_as_far_as_it_is_known(state: dict, arming: list, monkeypatch: pytest.MonkeyPatch,
                                                    pairs: list, parent: str) -> None:
    monkeypatch.setattr(process_chain, "watched", lambda: pairs)
    parent_watch.start()
    assert state["parent"] == parent


def test_a_dvc_run_is_its_dvc_process_s_pid_and_start_time(state: dict) -> None:
    """What locks.one_dvc_run tells one DVC run from the next by (a process given the same pid later starts later);
    a stage that a script or a terminal starts is in no DVC run."""
    def run_of(name: str) -> tuple[str, int]:
        proc = subprocess.Popen(["bash", "-c", f"exec -a {name} sleep 30"])
        try:
            deadline = time.monotonic() + 30
            while not Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(name.encode()):  # bash has exec'd
                assert time.monotonic() < deadline
                time.sleep(0.01)
            state["pairs"] = [(10, 20), (20, proc.pid)]
            return parent_watch.dvc_run(), proc.pid
        finally:
            proc.kill()
            proc.wait()

    run, pid = run_of("dvc")  # as `dvc repro` is named: dvc, python .../bin/dvc or python -m dvc
    assert run.startswith(f"{pid}:") and run.split(":")[1].isdigit(), run
    assert run_of("sleep")[0] == ""
    state["pairs"] = []
    assert parent_watch.dvc_run() == ""


def test_only_the_main_thread_arms_or_disarms(arming: list) -> None:
    worker = REAL_THREAD(target=lambda: (parent_watch.start(), parent_watch.finish()))
    worker.start()
    worker.join()
    assert arming == []
    parent_watch.finish()
    assert arming == [("signal", signal.SIGTERM, signal.SIG_DFL), ("signal", signal.SIGINT, signal.SIG_DFL)]


def test_a_check_after_the_starter_died_stops_the_stage(state: dict) -> None:
    parent_watch.check()  # not orphaned: nothing
    state["orphaned"] = True
    with pytest.raises(parent_watch.Stopped) as stop:
        parent_watch.check()
    assert str(stop.value) == "the process that started it (dvc 41) died"


def test_a_process_s_parent_is_read_past_a_name_with_brackets() -> None:
    # A command name may hold ") " and digits; the parent is the second field after the last ")".
    code = ("import ctypes, sys, time; ctypes.CDLL(None).prctl(15, b'a) 9 9 (b', 0, 0, 0); "
            "print('named', flush=True); time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "named"
        assert process_chain.comm(child.pid) == "a) 9 9 (b"
        assert process_chain.ppid_of(child.pid) == os.getpid()
    finally:
        child.kill()
        child.wait()
    assert process_chain.ppid_of(child.pid) is None  # gone
    assert process_chain.ppid_of(os.getpid()) == os.getppid()


# ---------------------------------------------------------------- issue 46: armed before the imports

class Exited(Exception):
    """os._exit, stood in for so that the test process lives on."""


@pytest.fixture()
def exits(monkeypatch: pytest.MonkeyPatch) -> list:
    codes: list = []

    def exit_(code: int) -> None:
        codes.append(code)
        raise Exited(code)

    monkeypatch.setattr(process_chain.os, "_exit", exit_)
    return codes


def test_a_stage_is_armed_only_when_it_runs_as_a_program(monkeypatch: pytest.MonkeyPatch) -> None:
    main = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert parent_watch.run_as_stage() is False  # python -c, or no spec at all
    main.__spec__ = importlib.machinery.ModuleSpec("stages.train", None)
    assert parent_watch.run_as_stage() is True
    main.__spec__ = importlib.machinery.ModuleSpec("pytest", None)
    assert parent_watch.run_as_stage() is False


def test_a_stop_before_the_stage_s_work_ends_the_process_at_once(state: dict, exits: list,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    state["before_work"] = True
    with pytest.raises(Exited):
        parent_watch._stop("terminated", 143)
    assert exits == [143] and capsys.readouterr().err == "stopped by the user before its first step; nothing recorded\n"
    with pytest.raises(Exited):
        parent_watch._on_int(signal.SIGINT, None)
    assert exits == [143, 130]


def test_a_stop_during_the_work_raises_into_it(state: dict, exits: list) -> None:
    with pytest.raises(KeyboardInterrupt):
        parent_watch._stop("interrupted", 130)
    with pytest.raises(parent_watch.Stopped, match="^terminated$"):
        parent_watch._stop("terminated", 143)
    assert exits == []


@pytest.mark.parametrize(("why", "where", "line"), [
    ("terminated", "", "stopped by the user before its first step; nothing recorded"),
    ("interrupted", "step 3 of 9", "stopped by the user at step 3 of 9; nothing recorded"),
    ("the process that started it (dvc 41) died", "step 3 of 9",
     "stopped because the process that started it (dvc 41) died at step 3 of 9; nothing recorded"),
])
def test_a_stop_is_one_line_naming_why_and_where(state: dict, why: str, where: str, line: str) -> None:
    state["where"] = where
    assert parent_watch.stop_line(why) == line


@pytest.mark.parametrize("before_work", [False, True])
def test_the_watcher_ends_a_stage_that_did_not_take_its_signal(state: dict, exits: list, before_work: bool,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    cleaned = []
    state.update(before_work=before_work, cleanup=lambda: cleaned.append(True), where="step 5 of 9")
    with pytest.raises(Exited):
        parent_watch._force_stop()
    assert exits == [143] and cleaned == ([] if before_work else [True])  # before the work nothing was written
    assert capsys.readouterr().err == ("stopped because the process that started it (dvc 41) died at step 5 of 9; "
                                       "nothing recorded\n")


def test_the_watcher_ends_the_stage_even_when_its_cleanup_fails(state: dict, exits: list) -> None:
    def broken() -> None:
        raise OSError("gone")

    state["cleanup"] = broken
    with pytest.raises(Exited):  # the cleanup's error cannot keep the process alive
        parent_watch._force_stop()
    assert exits == [143]


def test_a_finished_stage_has_nothing_to_clean_up(state: dict, arming: list) -> None:
    parent_watch.start(cleanup=lambda: None)
    assert state["cleanup"] is not None and state["before_work"] is False
    parent_watch.finish()
    assert state["cleanup"] is None


def test_a_write_checks_the_chain_itself_before_any_signal_has_come(state: dict) -> None:
    state["pairs"] = [(os.getpid(), os.getppid())]
    parent_watch.check()
    state["pairs"] = [(os.getpid(), os.getppid() + 100000)]  # re-parented, and nobody has told yet
    with pytest.raises(parent_watch.Stopped, match=r"^the process that started it \(dvc 41\) died$"):
        parent_watch.check()
    assert state["orphaned"] is True


def test_a_stage_started_by_a_stage_watches_the_chain_up_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    me = os.getpid()
    parents = {me: 500, 500: 400, 400: 300, 300: 1}  # a rank, torchrun's agent, the bench stage, ...
    monkeypatch.setattr(process_chain, "ppid_of", lambda pid: parents.get(pid))
    monkeypatch.setenv(process_chain.STARTER, "400")
    assert process_chain.watched() == [(me, 500), (500, 400)]
    monkeypatch.setenv(process_chain.STARTER, "300")
    assert process_chain.watched() == [(me, 500), (500, 400), (400, 300)]
    monkeypatch.setenv(process_chain.STARTER, "77")  # not an ancestor: the starting stage is gone
    assert process_chain.watched() == []
    parents[me] = 1  # adopted by init before the chain reached it
    monkeypatch.setenv(process_chain.STARTER, "400")
    assert process_chain.watched() == []
    monkeypatch.setenv(process_chain.STARTER, str(me))  # this stage's own pid, inherited through exec: not a starter
    monkeypatch.setattr(process_chain, "comm", lambda pid: "dvc")
    assert process_chain.watched() == [(me, os.getppid())]


def test_a_chain_up_to_a_starter_is_not_followed_forever(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process_chain, "ppid_of", lambda pid: pid + 1)  # never reaches it
    monkeypatch.setenv(process_chain.STARTER, "3")
    assert process_chain.watched() == []


@pytest.mark.parametrize(("pairs", "groups", "dvc", "adopted"), [
    ([], {}, False, True),                                  # no chain up to the stage that started us
    ([(10, 20)], {20: 7}, False, False),                    # our parent, in our group
    ([(10, 1)], {1: 0}, False, True),                       # init took us in
    ([(10, 1)], {1: 7}, False, False),                      # init started us, in our group (a container's dvc)
    ([(10, 20), (20, 1)], {20: 7, 1: 0}, False, True),      # init took in the shell DVC ran
    ([(10, 20)], {20: 99}, True, True),                     # under DVC: a subreaper took us in
    ([(10, 20)], {20: 99}, False, False),                   # outside DVC: `cat | python -m stages.x`
    ([(10, 20)], {}, True, True),                           # under DVC: the parent is gone already
])
def test_a_stage_tells_at_arming_whether_its_starter_died_already(monkeypatch: pytest.MonkeyPatch, pairs: list,
                                                                  groups: dict, dvc: bool, adopted: bool) -> None:
    def getpgid(pid: int) -> int:
        if pid == 0:
            return 7
        if pid not in groups:
            raise ProcessLookupError(pid)
        return groups[pid]

    monkeypatch.setattr(process_chain.os, "getpgid", getpgid)
    monkeypatch.setattr(process_chain.os, "getpid", lambda: 10)
    if dvc:
        monkeypatch.setenv("DVC_STAGE", "train")
    else:
        monkeypatch.delenv("DVC_STAGE", raising=False)
    assert process_chain.adopted(pairs) is adopted


def test_a_stage_leading_its_own_group_or_unable_to_look_is_not_taken_for_adopted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DVC_STAGE", "train")
    monkeypatch.setattr(process_chain.os, "getpid", lambda: 10)
    monkeypatch.setattr(process_chain.os, "getpgid", lambda pid: 10 if pid == 0 else 99)
    assert process_chain.adopted([(10, 1)]) is False  # a terminal's job, a torchrun rank: whoever started us chose it

    def denied(pid: int) -> int:
        if pid == 0:
            return 7
        raise PermissionError(pid)

    monkeypatch.setattr(process_chain.os, "getpgid", denied)
    assert process_chain.adopted([(10, 20)]) is False


def test_arming_early_ends_a_stage_whose_starter_is_gone(state: dict, arming: list, exits: list,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(process_chain.STARTER, "")  # so that the pid arming sets is taken back after the test
    monkeypatch.delenv(process_chain.STARTER)
    monkeypatch.setattr(process_chain, "adopted", lambda pairs: True)
    with pytest.raises(Exited):
        parent_watch.arm_early()
    assert exits == [143] and state["orphaned"] is True
    assert capsys.readouterr().err == ("stopped because the process that started it (dvc 41) died before its first "
                                       "step; nothing recorded\n")
    assert process_chain.STARTER not in os.environ


def test_arming_early_hands_the_stage_s_pid_to_what_it_starts(state: dict, arming: list, exits: list,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(process_chain.STARTER, "")  # so that the pid arming sets is taken back after the test
    monkeypatch.delenv(process_chain.STARTER)
    monkeypatch.setattr(process_chain, "adopted", lambda pairs: False)
    parent_watch.arm_early()
    assert exits == [] and state["before_work"] is True and os.environ[process_chain.STARTER] == str(os.getpid())
    assert ("prctl", 1, signal.SIGTERM) in arming and "thread started" in arming
    parent_watch.start()
    assert state["before_work"] is False  # run_main: the stage's work begins, a stop now raises into it


def test_a_stage_run_inside_pytest_leaves_no_watcher_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/conftest.py keeps the lifeline's watcher out of pytest's processes: left running, it read the stand-ins
    these tests put in place of process_chain.orphaned and ended the worker."""
    from benchlab.core.stage_main import run_main
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):  # run_main sets them where unset; put back after
        monkeypatch.setenv(name, str(tmp_path))
    run_main(lambda argv: None, [])
    assert "lifeline" not in [t.name for t in threading.enumerate()]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # finish() put the default back
