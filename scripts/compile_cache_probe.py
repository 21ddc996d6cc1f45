"""Does a fresh process reuse torch.compile's caches? Warm-up time and cache counters of one process.

    python scripts/compile_cache_probe.py MODEL BATCH TOKENS [KNOB=VALUE ...] > OUT.json

Trains MODEL (a preset of model/gpt.py) on random tokens, BATCH x TOKENS, through the lab's own `apply` and
`train_step` with the knobs given (the rest at their defaults), and prints one JSON line: the wall time of the
first step (compiling, or reading the caches) and of the next two, and the counters torch keeps of its
AOTAutograd and FX-graph caches (hit, miss, bypass). Run it twice with the same arguments: the second process
should hit where the first missed. On the H200 the lab's checkpointed variants took about 20 s of warm-up in every
fresh process until `benchlab.optimize.rng_replay`, the others 2 to 4 s after the first: `results/h200-cache/` is
what this showed.
"""

import json
import sys
import time
from pathlib import Path

import torch
import yaml
from torch._dynamo.utils import counters

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchlab.config import RunSettings, TrainParams, parse  # noqa: E402
from benchlab.errors import LabError  # noqa: E402
from benchlab.optimize import apply, resolve_device  # noqa: E402
from benchlab.runner import train_step  # noqa: E402
from model.gpt import GPT, GPTConfig  # noqa: E402

VOCAB = 50304


def knobs(args: list[str]) -> RunSettings:
    """KNOB=VALUE arguments, each value read as YAML (as `dvc exp run -S` reads it), checked as params.yaml is."""
    if bad := [arg for arg in args if "=" not in arg]:
        sys.exit(f"compile_cache_probe.py: {', '.join(map(repr, bad))} is not KNOB=VALUE")
    try:
        return parse(RunSettings, {k: yaml.safe_load(v) for k, _, v in (arg.partition("=") for arg in args)})
    except LabError as e:
        sys.exit(f"compile_cache_probe.py: {e}")


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    model_name, batch, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    settings = knobs(sys.argv[4:])
    device = resolve_device("auto")
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name(model_name, vocab_size=VOCAB, attention=settings.attention))
    run = apply(model, settings, device, TrainParams())
    x = torch.randint(0, VOCAB, (batch, tokens), device=device)
    y = torch.randint(0, VOCAB, (batch, tokens), device=device)
    seconds = []
    for _ in range(3):
        start = time.perf_counter()
        train_step(run, x, y, grad_clip=1.0)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(round(time.perf_counter() - start, 3))
    caches = {group: {k: v for k, v in counters[group].items() if "cache" in k}
              for group in ("aot_autograd", "inductor")}
    print(json.dumps({"model": model_name, "knobs": sys.argv[4:], "torch": torch.__version__,
                      "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                      "step_s": seconds, "caches": caches}))


if __name__ == "__main__":
    main()
