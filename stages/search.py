"""Stage search (search/dvc.yaml): which knobs make this model fastest, and leanest, on this device.

The rounds, the budget and the choice are benchlab/search.py's; the runs are benchlab/search_runs.py's.
The journal (`<out_dir>/journal.jsonl`) is a persistent output: DVC keeps it when the stage starts again,
so a stopped search resumes and repeats no run it finished. `--candidate FILE` is the screening run's
own mode, in the fresh process the stage starts for it.
"""

import argparse
import sys
from pathlib import Path

import yaml

from benchlab import launch, parity, search, search_runs
from benchlab.config import load_params
from benchlab.entry import run_main
from benchlab.io import remove_outputs, write_json, write_text
from benchlab.optimize import device_facts


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("data_dir")
    ap.add_argument("reference", nargs="?", help="the parity reference's record (metrics/parity/reference-seeds.json)")
    ap.add_argument("out_dir", nargs="?", help="gets journal.jsonl (kept), candidates.csv and found.yaml")
    ap.add_argument("summary", nargs="?", help="the metrics file: what was found, and its ratio to search.start")
    ap.add_argument("--candidate", help=argparse.SUPPRESS)  # screening mode: one run of the changes in this file
    ap.add_argument("--record-to", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    p = load_params()
    if args.candidate:
        search_runs.screen_here(p, Path(args.candidate), args.data_dir, Path(args.record_to))
        return
    out = Path(args.out_dir)
    remove_outputs(out / "candidates.csv", out / "found.yaml", args.summary)
    reference = parity.read_reference(Path(args.reference))
    parity.check_reference(p, reference)
    runs = search_runs.Runs(p, args.data_dir, reference)
    start = search_runs.start_of(p)
    journal = search.Journal(out / "journal.jsonl", search_runs.context(p, runs.device))
    limits = search.Limits(p.search.budget_s, p.search.max_candidates, p.search.confirm, p.search.repeats,
                           p.search.lean_floor)
    rules = search.rules_for(device_facts(runs.device), p.batch_size(start))
    result = search.Search(start, rules, runs.measure, runs.judge, journal, limits).run()
    found = search.found_variants(result, start, p.model) if result["status"] == "ok" else {}
    recipe = result.get("start")
    write_text(out / "candidates.csv", search.candidates_csv(journal, recipe.tokens_per_sec if recipe else None))
    write_text(out / "found.yaml", yaml.safe_dump({"variants": found}, sort_keys=False))
    write_json(args.summary, search.summary(result, journal, limits))
    for goal in search.GOALS:
        answer = result.get(goal) or {}
        print(f"search: {goal}: " + (f"{answer['name']} ({answer['ratio_to_start']:.3f}x {p.search.start}, "
                                     f"{answer['peak_mem_mb']:.0f} MiB)" if answer.get("name")
                                     else answer.get("message", result.get("message", ""))))
    print(f"search: {journal.measured()} runs in {journal.spent_s():.0f} s; found variants in {out / 'found.yaml'}")


if __name__ == "__main__":
    run_main(main)
    if "--record-to" in sys.argv:  # the screening run succeeded (every failure exits inside run_main)
        launch.end_repeat_process()
