"""Stage ttl_report: the time-to-loss track's report (benchlab/analysis/ttl_report.py), its plot, and its figures
as flat metrics."""

import benchlab.core.parent_watch  # noqa: F401  first: arms the lifeline before torch loads (benchlab/core/parent_watch.py)

import argparse
import json
import os
from pathlib import Path

from benchlab.analysis.ttl import REFERENCE_NAME
from benchlab.analysis.ttl_report import plot_curves, report
from benchlab.core.errors import LabError
from benchlab.core.files import claim_outputs, commit_outputs, write_json, write_text
from benchlab.core.params import load_params
from benchlab.core.stage_main import run_main

METRICS = ("target_loss", "time_to_target_s_mean", "time_to_target_s_std", "reached_seeds", "loss_at_budget_mean",
           "loss_at_budget_std", "p_value", "at_target_by_first_eval_seeds", "reference_s",
           "tokens_per_sec", "speed_vs_reference_x")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    for name in ("record_dir", "report_md", "plot_png", "metrics_json"):
        ap.add_argument(name, type=Path)
    args = ap.parse_args(argv)
    p = load_params()
    claim_outputs(args.report_md, args.plot_png, args.metrics_json)
    names = [REFERENCE_NAME, *p.ttl.variants]
    missing = [n for n in names if not (args.record_dir / f"{n}.json").is_file()]
    if missing:
        raise LabError(f"no ttl record for {', '.join(missing)} in {args.record_dir}; run `dvc repro ttl/dvc.yaml`")
    ref, *variants = [json.loads((args.record_dir / f"{n}.json").read_text()) for n in names]
    plot_curves([ref, *variants], ref.get("target_loss"), ref.get("reference_s"), args.plot_png)
    link = Path(os.path.relpath(args.plot_png, args.report_md.parent)).as_posix()
    page = report(ref, variants, link)
    write_text(args.report_md, page)
    write_json(args.metrics_json, {f"{r['arm']}.{k}": r.get(k) for r in (ref, *variants) for k in METRICS
                                   if isinstance(r.get(k), (int, float))})
    commit_outputs()
    print(page)


if __name__ == "__main__":
    run_main(main)
