"""A stage's entry in DVC's experiments lock: DVC refuses a `dvc exp run` in the stage's workspace, by the very lock
DVC takes before it stashes the workspace, and lets one start again once the stage has ended, however it ended."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dvc.lock import LockError
from dvc.repo import Repo
from dvc.repo.experiments.refs import WORKSPACE_STASH
from dvc.repo.experiments.utils import get_exp_rwlock

from benchlab.core import exp_lock
from benchlab.core.stage_main import run_main
from tests.conftest import ROOT

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture()
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Repo]:
    """A DVC project with the current folder in a subfolder of it, as for the stages of search/dvc.yaml."""
    repo = Repo.init(str(tmp_path), no_scm=True)
    (tmp_path / "search").mkdir()
    monkeypatch.chdir(tmp_path / "search")
    yield repo
    exp_lock.release()


def stash_lock(repo: Repo):
    """What every `dvc exp run` (workspace, --temp, --queue) takes before it stashes the workspace: DVC's
    WorkspaceQueue.put and CeleryQueue.put."""
    return get_exp_rwlock(repo, writes=["workspace", WORKSPACE_STASH])


def test_while_a_stage_holds_it_dvc_refuses_a_dvc_exp_run_in_a_line_naming_queue_and_temp(project: Repo) -> None:
    assert exp_lock.hold("bench@sdpa") is None and exp_lock.held()
    assert exp_lock.hold("bench@sdpa") is None  # again: a no-op
    with pytest.raises(LockError) as refused, stash_lock(project):
        pass
    said = str(refused.value)
    assert said.startswith("'workspace' is busy, it is being blocked by:"), said
    line = next(line for line in said.splitlines() if "(PID" in line).strip()
    assert line == (f"(PID {os.getpid()}): stage bench@sdpa is running in this workspace, and any `dvc exp run` "
                    "started now (`--temp` too: each first stashes the workspace) would rewrite the params.yaml it "
                    "runs with: wait for it to end; run experiments side by side with `dvc exp run --queue` (then "
                    "`dvc queue start`) or `dvc exp run --temp`")
    exp_lock.release()
    assert not exp_lock.held()
    with stash_lock(project):
        pass  # the stage has ended: the next `dvc exp run` starts


def test_outside_a_dvc_project_nothing_is_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert exp_lock.dvc_root(tmp_path) is None
    assert exp_lock.hold("train") is None and not exp_lock.held()
    assert list(tmp_path.iterdir()) == []


def _holding(code: str, cwd: Path) -> subprocess.Popen:
    """A process running `code`, which prints "held" once it holds its lock and then waits for a line."""
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=cwd, env=ENV, text=True, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


DVC_EXP_RUN_STASHING = """
import sys
from dvc.repo import Repo
from dvc.repo.experiments.refs import WORKSPACE_STASH
from dvc.repo.experiments.utils import get_exp_rwlock
sys.argv = ["dvc", "exp", "run", "-S", "precision=bf16"]  # what DVC's lock names as the holder
with get_exp_rwlock(Repo("."), writes=["workspace", WORKSPACE_STASH]):
    print("held", flush=True)
    sys.stdin.readline()
"""

STAGE = """
import sys
from benchlab.core import exp_lock
from benchlab.core.stage_main import run_main
assert exp_lock.hold("train") is None and exp_lock.held()
print("held", flush=True)
sys.stdin.readline()
"""


def test_a_dvc_exp_run_stashing_the_workspace_is_named_and_nothing_is_held(project: Repo) -> None:
    other = _holding(DVC_EXP_RUN_STASHING, Path(project.root_dir))
    try:
        assert exp_lock.hold("train") == f"(PID {other.pid}): dvc exp run -S precision=bf16"
        assert not exp_lock.held()
    finally:
        other.communicate("done\n", timeout=60)
    assert exp_lock.hold("train") is None and exp_lock.held()


def test_a_killed_stage_leaves_no_lock_behind(project: Repo) -> None:
    stage = _holding(STAGE, Path(project.root_dir))
    with pytest.raises(LockError), stash_lock(project):
        pass
    assert exp_lock.hold("evaluate") == f"(PID {stage.pid}): stage train is running in this workspace"
    stage.send_signal(signal.SIGKILL)  # no cleanup runs: its entry stays, naming a dead pid
    stage.communicate(timeout=60)
    with stash_lock(project):
        pass  # DVC drops the dead pid's entry
    assert exp_lock.hold("train") is None and exp_lock.held()


ARMED = """
from benchlab.core import exp_lock, parent_watch
parent_watch.arm_early()
print(exp_lock.held())
"""


@pytest.mark.parametrize(("stage", "started_by_a_stage", "holds"), [("train", False, True),
                                                                    (None, False, False),  # outside DVC
                                                                    ("bench@sdpa", True, False)])
def test_a_stage_s_program_takes_the_entry_as_it_starts_unless_a_stage_started_it(
        project: Repo, stage: str | None, started_by_a_stage: bool, holds: bool) -> None:
    """Before its imports (torch's take seconds, in which a `dvc exp run` would get in). A repeat or a rank that a
    stage starts (BENCHLAB_STARTER_PID names that stage, here this test) is part of the stage's run."""
    env = {k: v for k, v in ENV.items() if k not in ("DVC_STAGE", "BENCHLAB_STARTER_PID")}
    if stage:
        env["DVC_STAGE"] = stage
    if started_by_a_stage:
        env["BENCHLAB_STARTER_PID"] = str(os.getpid())
    out = subprocess.run([sys.executable, "-c", ARMED], cwd=project.root_dir, env=env, text=True,
                         capture_output=True, timeout=60, check=True)
    assert out.stdout.strip() == str(holds), out.stderr
    with stash_lock(project):
        pass  # the process has ended: nothing left behind


def test_a_stage_started_while_a_dvc_exp_run_stashes_the_workspace_is_refused_in_one_line(
        project: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """That `dvc exp run` is about to write its params.yaml here: the stage would run under it."""
    monkeypatch.setenv("BENCHLAB_LOCK_DIR", str(tmp_path))
    monkeypatch.setenv("DVC_STAGE", "train")
    other = _holding(DVC_EXP_RUN_STASHING, Path(project.root_dir))
    ran = []
    try:
        with pytest.raises(SystemExit) as stop:
            run_main(lambda argv: ran.append(argv), [])
        assert stop.value.code == 2 and ran == [] and not exp_lock.held()
        assert capsys.readouterr().err.strip() == (
            f"error: another DVC command holds this workspace ((PID {other.pid}): dvc exp run -S precision=bf16); a "
            "stage started under it would run with its params.yaml: run experiments side by side with `dvc exp run "
            "--queue` (then `dvc queue start`) or `dvc exp run --temp`")
    finally:
        other.communicate("done\n", timeout=60)

    def stage(argv: list[str] | None) -> None:
        assert exp_lock.held()  # while the stage runs
        ran.append(argv)

    run_main(stage, [])
    assert ran == [[]] and not exp_lock.held()  # and let go at its end


def test_a_holder_killed_a_moment_ago_counts_as_ended_once_it_is_a_zombie_or_gone() -> None:
    """DVC counts a zombie as running; a stage killed with its DVC is one until it is reaped, and its entry must not
    hold the workspace against the next repro (the wait in `hold`)."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert exp_lock._ended(child.pid) is False
        child.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not exp_lock._ended(child.pid):  # killed, not yet waited for: a zombie
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert Path(f"/proc/{child.pid}").exists()
    finally:
        child.wait()
    assert exp_lock._ended(child.pid) is True  # reaped: gone
