"""Stages parity_reference and parity@<variant>: does a variant still learn the same (benchlab/run/parity.py).

parity_reference trains parity.reference with each of the two batch orders in parity.seeds; parity@<name>
trains one variant of parity.variants with the first order and gives its verdict against that run. The
variant comes from DVC_STAGE, as for bench, so no name reaches a shell; `--variant NAME` or `--reference`
serve runs outside DVC. Each writes <name>.json to the record folder and <name>.csv (the loss curves side by
side, for `dvc plots diff`) to the curve folder.
"""

import benchlab.core.parent_watch  # noqa: F401  first: arms the lifeline before torch loads (benchlab/core/parent_watch.py)

import argparse
import os
from pathlib import Path

from benchlab.core import locks
from benchlab.run import launch, parity
from benchlab.core.params import load_params, variant_from
from benchlab.core.record import REFERENCE_SEEDS
from benchlab.run.data import load_tokens
from benchlab.run.env import environment, provenance
from benchlab.core.stage_main import run_main
from benchlab.core.errors import LabError
from benchlab.core.files import flat, claim_outputs, commit_outputs, write_json, write_text
from benchlab.run.hardware import resolve_device


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--variant", help="the variant to judge (default: from DVC_STAGE)")
    ap.add_argument("--reference", action="store_true", help="run the reference's two batch orders")
    ap.add_argument("data_dir")
    ap.add_argument("record_dir", help="gets <name>.json")
    ap.add_argument("curve_dir", help="gets <name>.csv")
    args = ap.parse_args(argv)
    p = load_params()
    reference = args.reference or os.environ.get("DVC_STAGE", "").endswith("parity_reference")
    name = REFERENCE_SEEDS if reference else variant_from(args.variant, os.environ.get("DVC_STAGE"), p, "parity")
    if not reference and name not in p.parity.variants:
        raise LabError(f"variant {name!r} is not in parity.variants; valid: {', '.join(p.parity.variants) or '(none)'}")
    record, curve = Path(args.record_dir) / f"{name}.json", Path(args.curve_dir) / f"{name}.csv"
    claim_outputs(record, curve)
    ref = None if reference else parity.read_reference(Path(args.record_dir) / f"{REFERENCE_SEEDS}.json")
    if ref is not None:
        parity.check_reference(p, ref)
    data, device = load_tokens(args.data_dir), resolve_device(p.device)
    target = p.parity.reference if reference else name
    with locks.device_lock(device, p.harness.lock, f"parity@{target}"):
        runs = [parity.train_curve(p, target, data, device, seed) for seed in (p.parity.seeds if reference else p.parity.seeds[:1])]
    passes = parity.data_passes(p, target, data)
    if reference:
        out = parity.reference_record(p, runs, passes)
        columns = {"seed_a": runs[0].losses, "seed_b": runs[-1].losses}
        words = f"{out['status']}" + (f", orders {out['noise_nats']:.4f} nats apart" if out["status"] == "ok" else f": {out['message']}")
    else:
        out = parity.variant_record(p, name, runs[0], ref, passes)
        columns = {"loss": runs[0].losses, "reference_loss": ref.get("seed_a_losses", [])}
        words = out["verdict"]
    write_text(curve, parity.curve_csv(columns))
    write_json(record, {**out, **flat("env", environment()), **provenance()})
    commit_outputs()
    print(f"parity@{target}: {words}" + (f" ({passes:.1f} passes over the training split)" if passes > 1 else ""))


if __name__ == "__main__":
    run_main(main)
    launch.end_process()  # run_main returned: the stage succeeded (every failure exits inside it)
