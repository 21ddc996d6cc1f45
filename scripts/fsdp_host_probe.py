"""Host time per training step of DDP and FSDP2 settings, on a model too small for its compute to matter.

    torchrun --standalone --nproc_per_node 2 scripts/fsdp_host_probe.py [KNOB=VALUE ...] > OUT.txt

Two gloo ranks train a 12-block GPT (GPT-2 124M's depth, 32 wide, 32 tokens) through the lab's own
`apply` and `train_step` (for-loop or fused AdamW, gradient clipping at 1.0) under each row of SETTINGS
plus the knobs given, and rank 0 prints the mean wall time of 30 steps after 5 warm-up steps, then the
FSDP2 hooks and optimizer spans with the most CPU time in 5 profiled steps. At this size a step is almost
all Python and dispatch: what FSDP2's per-unit hooks cost the host, which on a GPU is time the GPU waits
unless its own work per step is longer.
"""

import sys
import time
from pathlib import Path

import torch
import torch.distributed as torch_dist
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchlab.config import RunSettings, TrainParams  # noqa: E402
from benchlab.optimize import apply  # noqa: E402
from benchlab.runner import train_step  # noqa: E402
from model.gpt import GPT, GPTConfig  # noqa: E402

SETTINGS: list[dict[str, object]] = [
    {"parallel": "ddp"},
    {"parallel": "fsdp2"},
    {"parallel": "fsdp2", "fsdp_reshard_after_forward": False},
    {"parallel": "fsdp2", "fsdp_blocks_per_unit": 4},
    {"parallel": "fsdp2", "fsdp_blocks_per_unit": 0},
]


def host_ms(settings: RunSettings, steps: int = 30) -> tuple[float, list[tuple[str, float]]]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=12, n_head=2, n_embd=32, block_size=32, vocab_size=256, attention="sdpa"))
    run = apply(model, settings, torch.device("cpu"), TrainParams())
    x, y = torch.randint(0, 256, (2, 32)), torch.randint(0, 256, (2, 32))
    for _ in range(5):
        train_step(run, x, y, grad_clip=1.0)
    torch_dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        train_step(run, x, y, grad_clip=1.0)
    torch_dist.barrier()
    ms = (time.perf_counter() - start) / steps * 1000
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            train_step(run, x, y, grad_clip=1.0)
    spans = [(e.key, e.cpu_time_total / 5 / 1000) for e in prof.key_averages()
             if e.key.startswith(("FSDP::", "Optimizer.step"))]
    return ms, sorted(spans, key=lambda s: -s[1])[:4]


def main() -> None:
    torch_dist.init_process_group("gloo")
    torch.set_num_threads(1)
    extra = {k: {"true": True, "false": False}.get(v, v) for k, v in (a.split("=", 1) for a in sys.argv[1:])}
    if torch_dist.get_rank() == 0:
        print(f"torch {torch.__version__}, 2 gloo ranks, one thread each; knobs beside each row: {extra}")
    for row in SETTINGS:
        ms, spans = host_ms(RunSettings(nproc=2, **row, **extra))  # type: ignore[arg-type]
        if torch_dist.get_rank() == 0:
            print(f"{row}: {ms:.1f} ms per step")
            for name, span_ms in spans:
                print(f"    {name[:70]}: {span_ms:.2f} ms per step")
    torch_dist.destroy_process_group()


if __name__ == "__main__":
    main()
