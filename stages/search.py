"""Stage search (search/dvc.yaml): which knobs make this model fastest, and leanest, on this device.

The phases, the budget and the choice are benchlab/search/strategy.py's; the runs are benchlab/search/runs.py's (its
child processes, stages/search_worker.py's); what it writes is benchlab/search/report.py's. The journal
(`<out_dir>/journal.jsonl`) is a persistent output: DVC keeps it when the stage starts again, so a stopped search
resumes and repeats no run it finished, and a search at another model size starts from what this one found. The
libraries' own messages (torchao's kernels this machine lacks, torch's warnings) go to a log beside the summary,
metrics/search.log, so the terminal holds the search's lines alone.
"""

import benchlab.core.parent_watch  # noqa: F401  first: arms the lifeline before torch loads (benchlab/core/parent_watch.py)

import argparse
from pathlib import Path

from benchlab.core.files import claim_outputs, commit_outputs
from benchlab.core.params import load_params
from benchlab.core.stage_main import run_main
from benchlab.run import parity
from benchlab.run.hardware import device_facts
from benchlab.search import moves, report, runs, strategy, worker
from benchlab.search.journal import Journal


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("data_dir")
    ap.add_argument("reference", help="the parity reference's record (metrics/parity/reference-seeds.json)")
    ap.add_argument("out_dir", help=f"gets journal.jsonl (kept), {', '.join(report.OUTPUTS)}")
    ap.add_argument("summary", help="the metrics file: what was found, and its ratio to search.start")
    args = ap.parse_args(argv)
    worker.libraries_to_log(Path(args.summary).with_suffix(".log"))  # the processes it starts inherit it
    p = load_params()
    out = Path(args.out_dir)
    claim_outputs(*(out / name for name in report.OUTPUTS), args.summary)
    reference = parity.read_reference(Path(args.reference))
    parity.check_reference(p, reference)
    device = runs.Runs(p, args.data_dir, reference)
    start = worker.start_of(p)
    batch = p.batch_size(start)
    problem = moves.Problem(start, moves.rules_for(device_facts(device.device), batch), batch)
    # Each run of this context read back is checked by the knob rules and against the runs before it.
    journal = Journal(out / "journal.jsonl", runs.context(p, device.device), problem)
    limits = runs.limits(p)
    try:
        warm = runs.warm_starts(p, journal.found_elsewhere())
        outcome = strategy.Search(problem, device, journal, limits, warm).run()
    finally:
        device.worker.close()
    report.write(outcome, journal, limits, out, Path(args.summary), p, start)
    commit_outputs()
    print("\n".join(report.closing_lines(outcome, journal, out, p.search.start)))


if __name__ == "__main__":
    run_main(main)
