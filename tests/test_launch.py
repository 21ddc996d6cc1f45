"""Where a variant's runs happen (benchlab/launch.py): repeats in fresh processes, the deadline, torchrun's ranks,
their merged record, a failed child's last words, and the profile stage on the same path as bench."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from benchlab import dist, launch
from benchlab.config import load_params, parse_params
from benchlab.entry import run_main
from benchlab.errors import LabError
from benchlab.launch import combine_ranks, last_words, repeat_cost, repeat_in_fresh_process
from benchlab.results import neighbours
from benchlab.runner import RunRecord, rank_slice
from stages import bench, profile
from tests.conftest import ROOT, micro_params
from tests.test_distributed import dist_workdir, write_params  # noqa: F401  (dist_workdir: a fixture)

# --- repeats: their cost, their processes and the deadline -----------------------------------------------------

def test_a_repeat_line_names_where_its_wall_time_went() -> None:
    rec = RunRecord(status="ok", setup_s=9.04, warmup_s=2.5, window_wall_ms=3600.0, eval_s=0.44)
    assert repeat_cost(rec, 16.6) == ("16.6 s, start-up and build 9.0 s, warm-up and compile 2.5 s, timed 3.6 s, "
                                      "evaluation 0.4 s")
    rec = RunRecord(status="ok", setup_s=9.04, startup_s=6.12, init_s=1.27, apply_s=1.65, warmup_s=2.5,
                    window_wall_ms=3600.0, eval_s=0.44, exit_s=5.96)
    assert repeat_cost(rec, 22.6) == ("22.6 s, start-up and build 9.0 s (of which interpreter, imports and device "
                                      "6.1 s, the model's seeded init 1.3 s, the knobs applied 1.6 s), warm-up and "
                                      "compile 2.5 s, timed 3.6 s, evaluation 0.4 s, exit 6.0 s")
    rec = RunRecord(status="ok", setup_s=2.0, init_s=0.5)  # in-process: no start-up of its own
    assert repeat_cost(rec, 2.5) == "2.5 s, start-up and build 2.0 s (of which the model's seeded init 0.5 s)"
    assert repeat_cost(RunRecord(status="oom"), 3.0) == "3.0 s"


def test_a_repeat_process_s_exit_is_timed_by_its_parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in repeat: it writes its record, then takes 0.5 s to exit, as a process tearing down CUDA would.
    (tmp_path / "slow_exit.py").write_text(
        "import sys, time\n"
        "open(sys.argv[sys.argv.index('--record-to') + 1], 'w').write('{\"status\": \"ok\", \"setup_s\": 1.5}')\n"
        "time.sleep(0.5)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    rec = repeat_in_fresh_process(["slow_exit"])
    assert rec.status == "ok" and rec.setup_s == 1.5
    assert rec.exit_s is not None and 0.45 < rec.exit_s < 5.0


class FakeClock:
    """time.time and time.perf_counter that only a stand-in repeat moves forward."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def time(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now


REPEAT_MODE = ["stages.bench", "--variant", "recipe", "d", "r", "s"]


@pytest.mark.parametrize("seconds_left, ran", [(1000.0, 3), (100.0, 1), (130.0, 2)])
def test_a_deadline_stops_repeats_that_would_end_past_it(seconds_left: float, ran: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Repeats of 60, 50 and 50 s: the next one is judged by the shortest so far.
    clock, walls = FakeClock(), iter([60.0, 50.0, 50.0])

    def repeat(argv: list[str], nproc: int = 1) -> RunRecord:
        assert argv == REPEAT_MODE
        clock.now += next(walls)
        return RunRecord(status="ok")

    monkeypatch.setattr(launch, "time", clock)
    monkeypatch.setattr(launch, "repeat_in_fresh_process", repeat)
    monkeypatch.setenv("BENCHLAB_DEADLINE", str(clock.now + seconds_left))
    p = parse_params(micro_params(bench__repeats=3))
    assert len(launch.run_repeats(p, "recipe", "d", REPEAT_MODE)) == ran


def test_a_passed_or_garbled_deadline_records_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    p = parse_params(micro_params(bench__repeats=3))
    monkeypatch.setattr(launch, "repeat_in_fresh_process", lambda *a, **k: pytest.fail("no repeat may start"))
    monkeypatch.setenv("BENCHLAB_DEADLINE", "1")  # 1970
    with pytest.raises(LabError, match="BENCHLAB_DEADLINE passed before its first repeat; nothing recorded"):
        launch.run_repeats(p, "recipe", "d", REPEAT_MODE)
    monkeypatch.setenv("BENCHLAB_DEADLINE", "in ten minutes")
    with pytest.raises(LabError, match="BENCHLAB_DEADLINE='in ten minutes' is not a Unix time in seconds"):
        launch.run_repeats(p, "recipe", "d", REPEAT_MODE)
    monkeypatch.delenv("BENCHLAB_DEADLINE")
    assert launch.deadline_from_env() is None


def test_a_repeat_counts_its_process_start_up_in_setup(dist_workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Repeat mode (the child process of one repeat): setup_s is the time since the process started, not only the
    # model's build, so that the repeat's line shows what a fresh process costs.
    write_params(dist_workdir, {})
    monkeypatch.setattr(launch, "process_age_s", lambda: 100.0)
    record = dist_workdir / "rec.json"
    run_main(bench.main, ["--variant", "fp32_baseline", "prep", "results", "steps", "--record-to", str(record)])
    rec = RunRecord.from_json(record.read_text())
    assert rec.status == "ok" and 100.0 < rec.setup_s < 160.0 and rec.eval_s is not None
    assert rec.startup_s == 100.0 and rec.exit_s is None  # the exit is the parent's to see


def test_a_repeat_process_ends_without_the_interpreter_s_teardown(dist_workdir: Path, tmp_path: Path) -> None:
    # The teardown (compile workers, CUDA context) only delays the parent; exit handlers are part of it. A
    # sitecustomize registers one that leaves a mark: the repeat must not run it, and must still write its record.
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    mark = tmp_path / "teardown_ran"
    (hooks / "sitecustomize.py").write_text(f"import atexit, pathlib\natexit.register(pathlib.Path({str(mark)!r}).touch)\n")
    env = {**os.environ, "PYTHONPATH": f"{hooks}{os.pathsep}{ROOT}"}
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    assert mark.exists()  # the hook works in a process that ends normally
    mark.unlink()
    write_params(dist_workdir, {})
    record = dist_workdir / "rec.json"
    proc = subprocess.run([sys.executable, "-m", "stages.bench", "--variant", "fp32_baseline", "prep", "results", "steps",
                           "--record-to", str(record)], cwd=dist_workdir, env=env, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert RunRecord.from_json(record.read_text()).status == "ok"
    assert not mark.exists()


# --- ranks: joining the group, the merged record, a failed job's last words -------------------------------------

def test_a_repeat_joins_the_group_with_its_variant_s_thread_block_limit(dist_workdir: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    write_params(dist_workdir, {"capped": {"parallel": "ddp", "nproc": 2, "nccl_max_ctas": 4}})
    seen: list[int] = []

    def init(device: torch.device, max_ctas: int = 0) -> torch.device:
        seen.append(max_ctas)
        raise RuntimeError("joined")

    monkeypatch.setattr(dist, "launched", lambda: True)
    monkeypatch.setattr(dist, "init", init)
    with pytest.raises(RuntimeError, match="joined"):
        launch.one_repeat(load_params(), "capped", "prep", dist_workdir / "rec.json")
    assert seen == [4]


def test_ranks_slice_one_global_batch_and_combine_by_the_slowest() -> None:
    x = torch.arange(8).view(4, 2)
    parts = [rank_slice((x, x + 1), r, 2)[0] for r in range(2)]
    assert torch.equal(torch.cat(parts), x)
    a = RunRecord(status="ok", losses=[2.0, 1.0], step_ms=[10.0, 5.0], memory={"peak_rss_mb": 100.0}, val_loss=3.0)
    b = RunRecord(status="ok", losses=[4.0, 3.0], step_ms=[8.0, 7.0], memory={"peak_rss_mb": 120.0}, val_loss=3.0)
    both = combine_ranks([a, b])
    assert both.step_ms == [10.0, 7.0] and both.losses == [3.0, 2.0] and both.world_size == 2
    assert both.memory["peak_rss_mb"] == 120.0 and both.rank_peak_mb == [100.0, 120.0]


def test_a_jobs_own_ranks_are_not_its_neighbours() -> None:
    """Seen on two H200s: each rank listed its partner as another GPU process and flagged the job."""
    def rank(pid: int, seen: list[int], ours: float, others: float) -> RunRecord:
        facts = {"pid": pid, "other_gpu_processes": seen, "cpu_busy_pct": ours + others,
                 "cpu_busy_ours_pct": ours, "cpu_busy_others_pct": others}
        return RunRecord(status="ok", step_ms=[1.0], losses=[2.0], neighbours=facts)

    alone = combine_ranks([rank(100, [101], 3.0, 3.5), rank(101, [100], 3.0, 4.0)]).neighbours
    assert alone["other_gpu_processes"] == [] and alone["cpu_busy_ours_pct"] == 6.0
    assert alone["cpu_busy_others_pct"] == pytest.approx(1.0)  # rank 1's 4.0 less rank 0's 3.0
    assert neighbours([RunRecord(status="ok", neighbours=alone)])["interference_suspected"] is False
    crowded = combine_ranks([rank(100, [101, 555], 3.0, 30.0), rank(101, [100], 3.0, 3.0)]).neighbours
    assert crowded["other_gpu_processes"] == [555] and crowded["cpu_busy_others_pct"] == pytest.approx(27.0)
    assert neighbours([RunRecord(status="ok", neighbours=crowded)])["interference_suspected"] is True


def test_torchrun_failure_summary_names_the_rank() -> None:
    summary = ("Root Cause (first observed failure):\n[0]:\n  time : x\n  host : h\n"
               "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 42)\n  error_file: <N/A>\n=====\n")
    assert last_words(summary) == "rank 1 (local_rank: 1) ended with exit code -9 (pid: 42)"
    assert last_words("noise\nerror: batch_size=3 does not split\n=====") == "batch_size=3 does not split"


# --- the profile stage: bench's run with the profiler stepped after each step --------------------------------------

def test_profile_traces_bench_s_run_in_one_process_and_on_two_ranks(dist_workdir: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    write_params(dist_workdir, {"ddp_2": {"parallel": "ddp", "nproc": 2}, "fp16": {"precision": "fp16"}})
    data = yaml.safe_load((dist_workdir / "params.yaml").read_text())
    data["profile"]["variants"] = ["fp32_baseline", "ddp_2", "fp16"]
    (dist_workdir / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    for name in ("fp32_baseline", "ddp_2", "fp16"):
        run_main(profile.main, ["--variant", name, "prep", "profiles"])
        assert capsys.readouterr().out.strip().splitlines()[-1] == f"profile@{name}: profiles/{name}_kernels.md"
    for name in ("fp32_baseline", "ddp_2"):
        table = (dist_workdir / "profiles" / f"{name}_kernels.md").read_text()
        assert table.startswith(f"# {name}: top ops by self CPU time\n\n{load_params().model}, batch 4 x 32, 1 traced "
                                "steps after 2 warm-up steps.\n\n| op |"), table
        with gzip.open(dist_workdir / "profiles" / f"{name}_trace.json.gz", "rt") as f:
            events = json.load(f)["traceEvents"]
        assert [e["name"] for e in events if e.get("name", "").startswith("ProfilerStep")] == ["ProfilerStep#2"]
    assert (dist_workdir / "profiles" / "fp16_kernels.md").read_text().startswith("Not profiled on cpu: precision=fp16")
    assert sorted(p.name for p in (dist_workdir / "profiles").iterdir()) == sorted(
        f"{name}_{kind}" for name in ("fp32_baseline", "ddp_2", "fp16") for kind in ("kernels.md", "trace.json.gz"))
