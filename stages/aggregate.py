"""Stage aggregate: every variant's result in one summary (JSON, markdown, CSV) and four plots."""

import argparse
from pathlib import Path

from benchlab.config import load_params
from benchlab.errors import run_main
from benchlab.io import remove_outputs, write_json, write_text
from benchlab.plots import make_plots
from benchlab.report import check_one_env, check_one_source, env_of, load_results, markdown, summarize, to_csv

# The summary's numbers per variant that `dvc metrics diff` and `dvc exp show` compare.
SUMMARY_KEYS = ("tokens_per_sec", "tokens_per_sec_per_gpu", "scaling_efficiency_pct", "val_loss_gap_1proc", "speedup_x", "tokens_per_sec_wall", "step_ms_median", "peak_mem_allocated_mb",
                "peak_mem_reserved_mb", "peak_rss_mb", "mem_change_pct", "mfu_pct", "val_loss")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("result_dir")
    ap.add_argument("steps_dir")
    ap.add_argument("summary_json")
    ap.add_argument("summary_md")
    ap.add_argument("summary_csv")
    ap.add_argument("plot_dir")
    args = ap.parse_args(argv)
    remove_outputs(args.summary_json, args.summary_md, args.summary_csv, args.plot_dir)
    p = load_params()
    results = load_results(args.result_dir, list(p.variants))
    check_one_env(results, p.aggregate.allow_mixed_env)
    check_one_source(results, p.aggregate.allow_mixed_source)
    rows = summarize(results, p.aggregate.baseline, p.aggregate.loss_tolerance, p.aggregate.repeat_tolerance)
    make_plots(rows, Path(args.steps_dir), Path(args.plot_dir), baseline=p.aggregate.baseline)
    write_text(args.summary_csv, to_csv(rows))
    write_text(args.summary_md, markdown(rows, env_of(results[0])))
    write_json(args.summary_json, {
        f"{row['variant']}.{k}": row[k] for row in rows for k in SUMMARY_KEYS if isinstance(row.get(k), (int, float))
    })
    print(markdown(rows, env_of(results[0])))


if __name__ == "__main__":
    run_main(main)
