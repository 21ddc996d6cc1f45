"""Stage aggregate: every variant's result in one summary (JSON, markdown, CSV), its plots, and the run's report."""

import benchlab.core.parent_watch  # noqa: F401  first: arms the lifeline before torch loads (benchlab/core/parent_watch.py)

import argparse
from pathlib import Path

from benchlab.core.params import load_params
from benchlab.core.record import SUMMARY_KEYS, numbers
from benchlab.core.stage_main import run_main
from benchlab.core.files import claim_outputs, commit_outputs, write_json, write_text
from benchlab.analysis.summary import markdown, to_csv
from benchlab.analysis.records import check_one_env, check_one_source, env_of, load_results
from benchlab.analysis.run_report import RunFiles, write_run_report


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    for name in ("result_dir", "steps_dir", "parity_dir", "profiles_dir", "summary_json", "summary_md",
                 "summary_csv", "plot_dir", "report_md"):
        ap.add_argument(name, type=Path)
    args = ap.parse_args(argv)
    claim_outputs(args.summary_json, args.summary_md, args.summary_csv, args.plot_dir, args.report_md)
    p = load_params()
    results = load_results(args.result_dir, list(p.variants))
    check_one_env(results, p.aggregate.allow_mixed_env)
    check_one_source(results, p.aggregate.allow_mixed_source)
    files = RunFiles(args.result_dir, args.steps_dir, args.parity_dir, args.profiles_dir)
    rows, note = write_run_report(results, files, p.aggregate, args.report_md, args.plot_dir, "Run report")
    write_text(args.summary_csv, to_csv(rows))
    write_text(args.summary_md, markdown(rows, env_of(results[0]), note))
    write_json(args.summary_json,
               {f"{row['variant']}.{k}": v for row in rows for k, v in numbers(row, SUMMARY_KEYS).items()})
    commit_outputs()
    print(markdown(rows, env_of(results[0]), note))


if __name__ == "__main__":
    run_main(main)
