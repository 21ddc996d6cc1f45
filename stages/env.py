"""Stage env: check every param, then record the environment that timings depend on.

DVC runs it on every `dvc repro` (always_changed); its output changes only
when the hardware or software does, so timing stages that depend on it rerun
exactly then. It runs before any other stage, so a bad param (a variant name
that is not a safe identifier, say) stops the pipeline before any command
built from it runs.
"""

import argparse

from benchlab.config import load_params
from benchlab.env import environment
from benchlab.errors import run_main
from benchlab.io import remove_outputs, write_json
from benchlab.optimize import resolve_device


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", help="environment JSON")
    args = ap.parse_args(argv)
    remove_outputs(args.out)
    p = load_params()
    device = resolve_device(p.device)
    env = {**environment(), "device": device.type}
    write_json(args.out, env)
    print(f"env: {env['gpu'] or env['cpu']}, torch {env['torch']}, device {device.type}")


if __name__ == "__main__":
    run_main(main)
