"""benchlab/search/journal.py: the journal is checked, not trusted. A run read back must be one the search could have
written (a combination the knob rules accept, named by its changes, after the runs it rests on); a bad or forged line
is refused in one line naming the journal, the line and how to start over; a cut last line is reported."""

import io
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from benchlab.core.errors import LabError
from benchlab.core.knobs import RunSettings
from benchlab.core.skips import DeviceFacts
from benchlab.search.journal import Entry, Journal
from benchlab.search.moves import Candidate, Problem, knob_values, rules_for
from benchlab.search.strategy import Limits, Search

START = RunSettings(precision="bf16", attention="sdpa", compile=True, optimizer="adamw_fused")
GPU = DeviceFacts(kind="cuda", name="a test GPU", capability=(9, 0), bf16=True, triton=True, torchao=True, liger=True,
                  liger_version="0.8.5", cce=True, gpu_count=1)
BATCH = 8
CHECKS = Problem(START, rules_for(GPU, BATCH), BATCH)
# A start that sets a knob the search leaves alone (compile_scope), whose answers carry it, and 4 micro-batches,
# from which a search for speed may screen grad_accum=1 and 2.
START_BLOCKS = replace(START, compile_scope="blocks", grad_accum=4)
CHECKS_BLOCKS = Problem(START_BLOCKS, rules_for(GPU, BATCH), BATCH)
CONTEXT = {"model": "tiny", "batch_size": BATCH, "device": "a test GPU", "torch": "x.y", "memory_cap_gib": None}


def measured(cand: Candidate, settings: RunSettings) -> Entry:
    """A stand-in run: each change adds 3% speed and takes 100 MiB off the start's 5000 (a figure, not a model)."""
    n = len(cand.changes)
    return Entry(cand.name, {}, "", "ok", tokens_per_sec=1000.0 * 1.03 ** n, peak_mem_mb=5000.0 - 100 * n, wall_s=1.0)


def judged(cand: Candidate, settings: RunSettings) -> Entry:
    return Entry(cand.name, {}, "", "ok", passed=True, message="learns the same", wall_s=1.0)


class StandIn:
    """A device whose runs are `measured` and `judged`, and that compiles ahead as the stage's does on a GPU."""

    screen = repeat = staticmethod(measured)
    judge = staticmethod(judged)

    def prepare(self, batch: list) -> Entry:
        return Entry("", {}, "", "ok", wall_s=3.0, extra={"candidates": [cand.name for cand, _ in batch]})


def searched_journal(path: Path, checks: Problem = CHECKS) -> list[str]:
    """The journal of a whole search (compiling ahead, screening, confirmation, parity, answers), its lines."""
    limits = Limits(budget_s=10_000.0, max_candidates=12, confirm=1, repeats=1, lean_floor=0.5, parity_tokens=0.0)
    Search(checks, StandIn(), Journal(path, CONTEXT, checks), limits).run()
    return path.read_text().splitlines()


def line(run: Entry, context: dict = CONTEXT) -> str:
    return json.dumps({"context": context, **asdict(run)})


@pytest.mark.parametrize("checks, kept", [(CHECKS, {}), (CHECKS_BLOCKS, {"compile_scope": "blocks"})],
                         ids=["start", "a start with a knob the search leaves alone"])
def test_every_line_a_search_writes_passes_the_checks(tmp_path: Path, checks: Problem, kept: dict) -> None:
    lines = searched_journal(tmp_path / "journal.jsonl", checks)
    phases = {json.loads(text)["phase"] for text in lines}
    assert {"precompile", "warm", "moves", "confirm", "parity", "found"} <= phases, phases
    again = Journal(tmp_path / "journal.jsonl", CONTEXT, checks)
    assert len(again.runs) == len(lines) and (tmp_path / "journal.jsonl").read_text().splitlines() == lines
    answer = again.get("found", "fastest")
    assert answer is not None and kept.items() <= answer.changes.items()  # the answer holds it as the start did


def test_runs_the_search_writes_in_rarer_cases_are_read_back(tmp_path: Path) -> None:
    """From a start of 4 micro-batches a search for speed screens 1 and 2; a verdict may fail; a confirmation
    may be the second."""
    path = tmp_path / "journal.jsonl"
    runs = [Entry("start", {}, "warm", "ok", tokens_per_sec=1000.0, peak_mem_mb=5000.0, wall_s=1.0),
            Entry("batch 1", {}, "precompile", "ok", wall_s=30.0, extra={"candidates": ["grad_accum=1"]}),
            Entry("grad_accum=1", {"grad_accum": 1}, "moves", "ok", tokens_per_sec=1100.0, peak_mem_mb=9000.0),
            Entry("grad_accum=2", {"grad_accum": 2}, "moves", "ok", tokens_per_sec=1050.0, peak_mem_mb=7000.0),
            Entry("grad_accum=1#2", {"grad_accum": 1}, "confirm", "ok", tokens_per_sec=1090.0),
            Entry("grad_accum=1", {"grad_accum": 1}, "parity", "failed", passed=False, message="diverged")]
    path.write_text("".join(line(run) + "\n" for run in runs))
    journal = Journal(path, CONTEXT, CHECKS_BLOCKS)
    assert list(journal.runs.values()) == runs


def test_a_moves_line_forged_to_a_refused_combination_with_its_confirm_and_parity_is_refused(tmp_path: Path) -> None:
    """Issue 53: rewritten to a combination the rules refuse, with matching confirm and parity lines, it was reported
    as `fastest` at 19.6x the start and written to found.yaml and the report's command."""
    path = tmp_path / "journal.jsonl"
    lines = searched_journal(path)
    forged = {"optimizer": "adamw_bf16_sr"}  # refused: it needs bf16 weights
    name = Candidate(tuple(forged.items())).name
    assert CHECKS.rules(Candidate(tuple(forged.items())).settings(START)) is not None
    at = next(i for i, text in enumerate(lines) if json.loads(text)["phase"] == "moves")
    lines[at] = line(Entry(name, forged, "moves", "ok", tokens_per_sec=19_600.0, peak_mem_mb=100.0, wall_s=1.0))
    lines += [line(Entry(f"{name}#1", forged, "confirm", "ok", tokens_per_sec=19_600.0, peak_mem_mb=100.0)),
              line(Entry(name, forged, "parity", "ok", passed=True, message="learns the same"))]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(LabError) as err:
        Journal(path, CONTEXT, CHECKS)
    message = str(err.value)
    assert message.startswith(f"{path}, line {at + 1}: optimizer=adamw_bf16_sr is a combination the knob rules "
                              "refuse (")
    assert message.endswith("Delete that line (or the whole file, to start the search over) and rerun")
    assert "\n" not in message


START_RUN = Entry("start", {}, "warm", "ok", tokens_per_sec=1000.0, peak_mem_mb=5000.0, wall_s=1.0)
SDPA_OFF = {"attention": "manual"}
BAD_LINES = {
    "not JSON": ("{'context': 1}", "not JSON (Expecting property name enclosed in double quotes at column 2)"),
    "no context": (json.dumps(asdict(START_RUN)), "not a journal line (no context)"),
    "an unknown field": (line(START_RUN).replace('"wall_s"', '"wall_ms"'),
                         ("not a journal line (its fields are changes, extra, message, name, passed, peak_mem_mb, "
                          "phase, status, tokens_per_sec, wall_ms)")),
    "an unknown phase": (line(Entry("start", {}, "warmup", "ok", tokens_per_sec=1.0)),
                         ("phase='warmup' is not one the search writes; expected one of: warm, moves, fastest, lean, "
                          "explore, global, finalist, confirm, parity, found, precompile")),
    "a status that is not text": (line(Entry("start", {}, "warm", 200, tokens_per_sec=1.0)),
                                  "status not as the search writes it"),
    "no name": (line(Entry("", {}, "warm", "ok", tokens_per_sec=1.0)), "name not as the search writes it"),
    "a verdict neither true nor false": (line(Entry("start", {}, "warm", "ok", tokens_per_sec=1.0, passed="yes")),
                                         "passed not as the search writes it"),
    "no wall time": (line(Entry("start", {}, "warm", "ok", tokens_per_sec=1.0, wall_s=None)),
                     "wall_s not as the search writes it"),
    "two figures wrong": (line(Entry("start", {}, "warm", "ok", tokens_per_sec=-1.0, wall_s=-1.0)),
                          "tokens_per_sec, wall_s not as the search writes it"),
    "a precompile entry with changes": (line(Entry("batch 1", SDPA_OFF, "precompile", "ok", wall_s=3.0)),
                                        ("a precompile entry named 'batch 1' with changes {'attention': 'manual'}, "
                                         "not `batch <n>` with none")),
    "a precompile entry not named by its batch": (
        line(Entry("ahead", {}, "precompile", "ok", wall_s=3.0)),
        "a precompile entry named 'ahead' with changes {}, not `batch <n>` with none"),
    "a confirmation numbered 0": (line(Entry("attention=manual#0", SDPA_OFF, "confirm", "ok", tokens_per_sec=1.0)),
                                  "a confirmation named 'attention=manual#0', not <candidate>#<repeat>"),
    "a confirmation not numbered": (line(Entry("attention=manual#a", SDPA_OFF, "confirm", "ok", tokens_per_sec=1.0)),
                                    "a confirmation named 'attention=manual#a', not <candidate>#<repeat>"),
    "an ok confirmation without a speed": (line(Entry("start#1", {}, "confirm", "ok")),
                                           "a run that ended ok with no tokens/s (start#1)"),
    "a name that is not its changes": (line(Entry("start", SDPA_OFF, "moves", "ok", tokens_per_sec=1.0)),
                                       "a run named 'start' whose changes are 'attention=manual'"),
    "a knob the search leaves alone": (line(Entry("nproc=2", {"nproc": 2}, "moves", "ok", tokens_per_sec=1.0)),
                                       "changes nproc, which the search does not move"),
    "a value not among the choices": (line(Entry("compile=1", {"compile": 1}, "moves", "ok", tokens_per_sec=1.0)),
                                      "compile=1 is not one of its choices"),
    "a word not among the choices": (line(Entry("attention=flash", {"attention": "flash"}, "moves", "ok",
                                              tokens_per_sec=1.0)), "attention='flash' is not one of its choices"),
    "no micro-batches": (line(Entry("grad_accum=0", {"grad_accum": 0}, "moves", "ok", tokens_per_sec=1.0)),
                         "grad_accum=0 is not a positive integer"),
    "micro-batches as a bool": (line(Entry("grad_accum=true", {"grad_accum": True}, "moves", "ok", tokens_per_sec=1.0)),
                                "grad_accum=True is not a positive integer"),
    "micro-batches as text": (line(Entry("grad_accum=2", {"grad_accum": "2"}, "moves", "ok", tokens_per_sec=1.0)),
                              "grad_accum='2' is not a positive integer"),
    "a negative speed": (line(Entry("start", {}, "warm", "ok", tokens_per_sec=-5.0)),
                         "tokens_per_sec not as the search writes it"),
    "a speed that is not a number": (line(Entry("start", {}, "warm", "ok", tokens_per_sec=1.0)).replace("1.0", "NaN", 1),
                                     "tokens_per_sec not as the search writes it"),
    "an ok run without a speed": (line(Entry("start", {}, "warm", "ok")), "a run that ended ok with no tokens/s (start)"),
    "a confirmation never screened": (line(Entry("attention=manual#1", SDPA_OFF, "confirm", "ok", tokens_per_sec=1.0)),
                                      "a confirm run of attention=manual that no screening run of it comes before"),
    "a verdict never screened": (line(Entry("attention=manual", SDPA_OFF, "parity", "ok", passed=True)),
                                 "a parity run of attention=manual that no screening run of it comes before"),
    "an answer never judged": (line(Entry("fastest", {"precision": "bf16", "attention": "manual", "compile": True,
                                                    "optimizer": "adamw_fused"}, "found", "ok")),
                               "the answer fastest without a passed parity verdict of it before it"),
    "an answer with a knob the lab lacks": (line(Entry("fastest", {"warp": 9}, "found", "ok")),
                                            "changes warp, which the search does not move"),
    # compile_scope is not searched: an answer that sets it otherwise than the start answers another question
    "an answer to another question": (line(Entry("fastest", {"precision": "bf16", "attention": "sdpa", "compile": True,
                                                           "optimizer": "adamw_fused", "compile_scope": "blocks"},
                                               "found", "ok")),
                                      "the answer fastest without a passed parity verdict of it before it"),
}


@pytest.mark.parametrize("bad, why", BAD_LINES.values(), ids=BAD_LINES.keys())
def test_a_bad_or_forged_line_is_refused_naming_the_journal_and_its_line(tmp_path: Path, bad: str, why: str) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_text(line(START_RUN) + "\n" + bad + "\n" + line(START_RUN, {**CONTEXT, "model": "other"}) + "\n")
    before = path.read_bytes()
    with pytest.raises(LabError) as err:
        Journal(path, CONTEXT, CHECKS)
    assert str(err.value) == (f"{path}, line 2: {why}; the search wrote no such line. Delete that line (or the whole "
                              "file, to start the search over) and rerun")
    assert path.read_bytes() == before  # nothing dropped without a word


def test_an_answer_the_rules_refuse_is_refused_after_a_verdict_too(tmp_path: Path) -> None:
    """A forger who marks the candidate's screening run and verdict `refused` (which the rules let pass) still has
    its answer checked by the rules."""
    forged = {"optimizer": "adamw_bf16_sr"}  # refused: it needs bf16 weights
    path = tmp_path / "journal.jsonl"
    path.write_text("".join(line(run) + "\n" for run in [
        START_RUN, Entry("optimizer=adamw_bf16_sr", forged, "moves", "refused", message="needs bf16 weights"),
        Entry("optimizer=adamw_bf16_sr", forged, "parity", "refused", passed=True),
        Entry("fastest", knob_values(replace(START, **forged)), "found", "ok")]))
    with pytest.raises(LabError, match="line 4: the answer fastest is a combination the knob rules refuse \\("):
        Journal(path, CONTEXT, CHECKS)


def test_a_line_with_bytes_that_are_not_utf8_is_refused_like_any_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_bytes(line(START_RUN).encode() + b"\n" + b'{"context": \xff}\n')
    with pytest.raises(LabError, match="line 2: not JSON"):
        Journal(path, CONTEXT, CHECKS)


@pytest.mark.parametrize("text", [line(START_RUN) + "\n{'context': 1}\n",
                                  line(START_RUN) + "\n{'context': 1}\n" + line(START_RUN)],
                         ids=["a bad last line, ended", "a bad line before a last line whose end of line was cut"])
def test_only_a_last_line_without_its_end_of_line_is_taken_for_a_cut_one(tmp_path: Path, text: str) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_text(text)
    with pytest.raises(LabError, match="line 2: not JSON"):
        Journal(path, CONTEXT, CHECKS)
    assert path.read_text() == text and not (tmp_path / "journal.jsonl.cut").exists()


def test_a_new_journal_starts_empty_in_folders_it_makes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "out" / "search" / "journal.jsonl"
    journal = Journal(path, CONTEXT, CHECKS)
    assert journal.runs == {} and journal.others == [] and capsys.readouterr().out == ""
    journal.add(START_RUN)
    assert [p.name for p in path.parent.iterdir()] == ["journal.jsonl"] and path.read_text() == line(START_RUN) + "\n"


def test_a_cut_last_line_is_reported_set_aside_and_its_run_made_again(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "journal.jsonl"
    whole = line(START_RUN) + "\n" + line(Entry("attention=manual", SDPA_OFF, "moves", "ok", tokens_per_sec=900.0)) + "\n"
    screened = line(Entry("loss=inline", {"loss": "inline"}, "moves", "ok", tokens_per_sec=990.0, peak_mem_mb=4000.0))
    path.write_text(whole + screened[:40])  # killed while writing it
    journal = Journal(path, CONTEXT, CHECKS)
    assert list(journal.runs) == [("warm", "start"), ("moves", "attention=manual")]  # the cut run is made again
    said = capsys.readouterr().out.strip().splitlines()
    assert said == [f"search: warning: {path}, line 3 was cut short (the search was stopped while writing it); set "
                    f"aside in {path}.cut, and its run is made again"]
    assert path.read_text() == whole
    assert (tmp_path / "journal.jsonl.cut").read_text() == screened[:40] + "\n"


def test_the_cut_line_warning_is_out_before_anything_else_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flushed at once: a stop that ends the process with os._exit (the lifeline's) would lose a buffered line."""
    path = tmp_path / "journal.jsonl"
    path.write_text(line(START_RUN) + "\n" + line(START_RUN)[:40])
    out = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(out, encoding="utf-8"))  # buffered, as a pipe is
    Journal(path, CONTEXT, CHECKS)
    assert out.getvalue().decode().startswith(f"search: warning: {path}, line 2 was cut short")


def test_a_whole_last_line_without_its_end_of_line_is_kept_and_ended(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_text(line(START_RUN))
    journal = Journal(path, CONTEXT, CHECKS)
    journal.add(Entry("attention=manual", SDPA_OFF, "moves", "ok", tokens_per_sec=900.0, peak_mem_mb=6000.0))
    assert [json.loads(text)["name"] for text in path.read_text().splitlines()] == ["start", "attention=manual"]


def test_another_context_s_lines_are_read_as_lines_but_not_checked_by_this_one_s_rules(tmp_path: Path) -> None:
    """A search at another size or batch has its own start and rules; its answers warm-start this one, which
    screens them by its own rules first."""
    path = tmp_path / "journal.jsonl"
    refused_here = {"optimizer": "adamw_bf16_sr"}
    small = {**CONTEXT, "model": "gpt_small"}
    path.write_text("".join(text + "\n" for text in [
        line(Entry("fastest", refused_here, "found", "ok"), small),
        line(Entry("attention=manual", SDPA_OFF, "moves", "ok", tokens_per_sec=1.0), small),  # a run, not an answer
        line(Entry("lean", SDPA_OFF, "found", "ok"), {**small, "device": "another GPU"}),  # another machine
        line(Entry("lean", SDPA_OFF, "found", "ok"), {**CONTEXT, "batch_size": 16}),  # this model's, at another batch
    ]))
    assert Journal(path, CONTEXT, CHECKS).found_elsewhere() == [("fastest (gpt_small)", refused_here)]


def test_measured_counts_the_screening_runs_that_ran(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    runs = [START_RUN, Entry("batch 1", {}, "precompile", "ok", wall_s=30.0),
            Entry("attention=manual", SDPA_OFF, "moves", "ok", tokens_per_sec=900.0, wall_s=2.0),
            Entry("optimizer=adamw_bf16_sr", {"optimizer": "adamw_bf16_sr"}, "moves", "refused", message="needs bf16"),
            Entry("attention=manual#1", SDPA_OFF, "confirm", "ok", tokens_per_sec=910.0, wall_s=5.0),
            Entry("attention=manual", SDPA_OFF, "parity", "passed", passed=True, wall_s=7.0)]
    path.write_text("".join(line(run) + "\n" for run in runs))
    journal = Journal(path, CONTEXT, CHECKS)
    assert journal.measured() == 2 and journal.spent_s() == 45.0
