"""benchlab/lifeline.py piece by piece: each safety net on its own, so that one covering for another in the
end-to-end tests (tests/test_faults.py: Linux's parent-death signal stops a stage before the watcher looks)
cannot hide a broken one."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from benchlab import lifeline

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
    for key, value in {"orphaned": False, "signalled": False, "where": "", "pairs": [], "parent": "dvc 41"}.items():
        monkeypatch.setitem(lifeline._state, key, value)
    return lifeline._state


def test_the_watcher_stops_the_stage_once_its_starter_is_gone(state: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    looks, sleeps, kills = iter([False, False, True]), [], []
    pairs = [(os.getpid(), 41)]

    def orphaned(seen: list) -> bool:
        assert seen is pairs
        return next(looks)

    monkeypatch.setattr(lifeline, "orphaned", orphaned)
    monkeypatch.setattr(lifeline.time, "sleep", sleeps.append)
    monkeypatch.setattr(lifeline.os, "kill", lambda pid, sig: kills.append((pid, sig)))
    lifeline._watch(pairs)  # returns after the third look
    assert sleeps == [lifeline.POLL_S] * 3
    assert kills == [(os.getpid(), signal.SIGTERM)] and state["orphaned"] is True


def test_the_watcher_does_not_signal_a_stage_the_parent_death_signal_already_stopped(
        state: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    state["signalled"] = True
    monkeypatch.setattr(lifeline, "orphaned", lambda pairs: True)
    monkeypatch.setattr(lifeline.time, "sleep", lambda s: None)
    monkeypatch.setattr(lifeline.os, "kill", lambda pid, sig: pytest.fail("signalled twice"))
    lifeline._watch([(os.getpid(), 41)])
    assert state["orphaned"] is True


def test_a_sigterm_says_whether_the_starter_died(state: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lifeline, "_parent_gone", lambda: True)
    with pytest.raises(lifeline.Stopped) as stop:
        lifeline._on_term(signal.SIGTERM, None)
    assert str(stop.value) == "the process that started it (dvc 41) died" and state["orphaned"] is True
    assert lifeline.signalled() is True
    lifeline._on_term(signal.SIGTERM, None)  # a second signal while stopping: ignored


def test_a_plain_sigterm_is_a_stop(state: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lifeline, "_parent_gone", lambda: False)
    with pytest.raises(lifeline.Stopped) as stop:
        lifeline._on_term(signal.SIGTERM, None)
    assert str(stop.value) == "terminated" and state["orphaned"] is False


def test_a_stop_waits_a_little_for_the_starter_to_be_seen_gone(state: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    state["pairs"] = [(os.getpid(), os.getppid())]  # our parent is alive: never orphaned
    began = time.monotonic()
    assert lifeline._parent_gone(0.15) is False
    assert 0.15 <= time.monotonic() - began < 0.6
    began = time.monotonic()
    assert lifeline._parent_gone() is False
    assert 0.2 <= time.monotonic() - began < 0.7  # the default wait
    state["orphaned"] = True  # the watcher saw it first
    began = time.monotonic()
    assert lifeline._parent_gone(5.0) is True and time.monotonic() - began < 0.5
    state["orphaned"] = False
    looks = iter([False, False, True])
    monkeypatch.setattr(lifeline, "orphaned", lambda pairs: next(looks))
    assert lifeline._parent_gone(5.0) is True


def test_a_shell_between_dvc_and_the_stage_is_watched_too(monkeypatch: pytest.MonkeyPatch) -> None:
    me, parent = os.getpid(), os.getppid()
    monkeypatch.setattr(lifeline, "_comm", lambda pid: {parent: "bash"}.get(pid, "python3"))
    monkeypatch.setattr(lifeline, "_ppid_of", lambda pid: {parent: 7}[pid])
    assert lifeline.watched() == [(me, parent), (parent, 7)]
    monkeypatch.setattr(lifeline, "_comm", lambda pid: "dvc")
    assert lifeline.watched() == [(me, parent)]

    def unreadable(pid: int) -> int:
        raise OSError("no free file descriptor")

    monkeypatch.setattr(lifeline, "_comm", lambda pid: "sh")
    monkeypatch.setattr(lifeline, "_ppid_of", unreadable)
    assert lifeline.watched() == [(me, parent)]


def test_a_process_that_is_gone_has_no_name() -> None:
    assert lifeline._comm(2**22 + 12345) == ""  # above Linux's largest pid
    assert lifeline._comm(os.getpid()) != ""


def test_children_ask_for_the_parent_death_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    monkeypatch.setattr(lifeline.ctypes, "CDLL", recording_libc(calls))
    lifeline.die_with_parent()
    assert calls == [("CDLL", None, True), ("prctl", 1, signal.SIGTERM)]

    def no_libc(*args: object, **kwargs: object) -> None:
        raise OSError("not Linux")

    monkeypatch.setattr(lifeline.ctypes, "CDLL", no_libc)
    lifeline.die_with_parent()  # no error: the watcher thread covers it


def test_where_a_stage_was_is_kept_for_its_stop_message(state: dict) -> None:
    lifeline.at("step 12 of 300")
    assert lifeline.where() == "step 12 of 300"


@pytest.fixture()
def arming(state: dict, monkeypatch: pytest.MonkeyPatch) -> list:
    """start() with every system call it makes recorded instead of made."""
    calls: list = []
    monkeypatch.setitem(state, "started", False)
    monkeypatch.setattr(lifeline.signal, "signal", lambda sig, handler: calls.append(("signal", sig, handler)))
    monkeypatch.setattr(lifeline, "watched", lambda: [(10, 20), (20, 41)])
    monkeypatch.setattr(lifeline, "_comm", lambda pid: {41: "dvc"}.get(pid, ""))

    class Thread:
        def __init__(self, **kwargs: object) -> None:
            calls.append(("Thread", kwargs))

        def start(self) -> None:
            calls.append("thread started")

    monkeypatch.setattr(lifeline.ctypes, "CDLL", recording_libc(calls))
    monkeypatch.setattr(lifeline.threading, "Thread", Thread)
    return calls


def test_arming_sets_the_handlers_each_time_and_the_watchers_once(state: dict, arming: list) -> None:
    state["signalled"] = True  # a stop in an earlier stage run of this process
    lifeline.start()
    assert arming == [("signal", signal.SIGTERM, lifeline._on_term), ("signal", signal.SIGINT, lifeline._on_int),
                      ("CDLL", None, True), ("prctl", 1, signal.SIGTERM),
                      ("Thread", {"target": lifeline._watch, "args": ([(10, 20), (20, 41)],), "daemon": True,
                                  "name": "lifeline"}), "thread started"]
    assert state["signalled"] is False and state["started"] is True
    assert state["pairs"] == [(10, 20), (20, 41)] and state["parent"] == "dvc 41"
    arming.clear()
    lifeline.start()
    assert arming == [("signal", signal.SIGTERM, lifeline._on_term), ("signal", signal.SIGINT, lifeline._on_int)]


@pytest.mark.parametrize(("pairs", "parent"), [([(10, None)], "its parent"), ([(10, 77)], "pid 77")])
def test_the_starter_is_named_as_far_as_it_is_known(state: dict, arming: list, monkeypatch: pytest.MonkeyPatch,
                                                    pairs: list, parent: str) -> None:
    monkeypatch.setattr(lifeline, "watched", lambda: pairs)
    lifeline.start()
    assert state["parent"] == parent


def test_only_the_main_thread_arms_or_disarms(arming: list) -> None:
    worker = REAL_THREAD(target=lambda: (lifeline.start(), lifeline.finish()))
    worker.start()
    worker.join()
    assert arming == []
    lifeline.finish()
    assert arming == [("signal", signal.SIGTERM, signal.SIG_DFL), ("signal", signal.SIGINT, signal.SIG_DFL)]


def test_a_check_after_the_starter_died_stops_the_stage(state: dict) -> None:
    lifeline.check()  # not orphaned: nothing
    state["orphaned"] = True
    with pytest.raises(lifeline.Stopped) as stop:
        lifeline.check()
    assert str(stop.value) == "the process that started it (dvc 41) died"


def test_a_process_s_parent_is_read_past_a_name_with_brackets() -> None:
    # A command name may hold ") " and digits; the parent is the second field after the last ")".
    code = ("import ctypes, sys, time; ctypes.CDLL(None).prctl(15, b'a) 9 9 (b', 0, 0, 0); "
            "print('named', flush=True); time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "named"
        assert lifeline._comm(child.pid) == "a) 9 9 (b"
        assert lifeline._ppid_of(child.pid) == os.getpid()
    finally:
        child.kill()
        child.wait()
    assert lifeline._ppid_of(child.pid) is None  # gone
    assert lifeline._ppid_of(os.getpid()) == os.getppid()
