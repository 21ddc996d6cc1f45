"""Stages ttl_reference and ttl@<variant>: time to a target loss (benchlab/analysis/ttl_arms.py: the arms, run by
benchlab/run/ttl.py, judged by benchlab/analysis/ttl.py).

ttl_reference sweeps ttl.reference's learning rate and warm-up with the first seed, trains the point with the
lowest loss at its budget (ttl.budget_fraction of its training time) on the other seeds, and sets the target: its
mean validation loss at reference_s, ttl.budget_fraction of its mean training time over the seeds.
ttl@<name> trains the reference plus ttl.variants.<name>'s changes on every seed with the tuned learning rate and
warm-up, and gives its time to the target and its loss at the budget, with the test. The variant comes from
DVC_STAGE, as for bench; `--variant NAME` or `--reference` serve runs outside DVC. Each writes <name>.json to the
record folder and <name>.csv (every seed's validation loss against training seconds) to the curve folder.
"""

import benchlab.core.parent_watch  # noqa: F401  first: arms the lifeline before torch loads (benchlab/core/parent_watch.py)

import argparse
import os
from pathlib import Path
from typing import Any

from benchlab.analysis.ttl import REFERENCE_NAME
from benchlab.analysis.ttl_arms import curve_csv, read_reference, reference, settings_record, variant
from benchlab.core import locks
from benchlab.core.errors import LabError, shown
from benchlab.core.files import claim_outputs, commit_outputs, flat, write_json, write_text
from benchlab.core.knobs import RunSettings
from benchlab.core.params import Params, load_params
from benchlab.core.stage_main import run_main
from benchlab.run.data import load_tokens
from benchlab.run.env import environment, provenance
from benchlab.run.hardware import resolve_device
from benchlab.run.ttl import run_curve


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--variant", help="the variant to time (default: from DVC_STAGE)")
    ap.add_argument("--reference", action="store_true", help="sweep and time the reference")
    ap.add_argument("data_dir")
    ap.add_argument("record_dir", help="gets <name>.json")
    ap.add_argument("curve_dir", help="gets <name>.csv")
    args = ap.parse_args(argv)
    p = load_params()
    if p.ttl.reference not in p.variants:
        raise LabError(f"ttl.reference={shown(p.ttl.reference)} is not valid; expected one of: {', '.join(p.variants)}")
    is_ref = args.reference or os.environ.get("DVC_STAGE", "").endswith("ttl_reference")
    stage = os.environ.get("DVC_STAGE", "")
    name = REFERENCE_NAME if is_ref else args.variant or (stage.split("ttl@", 1)[1] if "ttl@" in stage else None)
    if name is None:
        raise LabError("no variant given: pass --variant NAME or --reference, or run as the DVC stage ttl@NAME")
    if not is_ref and name not in p.ttl.variants:
        raise LabError(f"variant {shown(name)} is not in ttl.variants; valid: {', '.join(p.ttl.variants) or '(none)'}")
    record, curve = Path(args.record_dir) / f"{name}.json", Path(args.curve_dir) / f"{name}.csv"
    claim_outputs(record, curve)
    ref = None if is_ref else read_reference(Path(args.record_dir) / f"{REFERENCE_NAME}.json", p)
    data, device = load_tokens(args.data_dir), resolve_device(p.device)

    def measure(q: Params, settings: RunSettings, seed: int, label: str) -> dict[str, Any]:
        return run_curve(q, settings, data, device, seed, label)

    with locks.device_lock(device, p.harness.lock, f"ttl@{name}"):
        out, runs = reference(p, measure) if ref is None else variant(p, name, ref, measure)
    write_text(curve, curve_csv(runs))
    write_json(record, {**settings_record(p), **out, **flat("env", environment()), **provenance()})
    commit_outputs()
    time = out.get("time_to_target_s_mean")
    print(f"ttl@{name}: target {out.get('target_loss') or '-'}; time to it "
          + (f"{time:.1f} s" if time is not None else out.get("time_to_target", "-")) + f"; {out['verdict']}")


if __name__ == "__main__":
    run_main(main)
