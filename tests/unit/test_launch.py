"""Where a variant's runs happen (benchlab/run/launch.py): repeats in fresh processes, the deadline, torchrun's ranks,
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

from benchlab.core.errors import LabError
from benchlab.core.params import load_params, parse_params
from benchlab.core.stage_main import run_main
from benchlab.run import dist, launch
from benchlab.run.data import load_tokens
from benchlab.run.launch import combine_ranks, last_words, repeat_cost, repeat_in_fresh_process
from benchlab.run.records import neighbours
from benchlab.run.runner import Measurement, rank_slice
from stages import bench, profile
from tests.conftest import ROOT, micro_params
from tests.unit.test_distributed import dist_workdir, write_params  # noqa: F401  (dist_workdir: a fixture)

# --- repeats: their cost, their processes and the deadline -----------------------------------------------------

def test_a_repeat_line_names_where_its_wall_time_went() -> None:
    rec = Measurement(status="ok", setup_s=9.04, warmup_s=2.5, window_wall_ms=3600.0, eval_s=0.44)
    assert repeat_cost(rec, 16.6) == ("16.6 s, start-up and build 9.0 s, warm-up and compile 2.5 s, timed 3.6 s, "
                                      "evaluation 0.4 s")
    rec = Measurement(status="ok", setup_s=9.04, startup_s=6.12, init_s=1.27, apply_s=1.65, warmup_s=2.5,
                    window_wall_ms=3600.0, eval_s=0.44, exit_s=5.96)
    assert repeat_cost(rec, 22.6) == ("22.6 s, start-up and build 9.0 s (of which interpreter, imports and device "
                                      "6.1 s, the model's seeded init 1.3 s, the knobs applied 1.6 s), warm-up and "
                                      "compile 2.5 s, timed 3.6 s, evaluation 0.4 s, exit 6.0 s")
    rec = Measurement(status="ok", setup_s=2.0, init_s=0.5)  # in-process: no start-up of its own
    assert repeat_cost(rec, 2.5) == "2.5 s, start-up and build 2.0 s (of which the model's seeded init 0.5 s)"
    assert repeat_cost(Measurement(status="oom"), 3.0) == "3.0 s"
    assert repeat_cost(Measurement(status="ok", window_wall_ms=100_000.0), 120.0) == "120.0 s, timed 100.0 s"


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


@pytest.mark.parametrize("seconds_left, ran", [(1000.0, 3), (100.0, 1), (130.0, 2), (120.0, 2)])
def test_a_deadline_stops_repeats_that_would_end_past_it(seconds_left: float, ran: int, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    # Repeats of 60, 50 and 50 s: the next one is judged by the shortest so far; one that would end exactly at
    # the deadline still runs (120 s left).
    clock, walls = FakeClock(), iter([60.0, 50.0, 50.0])

    def repeat(argv: list[str], nproc: int = 1) -> Measurement:
        assert argv == REPEAT_MODE
        clock.now += next(walls)
        return Measurement(status="ok")

    monkeypatch.setattr(launch, "time", clock)
    monkeypatch.setattr(launch, "repeat_in_fresh_process", repeat)
    monkeypatch.setenv("BENCHLAB_DEADLINE", str(clock.now + seconds_left))
    p = parse_params(micro_params(bench__repeats=3))
    assert len(launch.run_repeats(p, "recipe", "d", REPEAT_MODE)) == ran
    if ran < 3:
        assert capsys.readouterr().out.splitlines()[-1] == \
            f"bench@recipe: {ran} of 3 repeats: another would end past BENCHLAB_DEADLINE"


def test_a_passed_or_garbled_deadline_records_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    p = parse_params(micro_params(bench__repeats=3))
    monkeypatch.setattr(launch, "repeat_in_fresh_process", lambda *a, **k: pytest.fail("no repeat may start"))
    clock = FakeClock()
    monkeypatch.setattr(launch, "time", clock)
    for deadline in ("1", str(clock.now)):  # 1970, and the deadline reached exactly now
        monkeypatch.setenv("BENCHLAB_DEADLINE", deadline)
        with pytest.raises(LabError, match="BENCHLAB_DEADLINE passed before its first repeat; nothing recorded"):
            launch.run_repeats(p, "recipe", "d", REPEAT_MODE)
    monkeypatch.setenv("BENCHLAB_DEADLINE", "in ten minutes")
    with pytest.raises(LabError) as err:
        launch.run_repeats(p, "recipe", "d", REPEAT_MODE)
    assert str(err.value) == ("BENCHLAB_DEADLINE='in ten minutes' is not a Unix time in seconds; unset it or give one, "
                              "e.g. $(( $(date +%s) + 600 ))")
    monkeypatch.delenv("BENCHLAB_DEADLINE")
    assert launch.deadline_from_env() is None


def test_a_repeat_counts_its_process_start_up_in_setup(dist_workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Repeat mode (the child process of one repeat): setup_s is the time since the process started, not only the
    # model's build, so that the repeat's line shows what a fresh process costs.
    write_params(dist_workdir, {})
    monkeypatch.setattr(launch, "process_age_s", lambda: 100.0)
    record = dist_workdir / "rec.json"
    run_main(bench.main, ["--variant", "fp32_baseline", "prep", "results", "steps", "--record-to", str(record)])
    rec = Measurement.from_json(record.read_text())
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
    assert Measurement.from_json(record.read_text()).status == "ok"
    assert not mark.exists()


def test_repeats_run_in_fresh_processes_and_each_prints_its_line(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    clock, calls = FakeClock(), []
    records = iter([Measurement(status="ok", setup_s=2.0), Measurement(status="ok")])

    def repeat(*args: object, **kwargs: object) -> Measurement:
        calls.append((args, kwargs))
        clock.now += 30.0
        return next(records)

    monkeypatch.setattr(launch, "time", clock)
    monkeypatch.setattr(launch, "repeat_in_fresh_process", repeat)
    monkeypatch.setattr(launch, "train_variant", lambda *a, **k: pytest.fail("ran in the stage's own process"))
    p = parse_params(micro_params(bench__repeats=2))
    runs = launch.run_repeats(p, "recipe", "d", REPEAT_MODE)
    assert [r.setup_s for r in runs] == [2.0, None]
    assert calls == [((REPEAT_MODE,), {})] * 2
    place = f"variant {list(p.variants).index('recipe') + 1} of {len(p.variants)}"
    assert list(p.variants).index("recipe") == 1  # so that the place tells an off-by-one
    assert capsys.readouterr().out.splitlines() == [
        f"bench@recipe ({place}) repeat 1/2: ok (30.0 s, start-up and build 2.0 s)",
        f"bench@recipe ({place}) repeat 2/2: ok (30.0 s)"]


def test_one_repeat_runs_in_the_stage_s_own_process(prepared: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    calls = []

    p = parse_params(micro_params(bench__repeats=1))

    def train_variant(params, name, data, device, label, **kwargs):
        assert params is p
        calls.append((name, len(data.train), device.type, label, kwargs))
        return Measurement(status="oom", message="out of memory at batch size 4")

    monkeypatch.setattr(launch, "train_variant", train_variant)
    monkeypatch.setattr(launch, "repeat_in_fresh_process", lambda *a, **k: pytest.fail("a fresh process"))
    [rec] = launch.run_repeats(p, "recipe", str(prepared), REPEAT_MODE)
    label = f"bench@recipe (variant 2 of {len(p.variants)}) repeat 1/1"
    assert calls == [("recipe", len(load_tokens(prepared).train), "cpu", label, {"keep_going": True})]
    assert rec.status == "oom"
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"{label}: oom out of memory at batch size 4 (")


def test_a_failed_repeat_ends_the_variant_s_repeats(monkeypatch: pytest.MonkeyPatch) -> None:
    outcomes = iter([Measurement(status="ok"), Measurement(status="error", message="crashed"), Measurement(status="ok")])
    monkeypatch.setattr(launch, "repeat_in_fresh_process", lambda *a, **k: next(outcomes))
    p = parse_params(micro_params(bench__repeats=3))
    assert [r.status for r in launch.run_repeats(p, "recipe", "d", REPEAT_MODE)] == ["ok", "error"]


def test_a_parallel_variant_runs_every_repeat_on_its_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(launch, "repeat_in_fresh_process",
                        lambda *a, **k: calls.append((a, k)) or Measurement(status="ok"))
    p = parse_params(micro_params(bench__repeats=1))
    name = next(n for n, s in p.variants.items() if s.parallel != "none")
    launch.run_repeats(p, name, "d", REPEAT_MODE)
    assert calls == [((REPEAT_MODE,), {"nproc": p.variants[name].nproc})]


def test_a_variant_s_run_gets_bench_s_steps_and_the_progress_bar_on_rank_0(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(launch, "train_once", lambda *a, **k: calls.append((a, k)) or Measurement(status="ok"))
    p = parse_params(micro_params(bench__steps=9, harness__warmup_steps=4))
    cpu, data, hook = torch.device("cpu"), object(), object()
    launch.train_variant(p, "tf32", data, cpu, "lbl")  # type: ignore[arg-type]
    launch.train_variant(p, "tf32", data, cpu, "lbl", steps=5, keep_going=True, on_step=hook)  # type: ignore[arg-type]
    monkeypatch.setenv("RANK", "1")
    launch.train_variant(p, "tf32", data, cpu, "lbl")  # type: ignore[arg-type]
    args = (p, p.variants["tf32"], data, cpu)
    assert calls == [((*args, 9, 4), {"progress": "lbl", "on_step": None, "keep_going": False}),
                     ((*args, 5, 4), {"progress": "lbl", "on_step": hook, "keep_going": True}),
                     ((*args, 9, 4), {"progress": None, "on_step": None, "keep_going": False})]


def test_a_repeat_process_adds_its_start_up_to_the_run_s_setup(dist_workdir: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    p, calls = load_params(), []

    def train_variant(params, name, data, device, label, **kwargs):
        calls.append((params is p, name, len(data.train), device.type, label, kwargs))
        return Measurement(status="ok", setup_s=1.5)

    monkeypatch.setattr(launch, "train_variant", train_variant)
    monkeypatch.setattr(launch, "process_age_s", lambda: 100.0)
    launch.one_repeat(p, "fp32_baseline", "prep", dist_workdir / "rec.json")
    rec = Measurement.from_json((dist_workdir / "rec.json").read_text())
    assert (rec.setup_s, rec.startup_s) == (101.5, 100.0)
    assert calls == [(True, "fp32_baseline", len(load_tokens(dist_workdir / "prep").train), "cpu",
                      "bench@fp32_baseline", {"keep_going": True})]


def test_a_repeat_process_without_its_age_keeps_the_run_s_own_setup(dist_workdir: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def train_variant(p, name, data, device, label, **kwargs):
        calls.append((label, kwargs))
        return Measurement(status="ok", setup_s=1.5)

    monkeypatch.setattr(launch, "train_variant", train_variant)
    monkeypatch.setattr(launch, "process_age_s", lambda: None)  # /proc unreadable
    launch.one_repeat(load_params(), "fp32_baseline", "prep", dist_workdir / "rec.json")
    rec = Measurement.from_json((dist_workdir / "rec.json").read_text())
    assert (rec.setup_s, rec.startup_s) == (1.5, None)
    assert calls == [("bench@fp32_baseline", {"keep_going": True})]
    monkeypatch.setattr(launch, "train_variant", lambda *a, **k: Measurement(status="oom"))  # no setup_s
    monkeypatch.setattr(launch, "process_age_s", lambda: 3.0)
    launch.one_repeat(load_params(), "fp32_baseline", "prep", dist_workdir / "rec.json")
    rec = Measurement.from_json((dist_workdir / "rec.json").read_text())
    assert (rec.setup_s, rec.startup_s) == (None, None)


STAND_IN = """import json, os, sys
args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
if args.get("write", "1") == "1":
    record = {"status": "ok", "message": os.environ.get("PYTHONUNBUFFERED", "unset")}
    open(sys.argv[sys.argv.index("--record-to") + 1], "w").write(json.dumps(record))
sys.stderr.write(args.get("say", "") + "\\n")
sys.exit(int(args.get("exit", "0")))
"""


@pytest.fixture()
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module that plays a repeat: its arguments say what it writes, says on stderr and exits with."""
    (tmp_path / "stand_in.py").write_text(STAND_IN)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    return "stand_in"


def test_a_repeat_s_record_comes_back_from_its_unbuffered_process(stand_in: str) -> None:
    rec = repeat_in_fresh_process([stand_in])
    assert rec.status == "ok" and rec.message == "1"  # the child's output is not held back in a buffer
    assert rec.exit_s is not None and 0.0 <= rec.exit_s < 0.9


@pytest.mark.parametrize("code", [2, 130, 143])
def test_a_repeat_stopped_or_refused_stops_the_stage(stand_in: str, code: int, capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(LabError) as err:
        repeat_in_fresh_process([stand_in, "write=0", f"exit={code}", "say=error: bench.steps is too few"])
    assert str(err.value) == f"a repeat's process failed (exit {code}): bench.steps is too few"
    assert "error: bench.steps is too few" in capfd.readouterr().err  # the child's own words pass through


@pytest.mark.parametrize("args, code", [(["write=0", "exit=1"], 1), (["write=1", "exit=139"], 139), (["write=0"], 0)])
def test_a_crashed_repeat_is_the_variant_s_error_and_the_matrix_goes_on(stand_in: str, args: list[str],
                                                                        code: int) -> None:
    rec = repeat_in_fresh_process([stand_in, *args, "say=Segmentation fault " + "x" * 400])
    assert rec.status == "error"
    assert rec.message == f"the repeat's process died (exit {code}): Segmentation fault " + "x" * 281


def test_a_stage_s_children_die_with_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mark = tmp_path / "armed"
    # Runs in the child between fork and exec, as parent_watch.die_with_parent does there.
    monkeypatch.setattr(launch.parent_watch, "die_with_parent", lambda: mark.touch())
    assert launch._child([sys.executable, "-c", "pass"]).returncode == 0
    assert mark.exists()


def test_a_stage_on_ranks_passes_or_fails_with_its_job(stand_in: str, monkeypatch: pytest.MonkeyPatch,
                                                      capfd: pytest.CaptureFixture[str]) -> None:
    asked = []
    monkeypatch.setattr(dist, "torchrun_argv", lambda n, args: asked.append((n, args)) or [sys.executable, "-m", *args])
    launch.on_ranks(2, [stand_in, "write=0"])  # exit 0: nothing raised
    assert asked == [(2, [stand_in, "write=0"])]
    with pytest.raises(LabError) as err:
        launch.on_ranks(3, [stand_in, "write=0", "exit=1", "say=error: rank 2 refused"])
    assert str(err.value) == "the 3-rank torchrun job failed (exit 1): rank 2 refused"
    assert "error: rank 2 refused" in capfd.readouterr().err


def test_a_ranked_repeat_runs_under_torchrun_and_its_failure_names_the_job(stand_in: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    asked = []

    def torchrun_argv(nproc: int, module_args: list[str]) -> list[str]:
        asked.append((nproc, module_args))
        return [sys.executable, "-m", *module_args]

    monkeypatch.setattr(dist, "torchrun_argv", torchrun_argv)
    assert repeat_in_fresh_process([stand_in], nproc=2).status == "ok"
    assert asked == [(2, [stand_in])]
    with pytest.raises(LabError) as err:
        repeat_in_fresh_process([stand_in, "write=0", "exit=1", "say=rank 1 died"], nproc=2)
    assert str(err.value) == "the 2-rank torchrun job failed (exit 1): rank 1 died; nothing recorded"


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
    a = Measurement(status="ok", losses=[2.0, 1.0], step_ms=[10.0, 5.0], memory={"peak_rss_mb": 100.0}, val_loss=3.0,
                    gap_ms=[1.0, 9.0])
    b = Measurement(status="ok", losses=[4.0, 3.0], step_ms=[8.0, 7.0], memory={"peak_rss_mb": 120.0}, val_loss=3.0,
                    gap_ms=[2.0, 3.0])
    both = combine_ranks([a, b])
    assert both.step_ms == [10.0, 7.0] and both.losses == [3.0, 2.0] and both.world_size == 2
    assert both.gap_ms == [2.0, 9.0]  # the ranks wait for each other: a gap is the longest rank's
    assert combine_ranks([a, Measurement(status="ok", step_ms=[8.0, 7.0])]).gap_ms is None
    assert both.memory["peak_rss_mb"] == 120.0 and both.rank_peak_mb == [100.0, 120.0]


def test_ranks_combine_into_one_run() -> None:
    a = Measurement(status="ok", losses=[2.0], step_ms=[10.0, 5.0], warmup_s=1.0, window_wall_ms=None,
                  mem_growth_mb=3.0, val_loss=3.5, power_w=100.0, energy_j=10.0,
                  memory={"peak_mem_allocated_mb": 50.0, "peak_mem_reserved_mb": None, "peak_rss_mb": 900.0})
    b = Measurement(status="ok", losses=[4.0], step_ms=[8.0, 7.0], warmup_s=2.0, window_wall_ms=40.0,
                  mem_growth_mb=1.0, val_loss=9.9, power_w=120.0, energy_j=12.0,
                  memory={"peak_mem_allocated_mb": 70.0, "peak_mem_reserved_mb": None, "peak_rss_mb": 800.0})
    both = combine_ranks([a, b])
    assert (both.first_step_ms, both.warmup_s, both.window_wall_ms, both.mem_growth_mb) == (10.0, 2.0, 40.0, 3.0)
    assert both.val_loss == 3.5 and both.losses == [3.0]
    assert both.memory == {"peak_mem_allocated_mb": 70.0, "peak_mem_reserved_mb": None, "peak_rss_mb": 900.0}
    assert both.rank_peak_mb == [50.0, 70.0]  # allocated where measured, else the process's RSS
    assert (both.power_w, both.energy_j, both.power_note) == (220.0, 22.0, "")
    unread = Measurement(status="ok", power_note="NVML is not installed")
    assert combine_ranks([a, unread]).power_note == "NVML is not installed"
    none = combine_ranks([Measurement(status="ok"), Measurement(status="ok", power_w=5.0, energy_j=1.0)])
    assert none.rank_peak_mb == [0.0, 0.0] and none.first_step_ms is None and none.warmup_s is None
    assert none.power_w is None and none.energy_j is None and none.power_note == "a rank's board power was not read"
    alive = Measurement(status="ok", run=object())  # type: ignore[arg-type]
    assert combine_ranks([alive]).run is None  # a rank's live model is never merged
    broken = Measurement(status="oom", message="rank 1 ran out")
    assert combine_ranks([a, broken, Measurement(status="error")]) is broken


def test_a_rank_without_neighbour_facts_leaves_them_unmerged() -> None:
    facts = {"pid": 100, "other_gpu_processes": None, "cpu_busy_pct": 50.0, "cpu_busy_ours_pct": 40.0,
             "cpu_busy_others_pct": 10.0}
    assert combine_ranks([Measurement(status="ok", neighbours=facts), Measurement(status="ok")]).neighbours == facts
    assert combine_ranks([Measurement(status="ok"), Measurement(status="ok", neighbours=facts)]).neighbours == {}
    other = {**facts, "pid": 101, "cpu_busy_pct": 60.0, "cpu_busy_others_pct": 30.0}
    merged = combine_ranks([Measurement(status="ok", neighbours=facts), Measurement(status="ok", neighbours=other)])
    assert merged.neighbours == {"pid": 100, "other_gpu_processes": None, "cpu_busy_pct": 60.0,
                                 "cpu_busy_ours_pct": 80.0, "cpu_busy_others_pct": 0.0}


def test_a_jobs_own_ranks_are_not_its_neighbours() -> None:
    """Seen on two H200s: each rank listed its partner as another GPU process and flagged the job."""
    def rank(pid: int, seen: list[int], ours: float, others: float) -> Measurement:
        facts = {"pid": pid, "other_gpu_processes": seen, "cpu_busy_pct": ours + others,
                 "cpu_busy_ours_pct": ours, "cpu_busy_others_pct": others}
        return Measurement(status="ok", step_ms=[1.0], losses=[2.0], neighbours=facts)

    alone = combine_ranks([rank(100, [101], 3.0, 3.5), rank(101, [100], 3.0, 4.0)]).neighbours
    assert alone["other_gpu_processes"] == [] and alone["cpu_busy_ours_pct"] == 6.0
    assert alone["cpu_busy_others_pct"] == pytest.approx(1.0)  # rank 1's 4.0 less rank 0's 3.0
    assert neighbours([Measurement(status="ok", neighbours=alone)])["interference_suspected"] is False
    crowded = combine_ranks([rank(100, [101, 555], 3.0, 30.0), rank(101, [100], 3.0, 3.0)]).neighbours
    assert crowded["other_gpu_processes"] == [555] and crowded["cpu_busy_others_pct"] == pytest.approx(27.0)
    assert neighbours([Measurement(status="ok", neighbours=crowded)])["interference_suspected"] is True


def test_torchrun_failure_summary_names_the_rank() -> None:
    summary = ("Root Cause (first observed failure):\n[0]:\n  time : x\n  host : h\n"
               "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 42)\n  error_file: <N/A>\n=====\n")
    assert last_words(summary) == "rank 1 (local_rank: 1) ended with exit code -9 (pid: 42)"
    assert last_words("noise\nerror: batch_size=3 does not split\n=====") == "batch_size=3 does not split"


@pytest.mark.parametrize("stderr, words", [
    ("", "no message"),
    ("  \n", "no message"),
    ("first\nsecond\n  last one  \n", "last one"),
    ("error: one\nerror: two\n", "one"),
    ("noise\nstopped by the user at step 3 of 20; nothing recorded\nstopped again\ntail", "stopped by the user at step 3 of 20"),
    ("rank : 0 (local_rank: 0)\nexitcode : 1 (pid: 9)\ntraceback : Signal 9 (SIGKILL) received by PID 9\n",
     "rank 0 (local_rank: 0) ended with exit code 1 (pid: 9) (Signal 9 (SIGKILL) received by PID 9)"),
    ("rank : 0\nexitcode : 1\ntraceback : To enable traceback see: https://pytorch.org\n",
     "rank 0 ended with exit code 1"),
    ("exitcode : 1\nlast", "last"),
    ("rank : 3\nnothing else", "nothing else"),
    ("rank : 5\nexitcode : -6\nRoot Cause (first observed failure):\nrank : 1\nexitcode : -9\nrank : 0\n",
     "rank 1 ended with exit code -9"),
])
def test_a_failed_child_s_last_words(stderr: str, words: str) -> None:
    assert last_words(stderr) == words


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
