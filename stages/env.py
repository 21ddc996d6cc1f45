"""Stage env: check every param, then record what on this machine decides a timing.

DVC runs it on every `dvc repro` (always_changed); its output changes only
when the hardware or software does, so timing stages that depend on it rerun
exactly then. It checks every param (the model preset included) before any
other stage runs, and says in one line when a knob of the train stage will be
emulated, and slow, on this machine. It also refuses a corpus holding a device,
a FIFO or a socket, which DVC would otherwise hang on while hashing it.
"""

import benchlab.core.parent_watch  # noqa: F401  first: arms the lifeline before torch loads (benchlab/core/parent_watch.py)

import argparse

import yaml

from benchlab.run import harness
from benchlab.core import presets
from benchlab.run.build_model import check_model
from benchlab.core.params import load_params
from benchlab.prep.formats import check_regular
from benchlab.run.env import timing_environment
from benchlab.core.stage_main import run_main
from benchlab.core.files import claim_outputs, commit_outputs, write_json
from benchlab.run.hardware import resolve_device


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", help="environment JSON")
    args = ap.parse_args(argv)
    claim_outputs(args.out)
    p = load_params()
    check_model(p)
    check_regular(p.data.corpus)  # before DVC hashes it for the prepare stage
    device = resolve_device(p.device)
    harness.cap_memory(device, p.harness.memory_cap_gib)  # a cap on a CPU, or above the card, stops here
    if p.preset != "cpu":
        replaced = presets.resolve(yaml.safe_load(open("params.yaml")))[2]
        print(f"env: preset {p.preset} replaces {', '.join(replaced)} (change them under presets.{p.preset})")
    env = {**timing_environment(), "device": device.type}
    write_json(args.out, env)
    commit_outputs()
    print(f"env: {env['gpu'] or env['cpu']}, torch {env['torch']}, device {device.type}")
    if device.type == "cpu" and p.run.precision == "bf16" and not env["cpu_bf16_native"]:
        print("env: note: this CPU has no native bf16 (no AVX-512 BF16 or AMX); precision=bf16 is emulated here "
              "and runs several times slower than fp32 (7x on a 2-core AMD EPYC; README: 'On a CPU')")


if __name__ == "__main__":
    run_main(main)
