"""All-reduce bandwidth between this job's ranks, for the README's scaling model.

Run under torchrun (PyTorch's launcher), one rank per GPU:
    torchrun --standalone --nproc_per_node=2 scripts/allreduce_bw.py OUT.json
On a CPU it uses gloo (a functional check, not a number to plan with).
Bus bandwidth as nccl-tests defines it: bytes x 2(n-1)/n / time, the rate each
link must carry for a ring all-reduce; comparable across rank counts.
"""

import json
import sys
import time

import torch
import torch.distributed as dist

SIZES_MB = (1, 8, 64, 256, 1024)


def time_all_reduce(t: torch.Tensor, iters: int) -> float:
    """Median seconds of one all-reduce of `t`, after warm-up."""
    cuda = t.is_cuda
    for _ in range(3):
        dist.all_reduce(t)
    times = []
    for _ in range(iters):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main() -> None:
    cuda = torch.cuda.is_available()
    if cuda:
        local = int(__import__("os").environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    else:
        dist.init_process_group("gloo")
    n = dist.get_world_size()
    rows = []
    for mb in SIZES_MB if cuda else SIZES_MB[:2]:
        t = torch.ones(mb * 1024 * 1024 // 4, dtype=torch.float32, device="cuda" if cuda else "cpu")
        sec = time_all_reduce(t, 20 if cuda else 3)
        bytes_ = t.numel() * 4
        rows.append({"size_mb": mb, "time_ms": sec * 1e3, "algbw_gb_s": bytes_ / sec / 1e9,
                     "busbw_gb_s": bytes_ * 2 * (n - 1) / n / sec / 1e9})
    if dist.get_rank() == 0:
        out = {"world_size": n, "backend": dist.get_backend(), "dtype": "float32",
               "gpu": torch.cuda.get_device_name(0) if cuda else None, "torch": torch.__version__, "rows": rows}
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=2)
        for r in rows:
            print(f"all-reduce {r['size_mb']:>5} MB: {r['time_ms']:8.3f} ms, bus bandwidth {r['busbw_gb_s']:7.1f} GB/s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
