"""Screening in seconds (issue 50): candidates compiled ahead in parallel before their screening runs, nothing timed
meanwhile, one compile per model graph (benchlab/search/worker.py, runs.Runs.prepare, strategy.Search.prepare),
and the values screened on the fastest finalist alone (moves.FINALIST_ONLY)."""

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from benchlab.core.knobs import RunSettings
from benchlab.search import worker
from benchlab.search.journal import PRECOMPILE, SCREENING, Entry, Journal
from benchlab.search.landscapes import BATCH, CONTEXT, RECIPE, RULES, Killed, Machine
from benchlab.search.moves import FINALIST_ONLY, Candidate, Problem, space
from benchlab.search.strategy import FINALIST, Limits, Search

HELD = {f"{k}={v}" for k, v in FINALIST_ONLY}


class Ahead:
    """A fake prepare: records each batch between the machine's calls, costs `wall_s`."""

    def __init__(self, machine: Machine, wall_s: float = 5.0) -> None:
        self.machine, self.wall_s, self.batches = machine, wall_s, []

    def __call__(self, batch: list[tuple[Candidate, RunSettings]]) -> Entry:
        self.batches.append([c.name for c, _ in batch])
        self.machine._call("ahead", Candidate())  # killable, as a stop while compiling
        return Entry("", {}, "", "ok", wall_s=self.wall_s, extra={"precompiled": len(batch)})


def search(path: Path, machine: Machine, prepare: Any = None, **kw: Any) -> Search:
    limits = Limits(**{"budget_s": 100_000.0, "max_candidates": 60, "confirm": 1, "repeats": 1, "lean_floor": 0.85,
                       "finalist_only": True, **kw})
    if prepare is not None:
        machine.prepare = prepare  # type: ignore[method-assign]  # the machine compiles ahead through the fake
    problem = Problem(RECIPE, RULES, BATCH)
    return Search(problem, machine, Journal(path, CONTEXT, problem), limits, log=lambda _: None)


def test_a_cold_search_compiles_the_start_and_its_moves_ahead_before_it_screens_any(tmp_path: Path) -> None:
    machine = Machine()
    ahead = Ahead(machine)
    s = search(tmp_path / "j.jsonl", machine, ahead)
    result = s.run()
    assert result.status == "ok" and machine.calls[0] == "ahead:start"
    first = ahead.batches[0]
    assert first[0] == "start" and len(first) > 20  # the start and both goals' moves around it, in one batch
    one_change = [r.name for r in s.journal.runs.values() if r.phase in ("warm", "moves") and r.status != "refused"]
    assert len(one_change) > 20 and set(one_change) <= set(first)  # what it then screens was compiled ahead
    # refused moves are compiled as the partner they are screened with, never as themselves
    assert "optimizer=adamw_bf16_sr" not in first and "weight_dtype=bf16+optimizer=adamw_bf16_sr" in first
    assert not HELD & {kv for name in first for kv in name.split("+")}  # CUDA graphs, max-autotune: finalists only


def test_no_candidate_is_compiled_ahead_twice_nor_after_it_was_screened_and_the_cost_is_in_the_budget(
        tmp_path: Path) -> None:
    machine = Machine()
    ahead = Ahead(machine, wall_s=7.0)
    s = search(tmp_path / "j.jsonl", machine, ahead)
    s.run()
    names = [n for batch in ahead.batches for n in batch]
    assert len(names) == len(set(names)) > 20
    entries = [r for (phase, _), r in s.journal.runs.items() if phase == PRECOMPILE]
    assert [r.name for r in entries] == [f"batch {i + 1}" for i in range(len(ahead.batches))]
    assert s.journal.spent_s() == sum(r.wall_s for r in s.journal.runs.values())
    assert sum(r.wall_s for r in entries) == 7.0 * len(ahead.batches)
    # a resumed search reads the entries back (the journal's checks accept them) and compiles nothing again
    again = Ahead(Machine())
    search(tmp_path / "j.jsonl", again.machine, again).run()
    assert again.batches == [] and again.machine.calls == []


def test_nothing_is_timed_while_candidates_compile_ahead(tmp_path: Path) -> None:
    """Each batch is compiled whole before the next screening run starts: no screening call falls inside one."""
    events: list[str] = []
    machine = Machine()

    def prepare(batch: list[tuple[Candidate, RunSettings]]) -> Entry:
        events.append("ahead begins")
        assert not any(e == "screen begins" for e in events[-1:])
        events.append("ahead ends")
        return Entry("", {}, "", "ok", wall_s=1.0)

    def screen(cand: Candidate, settings: RunSettings) -> Entry:
        assert events[-1] != "ahead begins"
        events.append("screen begins")
        return Machine.screen(machine, cand, settings)

    s = search(tmp_path / "j.jsonl", machine, prepare)
    s.screen_run = screen
    s.run()
    assert events.count("ahead begins") == events.count("ahead ends") >= 2
    pairs = [events[i + 1] for i, e in enumerate(events) if e == "ahead begins"]
    assert pairs == ["ahead ends"] * len(pairs)


def test_a_batch_is_cut_to_the_runs_the_budget_has_left(tmp_path: Path) -> None:
    machine = Machine(screen_s=10.0, repeat_s=10.0, judge_s=8.0)
    ahead = Ahead(machine, wall_s=0.0)
    search(tmp_path / "j.jsonl", machine, ahead, budget_s=200.0).run()
    # 200 s less 3 fresh runs and 2 verdicts kept (46 s), at 10 s a screening run: 15 after the start
    assert all(len(batch) <= 15 for batch in ahead.batches[1:])
    assert len(machine.of("screen")) <= 16


def test_a_stop_while_compiling_ahead_resumes_without_repeating_a_screening_run(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    whole = Machine()
    search(tmp_path / "whole.jsonl", whole, Ahead(whole)).run()
    for kill_at in (1, 3, 12):
        path.unlink(missing_ok=True)
        machine = Machine(kill_at=kill_at)
        with pytest.raises(Killed):
            search(path, machine, Ahead(machine)).run()
        rest = Machine()
        search(path, rest, Ahead(rest)).run()
        screened = [c for c in machine.calls if c.startswith("screen:")] + [c for c in rest.calls if c.startswith("screen:")]
        assert len(screened) == len(set(screened)), kill_at
        assert sorted(screened) == sorted(c for c in whole.calls if c.startswith("screen:")), kill_at


# ---- finalist-only values ----

def test_cuda_graphs_and_max_autotune_are_screened_on_the_fastest_finalist_alone(tmp_path: Path) -> None:
    machine = Machine()
    s = search(tmp_path / "j.jsonl", machine)
    result = s.run()
    held_runs = [r for r in s.journal.runs.values() if r.phase in SCREENING and
                 any((k, v) in FINALIST_ONLY for k, v in r.changes.items())]
    assert held_runs and {r.phase for r in held_runs} == {FINALIST}
    assert len(held_runs) <= len(FINALIST_ONLY)
    base = {k: v for k, v in held_runs[0].changes.items() if k != "compile_mode"}
    assert all({k: v for k, v in r.changes.items() if k != "compile_mode"} == base for r in held_runs)
    # the scripted machine rewards reduce-overhead: the answer keeps it
    assert result.answer("fastest").changes["compile_mode"] == "reduce-overhead"
    assert all(v not in space(BATCH, FINALIST_ONLY)["compile_mode"] for _, v in FINALIST_ONLY)


def test_a_finalist_value_that_would_overrun_the_budget_is_not_tried(tmp_path: Path) -> None:
    """max-autotune costs ten fresh runs: with 150 s of room after the rest, it is left out; reduce-overhead (two)
    is tried."""
    machine = Machine(screen_s=10.0, repeat_s=10.0, judge_s=8.0)
    s = search(tmp_path / "j.jsonl", machine, budget_s=400.0, max_candidates=25)
    s.run()
    tried = [r.changes.get("compile_mode") for r in s.journal.runs.values() if r.phase == FINALIST]
    assert tried == ["reduce-overhead"]


def test_without_finalist_only_the_values_are_moves_like_any_other(tmp_path: Path) -> None:
    machine = Machine()
    s = search(tmp_path / "j.jsonl", machine, finalist_only=False)
    s.run()
    assert not any(r.phase == FINALIST for r in s.journal.runs.values())
    assert any(r.phase == "moves" and "compile_mode" in r.changes for r in s.journal.runs.values())


# ---- the worker's side ----

def test_candidates_that_differ_only_outside_the_model_graphs_are_compiled_once() -> None:
    recipe = replace(RECIPE, compile=True)
    a = worker.ahead(replace(recipe, optimizer="adamw_fused", fused_clip=True), "blocks")
    b = worker.ahead(replace(recipe, optimizer="adamw_8bit"), "blocks")
    c = worker.ahead(replace(recipe, loss="onepass"), "blocks")
    assert a == b != c and a is not None and a.compile_scope == "blocks"
    assert worker.ahead(recipe, "model") is None  # whole-model graphs depend on the depth
    assert worker.ahead(replace(recipe, compile_mode="reduce-overhead"), "blocks") is None
    assert worker.ahead(replace(recipe, compile=False), "blocks") is None


class FakeProc:
    """subprocess.Popen for compiling ahead: exits 1 for the loss=cce candidate, 0 for the others."""

    running: list["FakeProc"] = []
    started: list["FakeProc"] = []
    most = 0

    def __init__(self, args: list[str], env: dict[str, str], **kw: Any) -> None:
        self.args, self.env = args, env
        FakeProc.running.append(self)
        FakeProc.started.append(self)
        FakeProc.most = max(FakeProc.most, len(FakeProc.running))
        self.code = 1 if json.loads(Path(args[-1]).read_text())["loss"] == "cce" else 0

    def wait(self) -> int:
        FakeProc.running.remove(self)
        return self.code


def test_compiling_ahead_runs_so_many_processes_at_once_shares_the_cores_and_counts_failures(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(worker.subprocess, "Popen", FakeProc)
    FakeProc.running, FakeProc.started, FakeProc.most = [], [], 0
    seen = FakeProc.started
    batch = [replace(RECIPE, loss=loss) for loss in ("standard", "inline", "chunked", "cce", "onepass")]
    cost = worker.precompile(batch, "data/prepared", processes=2, cores=16)
    assert FakeProc.most == 2 and len(seen) == 5
    assert {p.env["TORCHINDUCTOR_COMPILE_THREADS"] for p in seen} == {"8"}
    assert all(p.args[1:5] == ["-m", "stages.search_worker", "data/prepared", "--precompile"] for p in seen)
    assert cost["precompiled"] == 5 and cost["precompile_failed"] == 1 and cost["wall_s"] >= 0


def test_on_a_cpu_or_with_no_processes_nothing_is_compiled_ahead(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from benchlab.search.runs import Runs

    runs = Runs.__new__(Runs)
    runs.p = SimpleNamespace(search=SimpleNamespace(screen_compile_scope="blocks", precompile_processes=8))
    runs.device, runs.compiled = SimpleNamespace(type="cpu"), set()
    assert runs.prepare([(Candidate(), replace(RECIPE, compile=True))]) is None
    runs.device = SimpleNamespace(type="cuda")
    runs.p.search.precompile_processes = 0
    assert runs.prepare([(Candidate(), replace(RECIPE, compile=True))]) is None


def test_the_journal_refuses_a_precompile_entry_that_names_a_candidate(tmp_path: Path) -> None:
    from benchlab.core.errors import LabError

    path = tmp_path / "j.jsonl"
    journal = Journal(path, CONTEXT, Problem(RECIPE, RULES, BATCH))
    journal.add(Entry("batch 1", {}, PRECOMPILE, "ok", wall_s=3.0))
    assert Journal(path, CONTEXT, Problem(RECIPE, RULES, BATCH)).spent_s() == 3.0
    journal.add(Entry("loss=onepass", {"loss": "onepass"}, PRECOMPILE, "ok", wall_s=3.0))
    with pytest.raises(LabError, match="line 2: a precompile entry named 'loss=onepass'"):
        Journal(path, CONTEXT, Problem(RECIPE, RULES, BATCH))
