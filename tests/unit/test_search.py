"""The search (benchlab/search/: strategy.py, moves.py, journal.py, report.py) driven by a scripted
machine: what it tries, in what order, what it answers, what it spends, and how it resumes after a kill."""

import csv
import itertools
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest

from benchlab.core.errors import LabError
from benchlab.core.knobs import RunSettings, unoptimized
from benchlab.core.params import parse_params
from benchlab.search import report
from benchlab.search.explore import EXPLORE, Effects, Explorer, around
from benchlab.search.landscapes import BATCH, CONTEXT, RECIPE, RULES, Killed, Machine, family
from benchlab.search.journal import SCREENING, Journal, Entry
from benchlab.search.moves import (Candidate, Change, Problem, Warm, changes_from, knob_values, moves, partner, space)
from benchlab.search.pareto import area, front
from benchlab.search.sampler import GLOBAL, Sampler
from benchlab.search.explore import point as run_point
from benchlab.search.outcome import Answer, Outcome
from benchlab.search.strategy import Limits, Search
from tests.conftest import micro_params

SEPARABLE = family("separable")  # the scripted machine (benchlab/search/landscapes.py)
START_TPS, START_MB, FLOOR_MB = SEPARABLE.start_tps, SEPARABLE.start_mb, SEPARABLE.floor_mb
figures = SEPARABLE.figures


def limits(**kw: float) -> Limits:
    return Limits(**{"budget_s": 100_000.0, "max_candidates": 60, "confirm": 2, "repeats": 2, "lean_floor": 0.85,
                     "parity_tokens": 0.0, **kw})


def searcher(path: Path, machine: Machine, warm: list[Warm] | None = None, start: RunSettings = RECIPE,
             log: list[str] | None = None, **kw: float) -> Search:
    """A search on the scripted machine, its journal at `path` (opened afresh, as a new process would)."""
    return Search(Problem(start, RULES, BATCH), machine, Journal(path, CONTEXT), limits(**kw), warm,
                  log=(log.append if log is not None else lambda _: None))


def cand(*changes: Change) -> Candidate:
    return Candidate().plus(*changes)


def named(*changes: Change) -> str:
    return cand(*changes).name


PARAMS = parse_params(micro_params())
OURS = [Warm("fastest", PARAMS.variants["fastest"]), Warm("lean", PARAMS.variants["lean"])]  # aggregate.ours
SR = (("weight_dtype", "bf16"), ("optimizer", "adamw_bf16_sr"))  # the refused single's pair
FASTEST = named(("weight_dtype", "bf16"), ("loss", "onepass"), ("fp8", "blocks"), ("optimizer", "adamw_bf16_sr"),
                ("compile_mode", "reduce-overhead"))
GREEDY_LEAN = named(("weight_dtype", "bf16"), ("activation_checkpointing", "selective"), ("loss", "onepass"),
                    ("fp8", "blocks"), ("optimizer", "adamw_bf16_sr"), ("grad_accum", 2))  # where lean's path ends
LEAN = named(("weight_dtype", "bf16"), ("activation_checkpointing", "selective"), ("loss", "onepass"), ("fp8", "blocks"),
             ("optimizer", "adamw_bf16_sr"), ("compile_mode", "reduce-overhead"), ("grad_accum", 2))  # the front's


# ---- the scripted machine itself ----

def test_the_scripted_machine_multiplies_speeds_adds_memory_and_rewards_its_one_pair() -> None:
    assert figures({}) == (100_000.0, 10_000.0)
    assert figures({"loss": "onepass"}) == pytest.approx((106_000.0, 8_500.0))
    assert figures({"loss": "inline"}) == pytest.approx((99_000.0, 10_000.0))  # unlisted: 1% slower
    assert figures({"loss": "onepass", "compile_mode": "reduce-overhead"}) == pytest.approx((1.06 * 1.04 * 1.02e5, 9_000))
    assert figures({"activation_checkpointing": "full", "loss": "chunked", "grad_accum": 8})[1] == FLOOR_MB


# ---- moves ----

def test_a_speed_search_never_moves_a_knob_back_to_its_unoptimized_value_where_the_start_left_it() -> None:
    fastest = [c.name for c in moves(Candidate(), RECIPE, "fastest", BATCH)]
    assert fastest == ["precision=tf32", "precision=fp16", "weight_dtype=bf16", "activation_checkpointing=full",
                       "activation_checkpointing=selective", "loss=inline", "loss=chunked", "loss=fused", "loss=cce",
                       "loss=onepass", "fp8=blocks", "fp8=head", "fp8=all", "optimizer=adamw_compiled",
                       "optimizer=adamw_8bit", "optimizer=adamw_bf16_sr", "fused_clip=true",
                       "compile_mode=reduce-overhead", "compile_mode=max-autotune-no-cudagraphs",
                       "compile_mode=max-autotune"]
    lean = [c.name for c in moves(Candidate(), RECIPE, "lean", BATCH)]
    undone = {"precision=fp32", "attention=manual", "optimizer=adamw", "compile=false"}  # the recipe's four, undone
    assert undone <= set(lean) and not undone & set(fastest)  # a search for memory may undo them
    assert set(lean) - set(fastest) == undone | {"grad_accum=2", "grad_accum=4", "grad_accum=8"}


@pytest.mark.parametrize("start", ["recipe", "fastest", "lean", "fp32_baseline"])
def test_no_fastest_move_from_any_start_or_base_undoes_what_the_start_optimized(start: str) -> None:
    settings = PARAMS.variants[start]
    for base in (Candidate(), cand(("loss", "chunked")), cand(("fp8", "blocks"), ("compile_mode", "max-autotune"))):
        if base.changes and not settings.compile:
            continue  # compile modes need compile
        for move in moves(base, settings, "fastest", BATCH):
            knob, value = next((k, v) for k, v in move.changes if dict(base.changes).get(k) != v)
            assert not (value == unoptimized(knob) and getattr(settings, knob) != value), (start, move.name)


def test_micro_batch_moves_are_for_lean_only_and_keep_the_start_s_batch() -> None:
    def accum(goal: str, start: RunSettings, batch: int) -> list[str]:
        return [c.name for c in moves(Candidate(), start, goal, batch) if "grad_accum" in dict(c.changes)]

    assert accum("lean", RECIPE, 16) == ["grad_accum=2", "grad_accum=4", "grad_accum=8"]
    assert accum("lean", RECIPE, 12) == ["grad_accum=2", "grad_accum=4"]  # each a divisor of the batch
    assert accum("lean", replace(RECIPE, grad_accum=4), 16) == ["grad_accum=8"]  # only more micro-batches
    assert accum("fastest", RECIPE, 16) == []
    assert all(m.settings(RECIPE).batch_size is None for m in moves(Candidate(), RECIPE, "lean", 16))
    # an answer at another batch is an answer to another question: not a warm start
    assert changes_from(RECIPE, replace(RECIPE, batch_size=32)) is None
    assert changes_from(RECIPE, replace(RECIPE, loss="onepass")) == cand(("loss", "onepass"))


def test_a_speed_search_from_a_start_with_micro_batches_tries_the_whole_batch_at_once() -> None:
    names = [c.name for c in moves(Candidate(), replace(RECIPE, grad_accum=4), "fastest", BATCH)]
    assert "grad_accum=1" in names and "grad_accum=2" in names


def test_candidates_are_named_in_the_knob_table_s_order_and_a_change_replaces_its_knob() -> None:
    c = cand(("loss", "onepass")).plus(("precision", "fp32")).plus(("loss", "chunked"))
    assert c.name == "precision=fp32+loss=chunked" and c.settings(RECIPE) == replace(RECIPE, precision="fp32",
                                                                                    loss="chunked")
    assert Candidate().name == "start" and cand(("compile", False)).name == "compile=false"


# ---- partners ----

def test_a_refused_move_is_retried_with_the_partner_its_refusal_names(tmp_path: Path) -> None:
    machine = Machine()
    s = searcher(tmp_path / "journal.jsonl", machine)
    start = s.screen(Candidate(), "warm", None)
    runs = s.screen_or_partner(cand(("optimizer", "adamw_bf16_sr")), "moves", start)
    assert [(r.name, r.status) for r in runs] == [("optimizer=adamw_bf16_sr", "refused"), (named(*SR), "ok")]
    assert "weight_dtype='fp32' is not valid; expected bf16 with optimizer=adamw_bf16_sr" in runs[0].message
    assert machine.calls == ["screen:start", "screen:weight_dtype=bf16+optimizer=adamw_bf16_sr"]
    # a refusal that names no other knob has no partner, and nothing more is run
    assert s.screen_or_partner(cand(("fp8", "head"), ("loss", "onepass")), "moves", start)[0].status == "refused"
    assert len(machine.calls) == 2


def test_a_whole_search_screens_the_pair_where_the_single_is_refused(tmp_path: Path) -> None:
    machine = Machine()
    searcher(tmp_path / "journal.jsonl", machine).run()
    journal = Journal(tmp_path / "journal.jsonl", CONTEXT)
    assert journal.get("moves", "optimizer=adamw_bf16_sr").status == "refused"
    assert journal.get("moves", named(*SR)).tokens_per_sec == pytest.approx(1.03 * 1.02 * START_TPS)
    assert "screen:optimizer=adamw_bf16_sr" not in machine.calls


def test_fused_clip_is_retried_with_fused_adamw_when_the_start_lacks_it() -> None:
    start = replace(RECIPE, optimizer="adamw")
    single = cand(("fused_clip", True))
    reason = RULES(single.settings(start))
    assert reason is not None and reason.startswith("fused_clip=True is not valid")
    assert partner(single, reason, start, RULES) == cand(("optimizer", "adamw_fused"), ("fused_clip", True))


# ---- the whole search on the scripted machine ----

def test_the_search_finds_the_scripted_machine_s_fastest_and_lean(tmp_path: Path) -> None:
    machine = Machine()
    result = searcher(tmp_path / "journal.jsonl", machine).run()
    assert result.status == "ok"
    # fastest: the best single (onepass), then each move that helped, best first: the bf16_sr pair, CUDA graphs
    # (and their bonus with onepass), fp8; bf16 weights alone were already in the pair
    assert result.answer("fastest").name == FASTEST
    assert result.answer("fastest").ratio_to_start == pytest.approx(1.06 * 1.03 * 1.02 * 1.04 * 1.02 * 1.02)
    assert [r.name for r in result.paths["fastest"]] == ["start", "loss=onepass", named(*SR, ("loss", "onepass")),
                                                            named(*SR, ("loss", "onepass"),
                                                                  ("compile_mode", "reduce-overhead")), FASTEST]
    # lean: least memory at 85% of the start's speed or more; the chunked loss would take it to 82,545 tokens/s.
    # Its greedy path ends at the floor without CUDA graphs; the exploration of the front finds them faster there.
    assert result.paths["lean"][-1].name == GREEDY_LEAN
    assert result.answer("lean").name == LEAN and result.answer("lean").peak_mem_mb == FLOOR_MB
    assert result.answer("lean").tokens_per_sec == pytest.approx(1.03 * 1.02 * 0.9 * 1.06 * 1.02 * 0.95 * 1.04 * 1.02 *
                                                             START_TPS)
    assert result.answer("lean").parity == "learns the same"


def test_warm_starts_are_screened_first_right_after_the_start_and_searched_around(tmp_path: Path) -> None:
    machine = Machine()
    result = searcher(tmp_path / "journal.jsonl", machine, OURS).run()
    ours_fastest = changes_from(RECIPE, PARAMS.variants["fastest"])
    ours_lean = changes_from(RECIPE, PARAMS.variants["lean"])
    assert machine.of("screen")[:3] == ["start", ours_fastest.name, ours_lean.name]
    journal = Journal(tmp_path / "journal.jsonl", CONTEXT)
    screens = [r for r in journal.runs.values() if r.phase != "confirm"]  # the start's repeats come right after it
    assert [r.name for r in list(journal.runs.values())[:3]] == ["start", "start#1", "start#2"]
    assert [r.name for r in screens][:3] == machine.of("screen")[:3]
    assert all(r.phase == "warm" for r in screens[:3])
    # the fastest moves start from the best warm point (ours): the first in the knob table's order that the rules allow
    first = next(m for m in moves(ours_fastest, RECIPE, "fastest", BATCH) if RULES(m.settings(RECIPE)) is None)
    assert machine.of("screen")[3] == first.name == ours_fastest.plus(("activation_checkpointing", "full")).name
    assert result.paths["fastest"][0].name == ours_fastest.name


def test_a_stale_answer_from_another_device_or_software_is_not_used(tmp_path: Path) -> None:
    from benchlab.search.runs import warm_starts  # imports torch; no run here

    here = {**CONTEXT, "model": "gpt2_350m"}
    answer = knob_values(replace(RECIPE, fp8="blocks"))
    stale = knob_values(replace(RECIPE, precision="fp16", loss="fused", optimizer="adamw_8bit"))
    path = tmp_path / "journal.jsonl"
    lines = [(here, answer, "fastest"), ({**here, "device": "NVIDIA A100-SXM4-80GB"}, stale, "fastest"),
             ({**here, "torch": "2.9.0"}, stale, "lean"), ({**here, "memory_cap_gib": 24}, stale, "lean"),
             (CONTEXT, stale, "fastest")]  # this size's own answer from another code is not "elsewhere" either
    path.write_text("".join(json.dumps({"context": {**ctx, "source_sha256": "old"} if ctx is CONTEXT else ctx,
                                        **asdict(Entry(goal, values, "found", "ok"))}) + "\n"
                            for ctx, values, goal in lines))
    found = Journal(path, CONTEXT).found_elsewhere()
    assert found == [("fastest (gpt2_350m)", answer)]
    warm = warm_starts(PARAMS, found + [("fastest (gpt2_774m)", {"adam_state": "8bit"})])  # an old knob table
    assert [w.label for w in warm] == ["fastest", "lean", "fastest (gpt2_350m)"]
    assert warm_starts(PARAMS, [("lean (gpt2_350m)", knob_values(PARAMS.variants["lean"]))]) == warm[:2]  # once
    machine = Machine()
    searcher(path, machine, warm).run()
    assert machine.of("screen")[3] == "fp8=blocks" and Journal(path, CONTEXT).get("warm", "fp8=blocks") is not None
    stale_name = changes_from(RECIPE, RunSettings(**stale)).name
    assert stale_name not in machine.of("screen")


def test_the_answers_are_journaled_as_found_once_and_are_params_yaml_variants(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    result = searcher(path, Machine()).run()
    found = [json.loads(line) for line in path.read_text().splitlines() if json.loads(line)["phase"] == "found"]
    assert [(f["name"], f["context"]) for f in found] == [("fastest", CONTEXT), ("lean", CONTEXT)]
    variants = result.found_variants(RECIPE, "gpt2_124m")
    assert variants["fastest_gpt2_124m"] == found[0]["changes"] == {
        "precision": "bf16", "weight_dtype": "bf16", "attention": "sdpa", "loss": "onepass", "fp8": "blocks",
        "optimizer": "adamw_bf16_sr", "compile": True, "compile_mode": "reduce-overhead"}
    assert variants["lean_gpt2_124m"] == found[1]["changes"]
    p = parse_params(micro_params(variants={**micro_params()["variants"], **variants}))  # they load as variants
    assert p.variants["lean_gpt2_124m"] == cand(*Candidate(tuple(result.answer("lean").changes.items())).changes).settings(
        RECIPE) and p.variants["lean_gpt2_124m"].grad_accum == 2
    searcher(path, Machine()).run()
    assert sum(json.loads(line)["phase"] == "found" for line in path.read_text().splitlines()) == 2
    assert Outcome("ok").found_variants(RECIPE, "tiny") == {}


def test_a_start_that_does_not_run_stops_the_search(tmp_path: Path) -> None:
    machine = Machine()
    machine.screen = lambda c, s: Entry(c.name, {}, "", "oom", message="out of memory at 23.9 GiB")  # type: ignore
    result = searcher(tmp_path / "journal.jsonl", machine).run()
    assert result == Outcome("failed", "the start itself did not run (oom: out of memory at 23.9 GiB)")
    assert searcher(tmp_path / "other.jsonl", Machine(), budget_s=0).run() == Outcome(
        "failed", "the start itself did not run (the budget allowed no run)")


def test_a_candidate_that_fails_parity_gives_way_to_the_next(tmp_path: Path) -> None:
    machine = Machine(fails_parity=(FASTEST,))
    result = searcher(tmp_path / "journal.jsonl", machine).run()
    runner_up = named(*SR, ("loss", "onepass"), ("compile_mode", "reduce-overhead"))
    assert result.answer("fastest").name == runner_up
    assert machine.of("judge")[:2] == [FASTEST, runner_up]
    never = searcher(tmp_path / "never.jsonl", Machine(fails_parity=(FASTEST, runner_up))).run()
    assert never.answer("fastest") == Answer(message="none of the 2 confirmed candidates passed parity")


# ---- the front ----

def pareto(runs: list[Entry]) -> list[Entry]:
    return front(runs, run_point)


def point(name: str, tps: float | None, mem: float | None) -> Entry:
    return Entry(name, {}, "moves", "ok", tokens_per_sec=tps, peak_mem_mb=mem)


def test_the_front_drops_dominated_points_and_keeps_the_first_of_a_tie() -> None:
    a, b, c = point("a", 100.0, 50.0), point("b", 120.0, 80.0), point("c", 90.0, 40.0)
    beaten = [point("slower, more", 95.0, 60.0), point("as fast, more", 120.0, 81.0), point("slower, as much", 99.0, 50.0)]
    tie = point("tie", 100.0, 50.0)  # the same figures as `a`, after it
    assert [r.name for r in pareto([*beaten, a, b, c, tie])] == ["b", "a", "c"]
    assert [r.name for r in pareto([tie, a])] == ["tie"]
    assert pareto([]) == []


def test_a_run_without_a_memory_figure_takes_nobody_off_the_front() -> None:
    assert [r.name for r in pareto([point("a", 100.0, 50.0), point("no memory", 500.0, None)])] == ["a"]


def test_the_search_s_front_leaves_out_points_that_fail_parity(tmp_path: Path) -> None:
    machine = Machine()
    result = searcher(tmp_path / "journal.jsonl", machine).run()
    names = [r.name for r in result.front]
    assert names[0] == FASTEST and names[-1] == LEAN  # of the runs at the floor's memory, the fastest
    assert len(machine.of("judge")) == len(set(machine.of("judge")))  # no point judged twice
    assert set(names) <= set(machine.of("judge"))  # every point judged
    loser = names[1]
    again = Machine(fails_parity=(loser,))
    front = [r.name for r in searcher(tmp_path / "other.jsonl", again).run().front]
    assert loser not in front and set(front) >= set(names) - {loser}
    # what the loser hid comes onto the front: every screening run it alone dominated
    journal = Journal(tmp_path / "other.jsonl", CONTEXT)
    ok = [r for r in journal.runs.values() if r.phase in SCREENING and r.status == "ok" and r.name != loser]
    assert front == [r.name for r in pareto(ok)]


def test_the_front_csv_marks_the_answers_and_each_point_s_verdict(tmp_path: Path) -> None:
    result = searcher(tmp_path / "journal.jsonl", Machine()).run()
    journal = Journal(tmp_path / "journal.jsonl", CONTEXT)
    rows = list(csv.DictReader(report.front_csv(result, journal).splitlines()))
    assert list(rows[0]) == list(report.FRONT_COLUMNS)
    assert [r["name"] for r in rows] == [r.name for r in result.front]
    assert rows[0]["answer"] == "fastest" and all(r["parity"] == "passed" for r in rows)
    assert rows[-1]["peak_mem_mb"] == "1500" and rows[-1]["answer"] == "lean"
    assert [r["answer"] for r in rows[1:-1]] == [""] * (len(rows) - 2)


def test_lean_s_answer_is_on_the_front(tmp_path: Path) -> None:
    result = searcher(tmp_path / "journal.jsonl", Machine()).run()
    assert result.answer("lean").name in [r.name for r in result.front]


# ---- exploring the front ----

# The scripted machine's front at lean's floor (85% of the start's speed) or above, by brute force over every
# configuration the rules allow (scripts/search_vs_optuna.py, docs/search-vs-optuna.md): the fastest point, its
# 8-bit moments instead of bf16_sr, each with a micro-batch split and with selective checkpointing, and both.
EIGHT_BIT = cand(*dict(cand(("weight_dtype", "bf16"), ("loss", "onepass"), ("fp8", "blocks"), ("optimizer", "adamw_8bit"),
                            ("compile_mode", "reduce-overhead")).changes).items())
TOP = Candidate(tuple(dict(cand(("weight_dtype", "bf16"), ("loss", "onepass"), ("fp8", "blocks"),
                                ("optimizer", "adamw_bf16_sr"), ("compile_mode", "reduce-overhead")).changes).items()))
KNOWN_FRONT = [TOP.name, EIGHT_BIT.name, TOP.plus(("grad_accum", 2)).name, EIGHT_BIT.plus(("grad_accum", 2)).name,
               TOP.plus(("activation_checkpointing", "selective")).name,
               EIGHT_BIT.plus(("activation_checkpointing", "selective")).name, LEAN]


def explored(path: Path) -> list[str]:
    return [r.name for r in Journal(path, CONTEXT).runs.values() if r.phase == EXPLORE]


def sampled(path: Path) -> list[str]:
    return [r.name for r in Journal(path, CONTEXT).runs.values() if r.phase == GLOBAL]


def test_the_exploration_finds_the_scripted_machine_s_known_front(tmp_path: Path) -> None:
    machine, log = Machine(), []
    result = searcher(tmp_path / "journal.jsonl", machine, log=log).run()
    points = [figures(_changes_dict(n)) for n in KNOWN_FRONT]
    assert all(a[0] > b[0] and a[1] > b[1] for a, b in itertools.pairwise(points))  # slower for less memory, each
    floor = 0.85 * START_TPS
    assert [r.name for r in result.front if r.tokens_per_sec >= floor] == KNOWN_FRONT
    assert result.answer("fastest").name == KNOWN_FRONT[0] and result.answer("lean").name == KNOWN_FRONT[-1]
    # the goals' paths found one of the seven in 40 runs (the top); fastest's answer made leaner one run more (full
    # checkpointing, below the floor); the exploration, 8 runs more, the other six; then the global phase spends
    # what is left of max_candidates
    screens = machine.of("screen")
    assert len(screens) == 60 and screens[41:49] == explored(tmp_path / "journal.jsonl")[:8]
    assert screens[40] == TOP.plus(("activation_checkpointing", "full")).name
    assert set(screens[49:]) == set(sampled(tmp_path / "journal.jsonl")) | set(explored(tmp_path / "journal.jsonl")[8:])
    assert set(KNOWN_FRONT) - set(screens[:40]) == set(KNOWN_FRONT[1:]) <= set(screens[41:49])
    assert len(screens) == len(set(screens))  # no configuration screened twice
    # three passes: the last found nothing new, so the search stopped there with moves left it predicted useless
    passes = [line for line in log if line.startswith("search: explore pass ")]
    assert len(passes) == 3 and passes[-1] == "search: explore pass 3: 92 moves around the front's 7 points"


def _changes(name: str) -> list[Change]:
    return list(_changes_dict(name).items())


def _changes_dict(name: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in name.split("+"):
        knob, word = part.split("=")
        out[knob] = {"true": True, "false": False}.get(word, int(word) if word.isdigit() else word)
    return out


def test_the_exploration_stops_after_a_pass_that_adds_no_front_point(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    searcher(path, Machine()).run()
    journal = Journal(path, CONTEXT)
    seen = [r for r in journal.runs.values() if r.phase in SCREENING and r.phase != GLOBAL]  # as the exploration ended
    asked: list[str] = []
    log: list[str] = []
    # the whole front is measured: no move around it is predicted to add to it, and nothing is screened
    out = Explorer(seen, lambda c: asked.append(c.name), RECIPE, RULES, BATCH, 0.85 * START_TPS, log.append).run()
    assert out == [] and asked == [] and len(log) == 1
    # a machine slower than predicted: each move screened falls short, the pass ends when none is predicted to help
    # any more, and no second pass follows
    before = [r for r in seen if r.phase != EXPLORE]
    def worse(c: Candidate) -> Entry:
        return Entry(c.name, dict(c.changes), EXPLORE, "ok", tokens_per_sec=50_000.0, peak_mem_mb=9_000.0)

    log.clear()
    out = Explorer(before, worse, RECIPE, RULES, BATCH, 0.85 * START_TPS, log.append).run()
    assert 0 < len(out) < 67 and len(log) == 1, log  # pass 1 of 67 moves, cut short


def test_moves_around_a_front_point_take_partners_and_drop_a_return_to_the_start(tmp_path: Path) -> None:
    top = Entry(TOP.name, dict(TOP.changes), "fastest", "ok", tokens_per_sec=1.0, peak_mem_mb=1.0)
    names = [c.name for c in around(top, RECIPE, RULES, BATCH)]
    assert len(names) == len(set(names)) and TOP.name not in names
    assert EIGHT_BIT.name in names and TOP.plus(("grad_accum", 2)).name in names  # a speed and a memory move
    without_fp8 = named(*SR, ("loss", "onepass"), ("compile_mode", "reduce-overhead"))
    assert without_fp8 in names and "fp8=none" not in "".join(names)  # fp8 back to the start's value: no change
    # back to fused AdamW (the start's optimizer): the bf16_sr pair's optimizer is no longer a change
    assert named(("weight_dtype", "bf16"), ("loss", "onepass"), ("fp8", "blocks"),
                 ("compile_mode", "reduce-overhead")) in names
    # fp32 weights would leave adamw_bf16_sr alone, which the rules refuse, and no partner fits: left out
    assert all("weight_dtype=bf16" in n for n in names)
    assert all(RULES(Candidate().plus(*_changes(n)).settings(RECIPE)) is None for n in names)


def test_effects_are_fitted_from_the_runs_and_stop_at_the_memory_floor() -> None:
    def run(*changes: Change) -> Entry:
        tps, mem = figures(dict(changes))
        return Entry(named(*changes), dict(changes), "moves", "ok", tokens_per_sec=tps, peak_mem_mb=mem)

    runs = [run(), run(("loss", "onepass")), run(("grad_accum", 2)), run(("activation_checkpointing", "full")),
            run(("grad_accum", 8)),
            run(("activation_checkpointing", "full"), ("loss", "chunked"), ("grad_accum", 8)),  # at the floor
            run(("activation_checkpointing", "full"), ("loss", "onepass"), ("grad_accum", 8))]  # at the floor too
    effects = Effects(runs)
    assert effects.floor == FLOOR_MB
    guess = effects.predict(cand(("loss", "onepass"), ("grad_accum", 2)), runs[1])
    assert guess == pytest.approx(figures({"loss": "onepass", "grad_accum": 2}))  # from the measured base
    assert effects.predict(cand(("activation_checkpointing", "full"), ("grad_accum", 2)), runs[2])[1] == pytest.approx(
        10_000 - 1_500 - 5_000)
    assert effects.predict(cand(("activation_checkpointing", "full"), ("loss", "onepass"), ("grad_accum", 8)),
                           runs[3])[1] == FLOOR_MB  # 5,000 - 1,500 - 3,000: never below the floor
    assert effects.predict(cand(("fp8", "blocks")), runs[0]) is None  # never measured: no price
    assert area([(110.0, 50.0), (100.0, 20.0)], 90.0, 100.0) == 20 * 50 + 10 * 30


def test_the_exploration_respects_max_candidates_and_the_budget(tmp_path: Path) -> None:
    machine = Machine()
    result = searcher(tmp_path / "capped.jsonl", machine, max_candidates=44).run()
    assert len(machine.of("screen")) == 44 and len(explored(tmp_path / "capped.jsonl")) == 3  # 40, 1 leaner, 3
    assert result.answer("fastest").name == FASTEST and machine.of("repeat") and machine.of("judge")  # answers still
    # a budget for 45 screening runs and the reserve (the start's and 2 finalists a goal, 2 repeats each, at 10 s;
    # two verdicts at 8 s): the exploration stops after five, and confirmation and parity still fit
    budget = 45 * 10 + 10 * 10 + 2 * 8
    machine = Machine()
    result = searcher(tmp_path / "budget.jsonl", machine, budget_s=budget).run()
    assert len(machine.of("screen")) == 45 and len(explored(tmp_path / "budget.jsonl")) == 4
    assert result.answer("fastest").name and result.answer("lean").name
    assert Journal(tmp_path / "budget.jsonl", CONTEXT).spent_s() <= budget


def test_a_search_killed_at_any_run_of_the_exploration_resumes_without_repeating_one(tmp_path: Path) -> None:
    calls, phases, result = full_run(tmp_path)
    for i in [i for i, p in enumerate(phases) if p == "explore"]:
        path = tmp_path / f"killed-{i}.jsonl"
        with pytest.raises(Killed):
            searcher(path, Machine(kill_at=i + 1), OURS).run()
        again = Machine()
        assert searcher(path, again, OURS).run() == result
        assert again.calls == calls[i:], f"killed at run {i + 1}: a run repeated or left out"


# ---- the budget ----

def test_the_plan_line_says_how_many_runs_the_budget_buys(tmp_path: Path) -> None:
    log: list[str] = []
    s = searcher(tmp_path / "journal.jsonl", Machine(), log=log, budget_s=200, confirm=1, repeats=1)
    start = s.screen(Candidate(), "warm", None)
    # kept: 3 fresh-process repeats (the start, one per goal) at the start's screening run, 2 verdicts at its
    # overhead (10 s less its 2 timed)
    assert s.budget.reserve_s(start) == 3 * 10 + 2 * 8
    assert s.budget.plan_line(start) == ("search: budget 200 s: the start's screening run took 10.0 s, so about 14 more "
                                  "screening runs fit after 46 s kept for confirmation and parity")
    with_tokens = searcher(tmp_path / "j2.jsonl", Machine(), budget_s=200, confirm=1, repeats=1, parity_tokens=1e6)
    assert with_tokens.budget.reserve_s(with_tokens.screen(Candidate(), "warm", None)) == 3 * 10 + 2 * (8 + 10)


def test_spent_includes_confirmation_and_parity(tmp_path: Path) -> None:
    machine = Machine(repeat_s=25.0)
    result = searcher(tmp_path / "journal.jsonl", machine).run()
    journal = Journal(tmp_path / "journal.jsonl", CONTEXT)
    spent = 10 * len(machine.of("screen")) + 25 * len(machine.of("repeat")) + 8 * len(machine.of("judge"))
    assert journal.spent_s() == spent and machine.of("repeat") and machine.of("judge")
    facts = report.summary(result, journal, limits())
    assert facts["spent_s"] == spent and facts["runs"] == len(machine.of("screen"))


def test_screening_stops_early_enough_to_leave_the_reserve(tmp_path: Path) -> None:
    machine = Machine()
    result = searcher(tmp_path / "journal.jsonl", machine, budget_s=200, confirm=1, repeats=1).run()
    journal = Journal(tmp_path / "journal.jsonl", CONTEXT)
    screens = machine.of("screen")
    # every screening run began only where it, and the 46 s reserve after it, fit the budget
    assert len(screens) == 15 and 10 * len(screens) + 46 <= 200 < 10 * (len(screens) + 1) + 46
    # the reserve was what confirmation and parity then took: the start's, fastest's and lean's repeats, two verdicts
    assert machine.of("repeat") == ["start", result.answer("fastest").name, result.answer("lean").name]
    assert machine.of("judge")[:2] == [result.answer("fastest").name, result.answer("lean").name]
    assert journal.spent_s() == 150 + 30 + 16 and len(machine.of("judge")) == 2  # nothing left for the front


def test_the_whole_search_stays_within_its_budget_when_runs_cost_what_was_estimated(tmp_path: Path) -> None:
    machine = Machine()
    searcher(tmp_path / "journal.jsonl", machine, budget_s=200, confirm=1, repeats=1).run()
    assert len(machine.of("screen")) == 1 + 14  # as the plan line said
    assert Journal(tmp_path / "journal.jsonl", CONTEXT).spent_s() <= 200


def test_max_candidates_counts_runs_not_refusals(tmp_path: Path) -> None:
    machine = Machine()
    searcher(tmp_path / "journal.jsonl", machine, max_candidates=4, repeats=0).run()
    assert machine.of("screen") == ["start", "precision=tf32", "precision=fp16", "weight_dtype=bf16"]


# ---- the journal and resuming ----

def full_run(tmp_path: Path) -> tuple[list[str], list[str], dict]:
    """An uninterrupted search with warm starts: its calls, each call's phase, its result."""
    machine = Machine()
    result = searcher(tmp_path / "full.jsonl", machine, OURS).run()
    return machine.calls, call_phases(tmp_path / "full.jsonl"), result


def call_phases(path: Path) -> list[str]:
    """Each run's phase, from the journal's lines in order (a refusal or an answer is no run): the goals'
    screening runs are the combining, a verdict after the answers were journaled is the front's."""
    out, answered = [], False
    for entry in map(json.loads, path.read_text().splitlines()):
        answered = answered or entry["phase"] == "found"
        if entry["phase"] != "found" and entry["status"] != "refused":
            phase = {"fastest": "combine", "lean": "combine"}.get(entry["phase"], entry["phase"])
            out.append("front" if answered and phase == "parity" else phase)
    return out


@pytest.mark.parametrize("phase", ["warm", "moves", "combine", "explore", "global", "confirm", "parity", "front"])
def test_a_search_killed_in_any_phase_resumes_without_repeating_a_run(tmp_path: Path, phase: str) -> None:
    calls, phases, result = full_run(tmp_path)
    assert len(phases) == len(calls) and set(phases) == {"warm", "moves", "combine", "explore", "global", "confirm",
                                                         "parity", "front"}
    runs = [i for i, p in enumerate(phases) if p == phase]
    kill_at = runs[min(1, len(runs) - 1)] + 1  # the phase's second run where it has two (its first journaled)
    path = tmp_path / "killed.jsonl"
    first = Machine(kill_at=kill_at)
    with pytest.raises(Killed):
        searcher(path, first, OURS).run()
    assert first.calls == calls[: kill_at - 1]
    with path.open("a") as f:
        f.write('{"context": {"model": "gpt2_1')  # the line the kill cut short
    second = Machine()
    assert searcher(path, second, OURS).run() == result
    assert second.calls == calls[kill_at - 1:], "a finished run was repeated, or one was left out"
    third = Machine()
    assert searcher(path, third, OURS).run() == result and third.calls == []


def test_the_journal_drops_a_cut_last_line_and_keeps_other_contexts_lines(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "journal.jsonl"
    journal = Journal(path, CONTEXT)
    journal.add(Entry("start", {}, "warm", "ok", tokens_per_sec=1.0))
    other = json.dumps({"context": {**CONTEXT, "model": "gpt2_350m"}, **asdict(Entry("x", {}, "found", "ok"))})
    with path.open("a") as f:
        f.write(other + "\n")
    journal.add(Entry("loss=inline", {"loss": "inline"}, "moves", "ok", tokens_per_sec=2.0))
    with path.open("a") as f:
        f.write('{"context": {"mod')  # cut by a kill
    again = Journal(path, CONTEXT)
    assert list(again.runs) == [("warm", "start"), ("moves", "loss=inline")]
    assert [(ctx["model"], run.name) for ctx, run in again.others] == [("gpt2_350m", "x")]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(e["context"]["model"], e["name"]) for e in lines] == [("gpt2_124m", "start"), ("gpt2_350m", "x"),
                                                                   ("gpt2_124m", "loss=inline")]
    assert again.screened("loss=inline").tokens_per_sec == 2.0 and again.screened("x") is None
    assert Journal(path, {**CONTEXT, "batch_size": 32}).runs == {}  # another context starts afresh
    assert len(path.read_text().splitlines()) == 3  # and keeps every line


def test_a_candidate_screened_in_any_phase_is_not_measured_again(tmp_path: Path) -> None:
    machine = Machine()
    s = searcher(tmp_path / "journal.jsonl", machine)
    first = s.journal.add(Entry("loss=onepass", {"loss": "onepass"}, "moves", "ok", tokens_per_sec=1.0, peak_mem_mb=1.0))
    combined = s.journal.add(Entry(named(("loss", "onepass"), ("fp8", "blocks")), {}, "fastest", "ok", tokens_per_sec=1.0))
    assert s.screen(cand(("loss", "onepass")), "lean", None) is first
    assert s.screen(cand(("loss", "onepass"), ("fp8", "blocks")), "lean", None) is combined
    assert machine.calls == []


# ---- what it records ----

def test_where_a_run_s_time_went_is_recorded_in_the_candidates_file(tmp_path: Path) -> None:
    from benchlab.run.runner import Measurement
    from benchlab.search.runs import breakdown

    rec = Measurement(status="ok", startup_s=3.0, init_s=1.5, apply_s=0.5, warmup_s=4.0, window_wall_ms=600.0, eval_s=0.25,
                    compile_hits=6, compile_misses=0)
    parts = breakdown(rec, 10.0)
    assert parts == {"startup_s": 3.0, "build_s": 1.5, "apply_s": 0.5, "warmup_s": 4.0, "timed_s": 0.6, "eval_s": 0.25,
                     "other_s": pytest.approx(0.15), "compile_hits": 6, "compile_misses": 0}
    later = breakdown(Measurement(status="ok", init_s=1.0, warmup_s=2.0), 3.5)  # the worker's start paid already
    assert later["startup_s"] is None and later["timed_s"] is None and later["other_s"] == 0.5
    journal = Journal(tmp_path / "journal.jsonl", CONTEXT)
    journal.add(Entry("start", {}, "warm", "ok", tokens_per_sec=100.0, peak_mem_mb=5.0, wall_s=10.0, extra=parts))
    journal.add(Entry("loss=onepass", {"loss": "onepass"}, "moves", "ok", tokens_per_sec=110.0, peak_mem_mb=4.0,
                    wall_s=3.5, extra=later))
    journal.add(Entry("loss=cce", {"loss": "cce"}, "moves", "refused", message='needs "cce", or use loss=chunked'))
    text = report.candidates_csv(journal, 100.0)
    assert "\r" not in text and text.endswith("\n")
    rows = list(csv.DictReader(text.splitlines()))
    assert tuple(rows[0]) == report.CSV_COLUMNS == ("name", "phase", "status", "tokens_per_sec", "ratio_to_start",
                                                            "peak_mem_mb", "wall_s", "startup_s", "build_s", "apply_s",
                                                            "warmup_s", "timed_s", "eval_s", "compile_hits",
                                                            "compile_misses", "passed", "message")
    assert [rows[0][k] for k in report.BREAKDOWN] == ["3", "1.5", "0.5", "4", "0.6", "0.25"]
    assert rows[1]["startup_s"] == "" and rows[1]["ratio_to_start"] == "1.1" and rows[1]["wall_s"] == "3.5"
    assert rows[2]["message"] == 'needs "cce", or use loss=chunked' and rows[2]["tokens_per_sec"] == ""
    assert report.breakdown(journal) == {"wall_s": 6.75, "startup_s": 3.0, "build_s": 1.25, "apply_s": 0.5,
                                                "warmup_s": 3.0, "timed_s": 0.6, "eval_s": 0.25}


def test_the_summary_is_flat_and_names_what_was_spent(tmp_path: Path) -> None:
    result = searcher(tmp_path / "journal.jsonl", Machine()).run()
    journal = Journal(tmp_path / "journal.jsonl", CONTEXT)
    out = report.summary(result, journal, limits())
    assert out["fastest"] == FASTEST and out["lean"] == LEAN and out["start_tokens_per_sec"] == START_TPS
    assert out["refused"] == sum(r.status == "refused" for r in journal.runs.values()) > 0
    assert out["screening_run_s_median"] == 10.0 and out["front_points"] == len(result.front)
    assert all(not isinstance(v, (dict, list)) for v in out.values())
    failed = report.summary(Outcome("failed", "the start itself did not run"), journal, limits())
    assert failed["lean"] == "none: the start itself did not run" and failed["lean_tokens_per_sec"] is None


# ---- the global phase (sampler.py) ----

@pytest.mark.parametrize("name", ["interactions", "large", "noisy"])
def test_the_search_never_stops_with_runs_left_on_any_family(tmp_path: Path, name: str) -> None:
    machine, log = Machine(family(name, 1)), []
    searcher(tmp_path / "journal.jsonl", machine, log=log, max_candidates=90).run()
    screens = machine.of("screen")
    assert len(screens) == 90 and len(set(screens)) == 90  # its whole allowance, no configuration twice
    assert sampled(tmp_path / "journal.jsonl") and any(line.startswith("search: global phase") for line in log)


def test_a_small_space_is_measured_whole_and_then_the_search_stops(tmp_path: Path) -> None:
    few = {("loss", "onepass"), ("fp8", "blocks"), ("grad_accum", 2), ("compile_mode", "reduce-overhead")}

    def rules(settings: RunSettings) -> str | None:
        changed = {(k, getattr(settings, k)) for k in ("loss", "fp8", "grad_accum", "compile_mode", "precision",
                                                      "weight_dtype", "attention", "activation_checkpointing",
                                                      "optimizer", "fused_clip", "compile")
                   if getattr(settings, k) != getattr(RECIPE, k)}
        return None if changed <= few else "not in this small space"

    machine, log = Machine(), []
    s = Search(Problem(RECIPE, rules, BATCH), machine, Journal(tmp_path / "j.jsonl", CONTEXT),
               limits(max_candidates=1000), log=log.append)
    s.run()
    assert sorted(machine.of("screen")) == sorted({cand(*sub).name for n in range(5)
                                                   for sub in itertools.combinations(sorted(few), n)})  # all 16
    assert "search: every configuration the rules allow has been measured" in log


def test_a_refused_proposal_is_screened_with_its_partner_as_one_run() -> None:
    sampler = Sampler(space(BATCH), RECIPE, RULES, 85_000.0, seed=0)
    sampler.study.enqueue_trial({**{k: getattr(RECIPE, k) for k in space(BATCH)}, "optimizer": "adamw_bf16_sr"})
    proposal = sampler.propose(set())
    assert proposal == cand(*SR)  # the refused single came back with the partner its refusal names
    assert sampler.study.trials[-1].values == [0.0, 2.0] and sampler.study.trials[-1].constraints  # told: the worst
    sampler.study.enqueue_trial({**{k: getattr(RECIPE, k) for k in space(BATCH)}, "optimizer": "adamw_bf16_sr"})
    assert sampler.ask({cand(*SR).name}) is None  # its repair measured already: no run, and asked again


def test_every_run_is_told_to_the_sampler_once_with_its_floor(tmp_path: Path) -> None:
    sampler = Sampler(space(BATCH), RECIPE, RULES, 85_000.0, seed=0)
    runs = [Entry("start", {}, "warm", "ok", tokens_per_sec=100_000.0, peak_mem_mb=10_000.0),
            Entry("precision=tf32", {"precision": "tf32"}, "moves", "ok", tokens_per_sec=45_000.0, peak_mem_mb=14_000.0),
            Entry("loss=fused", {"loss": "fused"}, "moves", "oom", message="out of memory")]
    sampler.tell(runs)
    sampler.tell(runs)
    trials = sampler.study.trials
    assert len(trials) == 3 and trials[0].values == [100_000.0, 10_000.0] and trials[0].constraints == {
        "lean_floor": 0.0}
    assert trials[1].constraints["lean_floor"] > 0  # below the floor: infeasible
    assert trials[2].values == [0.0, 28_000.0]  # did not run: the worst point


def test_without_optuna_the_global_phase_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(LabError, match="needs optuna; install it with `pip install -r requirements.txt`"):
        Sampler(space(BATCH), RECIPE, RULES, 85_000.0, seed=0)


def test_lean_is_never_an_answer_that_fastest_beats_on_both_figures() -> None:
    fast = Answer("a", tokens_per_sec=146.0, peak_mem_mb=427.0)
    lean = Answer("b", tokens_per_sec=99.7, peak_mem_mb=442.0)
    assert Search.undominated({"fastest": fast, "lean": lean})["lean"] == fast
    leaner = replace(lean, peak_mem_mb=400.0)
    assert Search.undominated({"fastest": fast, "lean": leaner})["lean"] == leaner  # a trade: kept
    as_lean = replace(lean, peak_mem_mb=427.0)
    assert Search.undominated({"fastest": fast, "lean": as_lean})["lean"] == fast  # faster at equal memory
    nothing = Answer(message="no candidate was confirmed")
    assert Search.undominated({"fastest": nothing, "lean": lean})["lean"] == lean


def test_on_a_noisy_machine_speeds_within_the_spread_are_ties_on_the_front(tmp_path: Path) -> None:
    machine = Machine(family("noisy", 0))
    s = searcher(tmp_path / "journal.jsonl", machine, max_candidates=60)
    result = s.run()
    assert s.tie() == 0.01
    ok = [r for r in s.journal.runs.values() if r.phase in SCREENING and r.status == "ok"]
    assert [r.name for r in result.front] == [r.name for r in front(ok, run_point, tie=0.01)]
    assert len(result.front) > len(front(ok, run_point))  # the ties stay
