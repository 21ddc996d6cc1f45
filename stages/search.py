"""Stage search (search/dvc.yaml): which knobs make this model fastest, and leanest, on this device.

The phases, the budget and the choice are benchlab/search/strategy.py's; the runs are benchlab/search/runs.py's; what
it writes is benchlab/search/report.py's. The journal (`<out_dir>/journal.jsonl`) is a persistent output: DVC
keeps it when the stage starts again, so a stopped search resumes and repeats no run it finished, and a
search at another model size starts from what this one found. `--worker` is the screening worker's mode,
`--candidate FILE` a fresh-process confirmation run's, `--precompile FILE` a compiling-ahead process's; the stage
starts them itself. The libraries' own messages
(torchao's kernels this machine lacks, torch's warnings) go to a log beside the summary, metrics/search.log, so the
terminal holds the search's lines alone.
"""

import benchlab.core.parent_watch  # noqa: F401  first: arms the lifeline before torch loads (benchlab/core/parent_watch.py)

import argparse
import os
import sys
from pathlib import Path

import yaml

from benchlab.run import launch
from benchlab.run import parity
from benchlab.search import strategy
from benchlab.search import moves
from benchlab.search import report
from benchlab.search import runs
from benchlab.search import worker
from benchlab.core.params import load_params
from benchlab.core.stage_main import run_main
from benchlab.run.env import environment
from benchlab.core.files import claim_outputs, commit_outputs, write_json, write_text
from benchlab.core.knobs import RunSettings
from benchlab.run.hardware import device_facts
from benchlab.search.journal import Checks, Journal

OUTPUTS = ("candidates.csv", "front.csv", "found.yaml", "report.md", "front.png")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("data_dir")
    ap.add_argument("reference", nargs="?", help="the parity reference's record (metrics/parity/reference-seeds.json)")
    ap.add_argument("out_dir", nargs="?", help="gets journal.jsonl (kept), candidates.csv, front.csv, found.yaml, "
                                                "report.md and front.png")
    ap.add_argument("summary", nargs="?", help="the metrics file: what was found, and its ratio to search.start")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # the screening worker
    ap.add_argument("--candidate", help=argparse.SUPPRESS)  # a fresh-process run of the changes in this file
    ap.add_argument("--precompile", help=argparse.SUPPRESS)  # compile the candidate in this file ahead
    ap.add_argument("--steps", type=int, help=argparse.SUPPRESS)  # a CPU's screening run: fewer steps
    ap.add_argument("--record-to", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    log = Path(args.summary).with_suffix(".log") if args.summary else os.environ.get(worker.LOG_ENV)
    if log:  # the libraries' messages: beside the summary (metrics/search.log); the processes it starts inherit it
        worker.libraries_to_log(log)
    p = load_params()
    if args.worker:
        worker.serve(p, args.data_dir)
        return
    if args.precompile:
        worker.precompile_here(p, Path(args.precompile), args.data_dir)
        return
    if args.candidate:
        worker.screen_here(p, Path(args.candidate), args.data_dir, Path(args.record_to), args.steps)
        return
    out = Path(args.out_dir)
    claim_outputs(*(out / name for name in OUTPUTS), args.summary)
    reference = parity.read_reference(Path(args.reference))
    parity.check_reference(p, reference)
    measure = runs.Runs(p, args.data_dir, reference)
    start = worker.start_of(p)
    batch = p.batch_size(start)
    rules = moves.rules_for(device_facts(measure.device), batch)
    # Each run of this context read back is checked by the knob rules and against the runs before it.
    journal = Journal(out / "journal.jsonl", runs.context(p, measure.device), Checks(start, rules))
    limits = strategy.Limits(p.search.budget_s, p.search.max_candidates, p.search.confirm, p.search.repeats,
                             p.search.lean_floor, parity_tokens=p.parity.steps * batch * p.train.block_size,
                             seed=p.seed, finalist_only=True)
    warm = runs.warm_starts(p, journal.found_elsewhere())
    try:
        result = strategy.Search(start, rules, measure.screen, measure.repeat, measure.judge, journal, limits,
                                 batch, warm, prepare=measure.prepare).run()
    finally:
        measure.worker.close()
    write_outputs(result, journal, limits, out, args.summary, p.model, start, p.preset)
    commit_outputs()
    for goal in strategy.GOALS:
        answer = result.get(goal) or {}
        print(f"search: {goal}: " + (f"{answer['name']} ({answer['ratio_to_start']:.3f}x {p.search.start}, "
                                     f"{answer['peak_mem_mb']:,.0f} MiB)" if answer.get("name")
                                     else answer.get("message", result.get("message", ""))))
    print(f"search: {journal.measured()} screening runs, {journal.spent_s():.0f} s in all; found variants in "
          f"{out / 'found.yaml'}, the front in {out / 'front.csv'}")


def write_outputs(result: dict, journal: Journal, limits: strategy.Limits, out: Path, summary: str, model: str,
                  start_settings: RunSettings, preset: str) -> None:
    """Every output but the journal: the candidates, the front and its plot, the found variants, the report."""
    start = result.get("start")
    env = environment()
    machine = f"{env.get('gpu') or env.get('cpu')} (torch {env.get('torch')})"
    write_text(out / "candidates.csv", report.candidates_csv(journal, start.tokens_per_sec if start else None))
    write_text(out / "front.csv", report.front_csv(result, journal))
    found = strategy.found_variants(result, start_settings, model) if result["status"] == "ok" else {}
    write_text(out / "found.yaml", yaml.safe_dump({"variants": found}, sort_keys=False))
    report.plot_front(result, journal, out / "front.png")
    command = report.exp_command(found, preset) if found else ""
    write_text(out / "report.md", report.report_md(result, journal, limits, machine, "front.png", command))
    if command:
        print(f"search: to time the answers in the matrix: {command}")
    write_json(summary, report.summary(result, journal, limits))


if __name__ == "__main__":
    run_main(main)
    if "--record-to" in sys.argv:  # the fresh-process run succeeded (every failure exits inside run_main)
        launch.end_process()
