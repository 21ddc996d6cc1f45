"""Faults a hostile or unlucky user meets: a second timing on the device, Ctrl-C, SIGTERM, a dead parent."""

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from benchlab.core import locks, parent_watch, process_chain
from benchlab.core.errors import LabError
from benchlab.core.stage_main import run_main
from benchlab.run.harness import Neighbours
from benchlab.run.records import neighbours
from benchlab.run.runner import Measurement
from stages import bench
from tests.conftest import ROOT

CPU = torch.device("cpu")


@pytest.fixture()
def lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("BENCHLAB_LOCK_DIR", str(tmp_path))
    return tmp_path


def _hold_lock_in_another_process(seconds: float) -> subprocess.Popen:
    code = ("import time, torch\nfrom benchlab.core import locks\n"
            f"with locks.device_lock(torch.device('cpu'), 'fail', 'bench@other'):\n"
            f"    print('held', flush=True)\n    time.sleep({seconds})\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=os.environ["BENCHLAB_LOCK_DIR"],
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_timing_on_a_held_device_fails_with_the_holder(lock_dir: Path) -> None:
    other = _hold_lock_in_another_process(30)
    try:
        with pytest.raises(LabError, match=r"cpu is being timed by pid \d+ \(bench@other.*set harness.lock=wait"):
            with locks.device_lock(CPU, "fail", "bench@mine"):
                pass
    finally:
        other.kill()
        other.wait()
    with locks.device_lock(CPU, "fail", "bench@mine"):  # its death released the lock
        assert "bench@mine" in locks.lock_path(CPU).read_text()


def test_a_busy_neighbour_is_seen_and_flagged() -> None:
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        watch = Neighbours(CPU)
        watch.start()
        time.sleep(1.0)
        facts = watch.finish()
    finally:
        hog.kill()
        hog.wait()
    share = 100.0 / (os.cpu_count() or 1)  # one busy core, as a share of all of them
    assert facts["cpu_busy_others_pct"] > 0.5 * share, facts
    flagged = neighbours([Measurement(status="ok", neighbours=facts)])
    assert flagged["interference_suspected"] is (facts["cpu_busy_others_pct"] > 20.0)
    quiet = neighbours([Measurement(status="ok", neighbours={**facts, "cpu_busy_others_pct": 1.0})])
    assert quiet["interference_suspected"] is False


def test_orphan_detection_sees_a_new_parent() -> None:
    me = os.getpid()
    assert process_chain.orphaned([(me, os.getppid())]) is False
    assert process_chain.orphaned([(me, os.getppid() + 100000)]) is True  # as if our parent had died and init adopted us


def test_a_stage_stopped_mid_write_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchlab.core.files import write_json

    monkeypatch.setitem(parent_watch._state, "orphaned", True)
    with pytest.raises(parent_watch.Stopped):
        write_json(tmp_path / "late.json", {"written": "after dvc died"})
    assert list(tmp_path.iterdir()) == []


def test_the_variant_comes_from_dvc_stage_and_must_be_in_params(workdir: Path, prepared: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(prepared, workdir / "prep")
    monkeypatch.setenv("GIT_OPTIONAL_LOCKS", "0")  # the stage's git status reads the checkout, never rewrites it
    monkeypatch.setenv("DVC_STAGE", "bench@x';touch PWNED;'")
    with pytest.raises(SystemExit):
        run_main(bench.main, ["prep", "results", "steps"])
    assert "variant \"x';touch PWNED;'\" is not in params.yaml" in capsys.readouterr().err
    monkeypatch.setenv("DVC_STAGE", "bench@fp16")
    run_main(bench.main, ["prep", "results", "steps"])
    assert json.loads((workdir / "results" / "fp16.json").read_text())["status"] == "skipped"
    assert not (workdir / "PWNED").exists()


def test_a_stop_is_never_recorded_as_a_variant_error(params, tokens, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchlab.run.runner import train_once

    def stopped(*args: object, **kwargs: object) -> None:
        raise parent_watch.Stopped("the process that started this stage exited")

    monkeypatch.setattr("benchlab.run.runner.train_step", stopped)
    with pytest.raises(parent_watch.Stopped):
        train_once(params, params.variants["fp32_baseline"], tokens, CPU, steps=4, warmup=2, keep_going=True)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a library kernel failed")

    monkeypatch.setattr("benchlab.run.runner.train_step", broken)
    rec = train_once(params, params.variants["fp32_baseline"], tokens, CPU, steps=4, warmup=2, keep_going=True)
    assert rec.status == "error" and rec.message == "RuntimeError: a library kernel failed"


# ---------------------------------------------------------------- issue 34: nothing lost, nothing silently wrong


def test_a_failed_stage_removes_only_what_it_wrote(tmp_path: Path) -> None:
    """Another run of the same stage may finish the same outputs while this one waits for the device."""
    from benchlab.core import files

    ours, theirs, later = tmp_path / "ours.json", tmp_path / "theirs.json", tmp_path / "later.csv"
    files.forget_outputs()
    files.claim_outputs(ours, theirs, later, tmp_path / "plots")
    files.write_json(ours, {"run": "this one"})
    files.write_json(theirs, {"run": "this one"})
    (tmp_path / "other.tmp").write_text('{"run": "the other"}')
    os.replace(tmp_path / "other.tmp", theirs)  # the other run finished after us: its file replaced ours
    later.write_text("the other run's")  # written by the other run alone
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "theirs.png").write_bytes(b"png")
    files.discard_outputs()
    assert not ours.exists()
    assert json.loads(theirs.read_text()) == {"run": "the other"} and later.read_text() == "the other run's"
    assert (tmp_path / "plots" / "theirs.png").exists()


def test_a_stop_in_the_middle_of_a_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    """The lifeline's watcher ends a stage stuck in native code with os._exit: no finally block runs, so the
    temporary file atomic_path was writing must go with the rest (prepare killed while it encoded kept
    data/prepared/.train.bin.tmp-PID, and so data/prepared)."""
    from benchlab.core import files

    out = tmp_path / "prepared"
    files.forget_outputs()
    files.claim_outputs(out)
    with pytest.raises(RuntimeError), files.atomic_path(out / "train.bin") as tmp:
        tmp.write_bytes(b"half")
        files.discard_outputs()  # what the watcher's stop runs before os._exit
        assert not tmp.exists() and not out.exists()
        raise RuntimeError("os._exit: the block never completes")
    assert not out.exists()


def test_out_of_file_descriptors_is_not_a_dead_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen under `ulimit -n 12`: the watcher could not open /proc, took that for a dead parent and stopped train."""
    def no_descriptor(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    me, parent = os.getpid(), os.getppid()
    grandparent = process_chain.ppid_of(parent)
    monkeypatch.setattr(parent_watch, "open", no_descriptor, raising=False)
    assert process_chain.orphaned([(me, parent)]) is False
    assert process_chain.orphaned([(me, parent), (parent, grandparent)]) is False


def test_a_second_signal_does_not_interrupt_the_cleanup(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watcher's SIGTERM after Linux's, or a second Ctrl-C, landed in an exit hook and printed a traceback."""
    monkeypatch.setitem(parent_watch._state, "signalled", False)
    monkeypatch.setitem(parent_watch._state, "pairs", [(os.getpid(), os.getppid())])
    with pytest.raises(parent_watch.Stopped, match="terminated"):
        parent_watch._on_term(signal.SIGTERM, None)
    parent_watch._on_term(signal.SIGTERM, None)  # ignored
    parent_watch._on_int(signal.SIGINT, None)  # ignored


@pytest.mark.parametrize("error, line", [
    (OSError(errno.EMFILE, "Too many open files", "/proc/self/stat"),
     "error: too many open files: raise the limit (ulimit -n) (/proc/self/stat); nothing recorded"),
    (OSError(errno.ENOSPC, "No space left on device"), "error: the disk is full: free space; nothing recorded"),
    (MemoryError(), "error: out of memory: raise the memory limit (ulimit -v) or free memory; nothing recorded"),
    (RuntimeError("can't start new thread"),
     "error: could not start a thread: out of memory or processes (ulimit -v, ulimit -u); nothing recorded"),
], ids=["file descriptors", "disk", "memory", "threads"])
def test_an_exhausted_machine_is_one_line_and_nothing_recorded(tmp_path: Path, error: BaseException, line: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from benchlab.core.files import claim_outputs, write_json

    def stage(argv: list[str] | None) -> None:
        claim_outputs(tmp_path / "out.json")
        write_json(tmp_path / "out.json", {})
        raise error

    with pytest.raises(SystemExit) as stop:
        run_main(stage, [])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [line]
    assert not (tmp_path / "out.json").exists()


def test_a_library_bug_still_shows_its_traceback(tmp_path: Path) -> None:
    def stage(argv: list[str] | None) -> None:
        raise RuntimeError("a kernel failed")

    with pytest.raises(RuntimeError, match="a kernel failed"):
        run_main(stage, [])


# ---------------------------------------------------------------- issue 53: one DVC run at a time in a workspace

WORKSPACE_HOLDER = """
import sys, time
from benchlab.core import locks
with locks.one_dvc_run():
    print("held", flush=True)
    sys.stdin.readline()
"""


def test_a_stage_of_a_second_dvc_run_in_the_workspace_is_refused_naming_queue_and_temp(
        workdir: Path, lock_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Where two runs share no file, DVC's own locks let both run; a stage of the second is refused at once."""
    holder = subprocess.Popen([sys.executable, "-c", WORKSPACE_HOLDER], cwd=workdir, text=True, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT), "DVC_STAGE": "train"})
    ran = []
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        monkeypatch.setenv("DVC_STAGE", "bench@sdpa")
        with pytest.raises(SystemExit) as stop:
            run_main(lambda argv: ran.append(argv), [])
        assert stop.value.code == 2 and ran == []
        line = capsys.readouterr().err.strip()
        assert re.fullmatch(r"error: another DVC run is running a stage in this workspace \(pid \d+ \(stage train, "
                            r"since [\d:]+\)\); two runs here at once would each use the other's params.yaml: run "
                            r"experiments side by side with `dvc exp run --queue` \(then `dvc queue start`\) or "
                            r"`dvc exp run --temp`", line), line
        monkeypatch.delenv("DVC_STAGE")
        run_main(lambda argv: ran.append(argv), [])  # outside DVC nothing is held
        assert ran == [[]]
    finally:
        holder.communicate("done\n", timeout=60)


def test_a_stage_whose_params_yaml_changes_under_it_records_nothing(workdir: Path, lock_dir: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from benchlab.core import files

    (workdir / "out.json").write_text("earlier")
    monkeypatch.setenv("DVC_STAGE", "train")

    def stage(argv: list[str] | None) -> None:
        files.claim_outputs(workdir / "out.json")
        files.write_json(workdir / "out.json", {"precision": "fp32"})
        (workdir / "params.yaml").write_text((workdir / "params.yaml").read_text() + "precision: bf16\n")
        files.commit_outputs()

    with pytest.raises(SystemExit):
        run_main(stage, [])
    assert "error: params.yaml changed while train ran" in capsys.readouterr().err
    assert (workdir / "out.json").read_text() == "earlier"


def test_a_stage_whose_params_yaml_changed_since_its_run_s_first_stage_does_not_start(
        workdir: Path, lock_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A `dvc exp run` that got in between two stages of a run wrote its params.yaml: the run's next stage would
    train under them, and DVC would file that under the run."""
    ran = []
    monkeypatch.setattr(parent_watch, "dvc_run", lambda: "4242:17")  # stages of one DVC process
    monkeypatch.setenv("DVC_STAGE", "env")
    run_main(lambda argv: ran.append("env"), [])
    (workdir / "params.yaml").write_text((workdir / "params.yaml").read_text() + "precision: bf16\n")
    monkeypatch.setenv("DVC_STAGE", "train")
    with pytest.raises(SystemExit) as stop:
        run_main(lambda argv: ran.append("train"), [])
    assert stop.value.code == 2 and ran == ["env"]
    assert capsys.readouterr().err.strip() == (
        "error: params.yaml changed since this DVC run's first stage (another `dvc exp run` in this workspace?), so "
        "train would run under params the run was not started with; run experiments side by side with `dvc exp run "
        "--queue` (then `dvc queue start`) or `dvc exp run --temp`")
    monkeypatch.setattr(parent_watch, "dvc_run", lambda: "4243:18")  # the next DVC run starts from these params
    run_main(lambda argv: ran.append("train"), [])
    monkeypatch.setattr(parent_watch, "dvc_run", lambda: "")  # so does a stage run by hand or by a script
    (workdir / "params.yaml").write_text((workdir / "params.yaml").read_text() + "weight_dtype: bf16\n")
    run_main(lambda argv: ran.append("by hand"), [])
    assert ran == ["env", "train", "by hand"]
