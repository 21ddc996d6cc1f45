"""The search (benchlab/search.py) driven by a fake timing backend: what it tries, what it picks, how it resumes."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from benchlab import search
from benchlab.knobs import RunSettings
from benchlab.knobs import check_combination, unsupported_reason
from benchlab.search import Candidate, Change, Journal, Limits, Run, Search
from benchlab.skips import DeviceFacts
from tests.conftest import ROOT

RECIPE = RunSettings(precision="bf16", attention="sdpa", compile=True, optimizer="adamw_fused")
CONTEXT = {"model": "gpt2_124m", "batch": 16, "device": "fake"}

# The fake machine: each change multiplies the recipe's tokens/s and adds to its memory.
SPEED = {("loss", "onepass"): 1.06, ("compile_mode", "reduce-overhead"): 1.04, ("fp8", "blocks"): 1.02,
         ("loss", "chunked"): 0.97, ("activation_checkpointing", "full"): 0.8, ("precision", "fp32"): 0.3,
         ("activation_checkpointing", "selective"): 0.9, ("compile", False): 0.5}
MEMORY = {("activation_checkpointing", "full"): -5000, ("activation_checkpointing", "selective"): -3000,
          ("loss", "chunked"): -2000, ("loss", "onepass"): -1500, ("precision", "fp32"): 9000}


def fake_measure(calls: list[str]) -> search.Measure:
    def measure(cand: Candidate, settings: RunSettings) -> Run:
        calls.append(cand.name)
        tps, mem = 100_000.0, 10_000.0
        for change in cand.changes:
            tps *= SPEED.get(change, 0.99)
            mem += MEMORY.get(change, 0)
        return Run(cand.name, {}, "", "ok", tokens_per_sec=tps, peak_mem_mb=mem, wall_s=30.0)
    return measure


def passes_all(cand: Candidate, settings: RunSettings) -> Run:
    return Run(cand.name, {}, "", "ok", passed=True, message="learns the same")


def no_fp8_on_this_device(settings: RunSettings) -> str | None:
    return "fp8 needs compute capability 8.9" if settings.fp8 != "none" else None


def limits(**kw: float) -> Limits:
    return Limits(**{"budget_s": 10_000, "max_candidates": 200, "confirm": 2, "repeats": 2, "lean_floor": 0.85, **kw})


def run_search(tmp_path: Path, calls: list[str], rules: search.Rules = no_fp8_on_this_device, **kw: float) -> dict:
    journal = Journal(tmp_path / "journal.jsonl", CONTEXT)
    return Search(RECIPE, rules, fake_measure(calls), passes_all, journal, limits(**kw), log=lambda _: None).run()


def test_singles_change_one_searched_knob_each_and_never_repeat_the_recipe() -> None:
    names = [c.name for c in search.singles(RECIPE)]
    assert len(names) == len(set(names)) and "start" not in names
    assert "loss=onepass" in names and "precision=fp32" in names and "compile=false" in names
    assert "precision=bf16" not in names  # the recipe's own value
    assert not any(n.startswith(("nproc=", "parallel=", "batch_size=", "ddp_")) for n in names)
    assert search.choices("compile") == (False, True) and search.choices("nproc") == ()


def test_candidate_names_follow_the_knob_table_and_a_change_replaces_its_knob() -> None:
    cand = Candidate().plus(("loss", "onepass")).plus(("precision", "fp32")).plus(("loss", "chunked"))
    assert cand.name == "precision=fp32+loss=chunked"
    assert cand.settings(RECIPE) == replace(RECIPE, precision="fp32", loss="chunked")
    assert Candidate().name == "start" and Candidate((("compile", False),)).name == "compile=false"


def test_the_fake_machine_s_best_is_found(tmp_path: Path) -> None:
    calls: list[str] = []
    result = run_search(tmp_path, calls)
    assert result["status"] == "ok"
    # every change faster than the recipe, except fp8 (refused here) and the worse of two values of one knob
    assert result["fastest"]["name"] == "loss=onepass+compile_mode=reduce-overhead"
    assert result["fastest"]["ratio_to_start"] == pytest.approx(1.06 * 1.04)
    # least memory at 85% of the recipe's speed or more: full checkpointing (0.8x) is too slow
    assert result["lean"]["name"] == "activation_checkpointing=selective+loss=chunked"
    assert result["lean"]["peak_mem_mb"] == pytest.approx(10_000 - 3000 - 2000)
    assert not any("fp8=" in name for name in calls), "a refused candidate was run"


def test_every_run_is_journaled_and_a_resumed_search_repeats_nothing(tmp_path: Path) -> None:
    calls: list[str] = []
    first = fake_measure(calls)

    def killed_after_ten(cand: Candidate, settings: RunSettings) -> Run:
        if len(calls) == 10:
            raise KeyboardInterrupt
        return first(cand, settings)

    journal = Journal(tmp_path / "journal.jsonl", CONTEXT)
    with pytest.raises(KeyboardInterrupt):
        Search(RECIPE, no_fp8_on_this_device, killed_after_ten, passes_all, journal, limits(), log=lambda _: None).run()
    before = list(calls)
    with (tmp_path / "journal.jsonl").open("a") as f:
        f.write('{"context": {"model": "gpt2_1')  # a line cut short by the kill
    calls.clear()
    result = run_search(tmp_path, calls)
    assert not set(before) & set(calls), "a finished run was repeated"
    full: list[str] = []
    assert result == run_search(tmp_path / "fresh", full) and sorted(before + calls) == sorted(full)


def test_a_journal_from_another_context_is_not_used(tmp_path: Path) -> None:
    calls: list[str] = []
    run_search(tmp_path, calls)
    journal = Journal(tmp_path / "journal.jsonl", {**CONTEXT, "batch": 32})
    assert journal.runs == {} and (tmp_path / "journal.jsonl").read_text() == ""


def test_the_budget_stops_screening_and_the_record_says_what_ran(tmp_path: Path) -> None:
    calls: list[str] = []
    run_search(tmp_path, calls, budget_s=30 * 5, repeats=0)  # five 30-second runs
    journal = Journal(tmp_path / "journal.jsonl", CONTEXT)
    screened = [r for r in journal.runs.values() if r.phase == "singles" and r.status == "ok"]
    assert len(screened) == 5 and calls[0] == "start"
    csv = search.candidates_csv(journal, 100_000.0).splitlines()
    assert csv[0] == ",".join(search.CSV_COLUMNS)
    assert csv[1].startswith("start,singles,ok,1e+05,1,1e+04,30,")
    refused = [line for line in csv if ",refused," in line]
    assert refused and all("fp8 needs compute capability 8.9" in line for line in refused)


def test_max_candidates_counts_runs_not_refusals(tmp_path: Path) -> None:
    calls: list[str] = []
    run_search(tmp_path, calls, max_candidates=3, repeats=0)
    assert calls == ["start", "precision=fp32", "precision=tf32"]


def test_a_candidate_that_fails_parity_gives_way_to_the_next(tmp_path: Path) -> None:
    judged: list[str] = []

    def onepass_learns_differently(cand: Candidate, settings: RunSettings) -> Run:
        judged.append(cand.name)
        passed = settings.loss != "onepass"
        return Run(cand.name, {}, "", "ok", passed=passed, message="learns the same" if passed else "0.3 nats worse")

    journal = Journal(tmp_path / "journal.jsonl", CONTEXT)
    result = Search(RECIPE, no_fp8_on_this_device, fake_measure([]), onepass_learns_differently, journal,
                    limits(confirm=3), log=lambda _: None).run()
    assert result["fastest"]["name"] == "compile_mode=reduce-overhead"
    assert judged[0] == "loss=onepass+compile_mode=reduce-overhead"
    assert journal.get("parity", judged[0]).passed is False


def test_a_recipe_that_does_not_run_stops_the_search(tmp_path: Path) -> None:
    def oom(cand: Candidate, settings: RunSettings) -> Run:
        return Run(cand.name, {}, "", "oom", message="out of memory at 23.9 GiB")

    journal = Journal(tmp_path / "journal.jsonl", CONTEXT)
    result = Search(RECIPE, no_fp8_on_this_device, oom, passes_all, journal, limits(), log=lambda _: None).run()
    assert result == {"status": "failed", "message": "the recipe itself did not run (oom: out of memory at 23.9 GiB)"}


def test_found_variants_are_params_yaml_variants(tmp_path: Path) -> None:
    result = run_search(tmp_path, [])
    found = search.found_variants(result, RECIPE, "gpt2_124m")
    assert found["fastest_gpt2_124m"] == {"precision": "bf16", "attention": "sdpa", "loss": "onepass",
                                          "optimizer": "adamw_fused", "compile": True, "compile_mode": "reduce-overhead"}
    assert set(found) == {"fastest_gpt2_124m", "lean_gpt2_124m"}
    lines = (tmp_path / "journal.jsonl").read_text().splitlines()
    assert all(json.loads(line)["context"] == CONTEXT for line in lines)


H200 = DeviceFacts(kind="cuda", name="NVIDIA H200", capability=(9, 0), bf16=True, triton=True, torchao=True, liger=True,
                   liger_version="0.8.5", cce=True, gpu_count=1)
CPU = DeviceFacts(kind="cpu", name="cpu", cxx=True, torchao=True, cpu_count=2)


@pytest.mark.parametrize("device", [H200, CPU], ids=["h200", "cpu"])
def test_every_candidate_run_obeys_the_knobs_own_rules(tmp_path: Path, device: DeviceFacts) -> None:
    ran: list[RunSettings] = []
    measure = fake_measure([])

    def recording(cand: Candidate, settings: RunSettings) -> Run:
        ran.append(settings)
        return measure(cand, settings)

    journal = Journal(tmp_path / "journal.jsonl", CONTEXT)
    Search(RECIPE, search.rules_for(device, 16), recording, passes_all, journal, limits(), log=lambda _: None).run()
    for settings in ran:
        check_combination("", settings, 16)  # raises on a broken rule
        assert unsupported_reason(settings, device) is None, settings
    refused = {r.name: r.message for r in journal.runs.values() if r.status == "refused"}
    # a change that needs another: torchao's stochastic-rounding AdamW steps bf16 weights only
    assert "optimizer=adamw_bf16_sr" in refused and "weight_dtype" in refused["optimizer=adamw_bf16_sr"]
    if device is CPU:
        assert "fp8=blocks" in refused and "compile_mode=reduce-overhead" in refused
        assert not any(s.fp8 != "none" or s.compile_mode != "default" or s.precision == "fp16" for s in ran)
    else:
        assert "fp8=head" not in refused and "precision=fp16" not in refused
        # the float8 output layer is bypassed by the heads that multiply by its weight themselves
        rules = search.rules_for(H200, 16)
        assert "with fp8=head" in str(rules(replace(RECIPE, loss="onepass", fp8="head")))
        assert rules(replace(RECIPE, loss="onepass", fp8="blocks")) is None
        assert "a divisor of the batch size 16" in str(rules(replace(RECIPE, grad_accum=3)))


def test_the_summary_is_flat_and_names_what_was_spent(tmp_path: Path) -> None:
    result = run_search(tmp_path, [])
    journal = Journal(tmp_path / "journal.jsonl", CONTEXT)
    out = search.summary(result, journal, limits())
    assert out["fastest"] == "loss=onepass+compile_mode=reduce-overhead"
    assert out["fastest_ratio_to_start"] == pytest.approx(1.06 * 1.04) and out["start_tokens_per_sec"] == 100_000
    assert out["runs"] == journal.measured() and out["spent_s"] == 30.0 * out["runs"]
    assert all(not isinstance(v, (dict, list)) for v in out.values())
    failed = search.summary({"status": "failed", "message": "the recipe itself did not run"}, journal, limits())
    assert failed["lean"] == "none: the recipe itself did not run" and failed["lean_tokens_per_sec"] is None


def test_confirming_ranks_by_the_median_of_the_repeats_and_keeps_lean_above_its_floor(tmp_path: Path) -> None:
    fast_once = {"loss=onepass+compile_mode=reduce-overhead", "activation_checkpointing=selective+loss=chunked"}
    seen: list[str] = []
    measure = fake_measure(seen)

    def slower_on_repeats(cand: Candidate, settings: RunSettings) -> Run:
        run = measure(cand, settings)
        if cand.name in fast_once and seen.count(cand.name) > 1:
            run.tokens_per_sec = 80_000.0  # the repeats: below both the runner-up and lean's floor of 85,000
        return run

    journal = Journal(tmp_path / "journal.jsonl", CONTEXT)
    result = Search(RECIPE, no_fp8_on_this_device, slower_on_repeats, passes_all, journal, limits(confirm=3),
                    log=lambda _: None).run()
    assert result["fastest"]["name"] == "loss=onepass" and result["fastest"]["tokens_per_sec"] == pytest.approx(106_000)
    assert result["lean"]["name"] == "activation_checkpointing=selective+loss=onepass"
    assert result["lean"]["tokens_per_sec"] >= 85_000 and result["lean"]["peak_mem_mb"] == 10_000 - 3000 - 1500
    assert result["fastest"]["parity"] == "learns the same" and result["fastest"]["changes"] == {"loss": "onepass"}
    repeats = [r.name for r in journal.runs.values() if r.phase == "confirm"]
    assert "loss=onepass#1" in repeats and "loss=onepass#2" in repeats and "loss=onepass#3" not in repeats


def test_a_search_stopped_at_parity_resumes_without_repeating_a_run(tmp_path: Path) -> None:
    calls: list[str] = []
    judged: list[str] = []

    def judge_stopped_once(cand: Candidate, settings: RunSettings) -> Run:
        if not judged:
            judged.append("stopped")
            raise KeyboardInterrupt
        judged.append(cand.name)
        return passes_all(cand, settings)

    def start() -> dict:
        journal = Journal(tmp_path / "journal.jsonl", CONTEXT)
        return Search(RECIPE, no_fp8_on_this_device, fake_measure(calls), judge_stopped_once, journal, limits(),
                      log=lambda _: None).run()

    with pytest.raises(KeyboardInterrupt):
        start()
    before = len(calls)
    result = start()
    full: list[str] = []
    assert result == run_search(tmp_path / "fresh", full)
    assert sorted(calls) == sorted(full) and len(calls) > before  # lean's repeats ran only after the stop
    assert judged[1:] == [result["fastest"]["name"], result["lean"]["name"]]
    result_again = start()
    assert result_again == result and len(judged) == 3, "a finished verdict was judged again"


def test_when_no_candidate_learns_the_same_the_goal_says_so(tmp_path: Path) -> None:
    def never(cand: Candidate, settings: RunSettings) -> Run:
        return Run(cand.name, {}, "", "ok", passed=False, message="0.4 nats worse")

    journal = Journal(tmp_path / "journal.jsonl", CONTEXT)
    result = Search(RECIPE, no_fp8_on_this_device, fake_measure([]), never, journal, limits(), log=lambda _: None).run()
    assert result["fastest"] == {"name": None, "message": "none of the 2 confirmed candidates passed parity"}
    assert journal.get("parity", "loss=onepass+compile_mode=reduce-overhead").message == "0.4 nats worse"

    runs: list[str] = []

    def all_oom_on_repeats(cand: Candidate, settings: RunSettings) -> Run:
        run = fake_measure(runs)(cand, settings)
        return run if runs == ["start"] else Run(cand.name, {}, "", "oom", message="out of memory")

    journal = Journal(tmp_path / "other.jsonl", CONTEXT)
    result = Search(RECIPE, no_fp8_on_this_device, all_oom_on_repeats, never, journal, limits(),
                    log=lambda _: None).run()
    assert result["fastest"] == {"name": None, "message": "no candidate was confirmed"}


def test_the_journal_keeps_every_whole_line_of_its_context_and_rewrites_only_those(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "journal.jsonl"
    journal = Journal(path, CONTEXT)
    journal.add(Run("start", {}, "singles", "ok", tokens_per_sec=1.0))
    with path.open("a") as f:
        f.write('{"context": {"mod\n')  # a cut line in the middle, then more whole ones
        f.write(json.dumps({"context": {"other": 1}, **Run("x", {}, "singles", "ok").__dict__}) + "\n")
    journal.add(Run("loss=inline", {"loss": "inline"}, "fastest", "ok", tokens_per_sec=2.0))
    again = Journal(path, CONTEXT)
    assert list(again.runs) == [("singles", "start"), ("fastest", "loss=inline")]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(entry["context"], entry["name"]) for entry in lines] == [(CONTEXT, "start"), (CONTEXT, "loss=inline")]


def test_combining_runs_are_journaled_under_their_goal_and_logged_in_order(tmp_path: Path) -> None:
    said: list[str] = []
    journal = Journal(tmp_path / "journal.jsonl", CONTEXT)
    Search(RECIPE, no_fp8_on_this_device, fake_measure([]), passes_all, journal, limits(), log=said.append).run()
    assert said[:2] == ["search: singles #1: start", "search: singles #2: precision=fp32"]
    assert journal.get("fastest", "loss=onepass+compile_mode=reduce-overhead").tokens_per_sec == pytest.approx(110_240)
    assert journal.get("singles", "loss=onepass+compile_mode=reduce-overhead") is None
    assert journal.get("singles", "fp8=blocks").status == "refused"
    measured = [line for line in said if "#" in line]
    assert [int(line.split("#")[1].split(":")[0]) for line in measured] == list(range(1, len(measured) + 1))


def test_the_candidates_file_quotes_what_a_comma_or_quote_would_break(tmp_path: Path) -> None:
    import csv
    journal = Journal(tmp_path / "journal.jsonl", CONTEXT)
    journal.add(Run("start", {}, "singles", "ok", tokens_per_sec=100.0, peak_mem_mb=5.0, wall_s=1.0))
    journal.add(Run("loss=cce", {"loss": "cce"}, "singles", "refused", message='needs "cce", or use loss=chunked'))
    text = search.candidates_csv(journal, 100.0)
    assert "\r" not in text and text.endswith("\n")  # plain newlines, as every other file the lab writes
    rows = list(csv.DictReader(text.splitlines()))
    assert rows[1]["message"] == 'needs "cce", or use loss=chunked' and rows[1]["tokens_per_sec"] == ""
    assert rows[0]["ratio_to_start"] == "1" and rows[0]["peak_mem_mb"] == "5"
    out = search.summary({"status": "ok", "start": journal.get("singles", "start")}, journal, limits(budget_s=60))
    assert out == {"status": "ok", "runs": 1, "spent_s": 1.0, "budget_s": 60, "refused": 1,
                   "start_tokens_per_sec": 100.0, "start_peak_mem_mb": 5.0,
                   **{f"{goal}{key}": None for goal in ("fastest", "lean")
                      for key in ("_tokens_per_sec", "_ratio_to_start", "_peak_mem_mb")},
                   "fastest": "none: ", "lean": "none: "}


@pytest.mark.slow
def test_the_stage_searches_records_and_resumes(workdir: Path) -> None:
    """The real stage on a CPU: fresh-process screening runs, parity of the winners, outputs, and a rerun that
    repeats nothing."""
    data = yaml.safe_load((workdir / "params.yaml").read_text())
    data["parity"].update(steps=8, tail_steps=2, tolerance=5.0)
    data["search"] = {"start": "fp32_baseline", "budget_s": 600, "max_candidates": 3, "confirm": 1, "repeats": 1,
                      "lean_floor": 0.5}
    (workdir / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = lambda *args, stage="": subprocess.run([sys.executable, "-m", *args], cwd=workdir, capture_output=True,  # noqa: E731
                                                 text=True, env={**env, "DVC_STAGE": stage})
    assert run("stages.prepare", "prep", stage="prepare").returncode == 0
    early = run("stages.search", "prep", "rec/reference-seeds.json", "out", "search.json")
    assert early.returncode != 0 and "rec/reference-seeds.json is missing or unreadable" in early.stderr
    assert run("stages.parity", "prep", "rec", "curves", stage="parity_reference").returncode == 0
    first = run("stages.search", "prep", "rec/reference-seeds.json", "out", "search.json")
    assert first.returncode == 0, first.stderr
    # the start, then the first singles in the knob table's order; fp16 and bf16 weights are refused on a CPU
    assert [line.split(": ")[-1] for line in first.stdout.splitlines() if line.startswith("search: singles #")] == \
        ["start", "precision=tf32", "precision=bf16"]
    rows = (workdir / "out/candidates.csv").read_text().splitlines()
    assert rows[0] == ",".join(search.CSV_COLUMNS) and any(r.startswith("precision=fp16,singles,refused,") for r in rows)
    summary = json.loads((workdir / "search.json").read_text())
    assert summary["runs"] == 3 and summary["start_tokens_per_sec"] > 0 and summary["fastest_tokens_per_sec"] > 0
    found = yaml.safe_load((workdir / "out/found.yaml").read_text())["variants"]
    assert set(found) == {"fastest_tiny", "lean_tiny"}
    again = run("stages.search", "prep", "rec/reference-seeds.json", "out", "search.json")
    assert again.returncode == 0 and "#" not in again.stdout and "parity of" not in again.stdout, again.stdout
    assert json.loads((workdir / "search.json").read_text()) == summary


def test_the_summary_counts_refusals_and_gives_each_goal_s_own_reason(tmp_path: Path) -> None:
    result = run_search(tmp_path, [])
    journal = Journal(tmp_path / "journal.jsonl", CONTEXT)
    refused = [r for r in journal.runs.values() if r.status == "refused"]
    assert refused and all("fp8" in r.name for r in refused)  # this fake device refuses fp8 alone
    assert search.summary(result, journal, limits())["refused"] == len(refused) < len(journal.runs)
    done = search.summary({"status": "done", "message": "overall", "lean": {"message": "no candidate learns the same"}},
                          journal, limits())
    assert done["lean"] == "none: no candidate learns the same" and done["fastest"] == "none: overall"


def test_a_budget_that_allows_no_run_says_so(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl", CONTEXT)
    result = Search(RECIPE, no_fp8_on_this_device, fake_measure([]), passes_all, journal, limits(budget_s=0),
                    log=lambda _: None).run()
    assert result == {"status": "failed", "message": "the recipe itself did not run (the budget allowed no run)"}


def test_a_combination_the_knobs_refuse_is_refused_by_their_own_message() -> None:
    rules = search.rules_for(DeviceFacts(kind="cpu", name="cpu", cxx=True), batch=8)
    assert rules(RunSettings(nproc=2)) == ("nproc=2 is not valid; expected 1 with parallel=none (set parallel=ddp or "
                                           "parallel=fsdp2 to run more processes)")
    assert rules(RunSettings(precision="fp16")) == "precision=fp16 with loss scaling needs a CUDA GPU; use bf16 or fp32 on CPU"
    assert rules(RunSettings()) is None


# Combining, step by step, on a scripted machine: each candidate's tokens/s and memory are given by name, so
# ties, interactions and the lean floor's edge are set exactly where a greedy search must decide.
A, B, D = ("loss", "onepass"), ("compile_mode", "reduce-overhead"), ("activation_checkpointing", "selective")
R = ("fused_clip", True)  # refused alone, allowed once loss=onepass is in (a rule made up for the test)


def cand(*changes: Change) -> Candidate:
    out = Candidate()
    for change in changes:
        out = out.plus(change)
    return out


def named(*changes: Change) -> str:
    return cand(*changes).name


def single(change: Change, tps: float | None, mem: float | None, status: str = "ok") -> Run:
    return Run(named(change), dict([change]), "singles", status, tokens_per_sec=tps, peak_mem_mb=mem, wall_s=30.0)


def scripted(tmp_path: Path, results: dict[str, tuple[float, float]], calls: list[str],
             lean_floor: float = 0.85) -> Search:
    def measure(candidate: Candidate, settings: RunSettings) -> Run:
        calls.append(candidate.name)
        tps, mem = results[candidate.name]
        return Run(candidate.name, {}, "", "ok", tokens_per_sec=tps, peak_mem_mb=mem, wall_s=30.0)

    def r_needs_a(settings: RunSettings) -> str | None:
        return "fused_clip needs loss=onepass here" if settings.fused_clip and settings.loss != "onepass" else None

    journal = Journal(tmp_path / "journal.jsonl", CONTEXT)
    return Search(RECIPE, r_needs_a, measure, passes_all, journal, limits(lean_floor=lean_floor, repeats=0),
                  log=lambda _: None)


START = Run("start", {}, "singles", "ok", tokens_per_sec=100_000.0, peak_mem_mb=10_000.0)


def test_fastest_keeps_a_combination_only_when_it_is_strictly_faster_and_retries_the_refused_singles(
        tmp_path: Path) -> None:
    calls: list[str] = []
    results = {named(A, B): (150_000.0, 13_000.0),  # no faster than A alone: a tie is not kept
               named(A, D): (160_000.0, 11_000.0), named(A, D, R): (170_000.0, 11_500.0)}
    runs = [single(B, 120_000.0, 9_000.0), single(A, 150_000.0, 12_000.0), single(D, 110_000.0, 10_000.0),
            single(R, None, None, "refused")]
    ranked = scripted(tmp_path, results, calls).combine("fastest", START, runs)
    assert calls == [named(A, B), named(A, D), named(A, D, R)]  # from the best single, one change at a time
    assert [r.name for r in ranked] == [named(A, D, R), named(A, D)]  # the two fastest, fastest first


def test_lean_keeps_only_combinations_at_or_above_the_floor_and_ranks_by_memory(tmp_path: Path) -> None:
    calls: list[str] = []
    results = {named(A, B): (49_000.0, 5_000.0),  # the least memory, but below half the start's speed
               named(A, D): (50_000.0, 6_500.0)}  # exactly at the floor: kept
    runs = [single(D, 100_000.0, 9_500.0), single(A, 90_000.0, 7_000.0), single(B, 95_000.0, 8_000.0),
            single(R, 40_000.0, 1_000.0)]  # below the floor alone: never a starting point
    ranked = scripted(tmp_path, results, calls, lean_floor=0.5).combine("lean", START, runs)
    assert calls == [named(A, B), named(A, D)]
    assert [r.name for r in ranked] == [named(A, D), named(A)]


def test_a_lean_candidate_exactly_at_the_floor_is_confirmed(tmp_path: Path) -> None:
    search_ = scripted(tmp_path, {}, [], lean_floor=0.5)
    at_floor = Run(named(A), dict([A]), "lean", "ok", tokens_per_sec=50_000.0, peak_mem_mb=6_000.0)  # 0.5 x 100k
    assert search_.eligible("lean", at_floor, START)
    assert search_.confirm("lean", START, [at_floor])["name"] == named(A)


def test_a_run_that_did_not_finish_ok_is_never_eligible_even_with_a_speed(tmp_path: Path) -> None:
    diverged = Run("x", {}, "singles", "diverged", tokens_per_sec=500_000.0, peak_mem_mb=1.0)
    assert not scripted(tmp_path, {}, []).eligible("fastest", diverged, START)
    assert not scripted(tmp_path, {}, []).eligible("lean", diverged, START)


def test_a_candidate_screened_in_any_phase_is_not_measured_again_in_another(tmp_path: Path) -> None:
    calls: list[str] = []
    search_ = scripted(tmp_path, {}, calls)
    first = search_.journal.add(single(A, 150_000.0, 12_000.0))
    lean = search_.journal.add(Run(named(A, D), dict([A, D]), "lean", "ok", tokens_per_sec=1.0, peak_mem_mb=1.0))
    assert search_.screen(cand(A), "fastest") is first
    assert search_.screen(cand(A, D), "fastest") is lean
    assert calls == []


def test_a_budget_spent_while_combining_keeps_what_was_measured(tmp_path: Path) -> None:
    calls: list[str] = []
    measured_singles = [c for c in search.singles(RECIPE) if not no_fp8_on_this_device(c.settings(RECIPE))]
    result = run_search(tmp_path, calls, budget_s=30 * (1 + len(measured_singles)), repeats=0)
    assert len(calls) == 1 + len(measured_singles)  # the start and every single; no combination
    assert result["status"] == "ok" and result["fastest"]["name"] == "loss=onepass"
