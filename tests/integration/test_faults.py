"""Faults met by a stage in a child process: a second timing that waits for the first, Ctrl-C and SIGTERM, and a
parent killed under a running stage (issue 46). The faults met in-process are in tests/unit/test_faults.py."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchlab.core import locks, parent_watch
from tests.conftest import micro_params
from tests.unit.test_faults import CPU, _hold_lock_in_another_process, lock_dir  # noqa: F401  (lock_dir: a fixture)


@pytest.mark.integration
def test_a_second_timing_waits_for_the_first_by_default(lock_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = _hold_lock_in_another_process(1.5)
    start = time.monotonic()
    with locks.device_lock(CPU, "wait", "bench@mine"):
        waited = time.monotonic() - start
    other.wait()
    assert waited > 0.5 and "waiting for pid" in capsys.readouterr().out


def scratch_sources(lab: Path) -> dict[str, str]:
    """Copy the sources into `lab` and return the environment that runs a stage from that copy: the stage's
    `git status` (provenance) then looks at the copy, never at the checkout the tests run from, whose index it
    could otherwise rewrite, or leave locked when a limit kills it half way."""
    from tests.conftest import copy_sources

    copy_sources(lab, ["benchlab", "model", "stages"])
    env = {**os.environ, "PYTHONPATH": str(lab), "PYTHONDONTWRITEBYTECODE": "1", "GIT_OPTIONAL_LOCKS": "0"}
    env.pop("BENCHLAB_STARTER_PID", None)
    return env


def _stage_process(workdir: Path, prepared: Path) -> subprocess.Popen:
    shutil.copytree(prepared, workdir / "prep")
    import yaml

    params = micro_params(data__corpus="corpus.txt", train__steps=100000)
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**scratch_sources(workdir), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "stages.train", "prep", "model.pt", "train.json", "record.json", "steps.csv"]
    # Started with SIGINT ignored, as a shell without job control starts a background command: the stage
    # must still stop on it (seen: a suite run under `nohup ... &` hung on an unkillable train).
    proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert proc.stdout is not None
    seen = ""
    while "%|" not in seen:  # the progress bar is drawn once the first step has started
        char = proc.stdout.read(1)
        assert char, "the stage ended before training"
        seen += char
    time.sleep(1.0)  # the bar is drawn just before step 0 begins
    return proc


@pytest.mark.integration
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_ends_a_stage_with_one_line_and_nothing_recorded(workdir: Path, prepared: Path,
                                                                           sig: int, code: int) -> None:
    proc = _stage_process(workdir, prepared)
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()  # never leave a 100,000-step run holding the CPU lock behind a failed test
    assert proc.returncode == code, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("stopped by the user at step ") and last.endswith("; nothing recorded"), err
    assert not any((workdir / f).exists() for f in ("model.pt", "train.json", "record.json", "steps.csv"))


# ---------------------------------------------------------------- issue 46: no run outlives its parent

# A stand-in for `dvc repro`: it starts the stage as DVC does (`$SHELL -c CMD`, DVC_STAGE set, the stage in its
# own process group) and prints the shell's pid; the test kills it with SIGKILL, as a user's `kill -9 <dvc>`.
DVC_STAND_IN = """
import os, subprocess, sys
shell = os.environ.get("SHELL") or "/bin/sh"
child = subprocess.Popen([shell, "-c", sys.argv[1]], env={**os.environ, "DVC_STAGE": sys.argv[2]}, close_fds=True,
                         stdout=sys.stderr)
print(child.pid, flush=True)
child.wait()
"""


KILL_AFTER_S = (0.1, 0.5, 1.0, 2.0, 5.0)


# The README's "within three seconds": the watcher's poll, its grace before it ends the process itself (a stage in
# native code, such as prepare's tokenizer, cannot run its signal handler), and 1.5 s for a process with torch loaded
# to exit on two busy cores.
ENDS_WITHIN_S = parent_watch.POLL_S + parent_watch.GRACE_S + 1.5


# What each stage is run as, the stage's name in DVC_STAGE, its outputs, and the params that keep it running past
# the last kill (so every kill lands in its work, not after its end).
LONG = {"train__steps": 100_000, "bench__steps": 100_000, "parity__steps": 100_000}


STAGES = {
    "train": ("stages.train prep checkpoints/model.pt metrics/train.json metrics/records/train.json plots/train.csv",
              "train", ["checkpoints/model.pt", "metrics/train.json", "metrics/records/train.json", "plots/train.csv"], {}),
    "bench in-process": ("stages.bench prep results steps", "bench@fp32_baseline",
                         ["results/fp32_baseline.json", "steps/fp32_baseline.csv"], {"bench__repeats": 1}),
    "bench fresh processes": ("stages.bench prep results steps", "bench@fp32_baseline",
                              ["results/fp32_baseline.json", "steps/fp32_baseline.csv"], {"bench__repeats": 2}),
    "parity": ("stages.parity prep parity curves", "parity_reference",
               ["parity/reference-seeds.json", "curves/reference-seeds.csv"], {}),
    "prepare": ("stages.prepare prepared", "prepare", ["prepared"], {"data__corpus": "big.txt", "data__vocab_size": 2048}),
}


def _lab(tmp_path: Path, prepared: Path, overrides: dict) -> Path:
    """A scratch lab: the sources, micro params with `overrides`, the prepared tokens, and for prepare a corpus
    that takes it longer than the last kill (the embedded one, 30 times)."""
    import yaml

    from tests.conftest import CORPUS, copy_sources

    lab = tmp_path / "lab"
    lab.mkdir()
    copy_sources(lab, ["benchlab", "model", "stages"])  # run with the lab as working folder: its copy is imported
    shutil.copytree(prepared, lab / "prep")
    params = micro_params(**{"data__corpus": "corpus.txt", **LONG, **overrides})
    (lab / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    if "data__corpus" in overrides:
        (lab / "big.txt").write_text(CORPUS.read_text(encoding="utf-8") * 30, encoding="utf-8")
    return lab


def _tagged(tag: str) -> list[int]:
    """The live processes whose environment carries `tag`: the stand-in's shell, the stage and its children."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if tag.encode() in (proc / "environ").read_bytes() and (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                pids.append(int(proc.name))
        except (OSError, IndexError):
            continue
    return pids


def _kill_dvc_during(lab: Path, stage: str, dvc_stage: str, after_s: float) -> tuple[float, float, str]:
    """Start `stage` through the stand-in, kill the stand-in `after_s` seconds later; returns how long the stage's
    processes lived on after the kill, the kill's wall-clock time, and what they printed."""
    tag = f"benchlab-kill-test-{os.getpid()}-{time.monotonic_ns()}"
    locks = lab.parent / "locks"  # the system's temp folder in a real run, never the workspace
    locks.mkdir(exist_ok=True)
    env = {**os.environ, "BENCHLAB_LOCK_DIR": str(locks), "KILL_TEST_TAG": tag, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)  # the lab's own copy of the sources, never the checkout's
    env.pop("BENCHLAB_STARTER_PID", None)
    log = lab / "stage.log"
    with log.open("w") as err:
        dvc = subprocess.Popen([sys.executable, "-c", DVC_STAND_IN, f"{sys.executable} -m {stage}", dvc_stage],
                               cwd=lab, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert dvc.stdout is not None and dvc.stdout.readline().strip().isdigit()
        time.sleep(after_s)
        assert _tagged(tag), f"the stage ended before its parent was killed: {log.read_text()[-2000:]}"
        killed_wall, killed = time.time(), time.monotonic()
        dvc.kill()
        dvc.wait()
        while _tagged(tag) and time.monotonic() - killed < 30:
            time.sleep(0.02)
        lived = time.monotonic() - killed
    finally:
        for pid in _tagged(tag):  # never leave a 100,000-step run behind a failed test
            os.kill(pid, signal.SIGKILL)
    return lived, killed_wall, log.read_text()


@pytest.mark.integration
@pytest.mark.parametrize("after_s", KILL_AFTER_S)
@pytest.mark.parametrize("name", STAGES)
def test_a_stage_ends_within_three_seconds_of_its_parent_s_death_and_writes_nothing_after(
        tmp_path: Path, prepared: Path, name: str, after_s: float) -> None:
    stage, dvc_stage, outputs, overrides = STAGES[name]
    lab = _lab(tmp_path, prepared, overrides)
    lived, killed_wall, log = _kill_dvc_during(lab, stage, dvc_stage, after_s)
    print(f"{name}: parent killed {after_s} s after the start, the stage lived {lived:.2f} s more")
    assert lived < ENDS_WITHIN_S, log
    assert re.search(r"stopped because the process that started it \(.*\) died .*; nothing recorded", log), log
    assert "Traceback" not in log, log
    late = [str(p.relative_to(lab)) for p in lab.rglob("*") if p.is_file() and p.stat().st_mtime > killed_wall
            and p.name != "stage.log"]
    assert late == [], late
    assert not [out for out in outputs if (lab / out).exists()], log
