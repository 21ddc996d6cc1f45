"""A variant's repeats turned into one flat result record with units in its keys."""

import math
from dataclasses import asdict
from typing import Any

from benchlab.core import stats
from benchlab.core.files import flat
from benchlab.core.knobs import CUDA_GRAPH_MODES, RunSettings
from benchlab.core.params import Params
from benchlab.core.record import (
    ALLOCATED,
    ALLOCATED_COMPARABLE,
    MEMORY_KEYS,
    METRIC_KEYS,
    RESERVED,
    TAIL_STEPS,
    numbers,
    tail_loss,
)
from benchlab.run.mfu import flops_per_token, mfu_pct, peak_tflops
from benchlab.run.runner import Measurement
from model.gpt import GPTConfig

# Another process using more than this share of all CPU cores while we timed
# makes the figure suspect (a data loader or a second benchmark, say).
BUSY_OTHERS_PCT = 20.0

# Leak check: memory held after the last timed step may exceed that after the
# first by this much before we flag it (allocator and RSS jitter stay below).
LEAK_MB = 8.0
LEAK_FRACTION = 0.02


# The sections every timed run reads, recorded whole with it; with the stage's own section (`bench`, `train`).
RUN_SECTIONS = ("shape", "optim", "harness", "eval")


def resolved_params(p: Params, settings: RunSettings, own: str | None) -> dict[str, Any]:
    """The params this run read, the variant's settings in place of the top-level knobs, as `params.<key>`."""
    d: dict[str, Any] = {"seed": p.seed, "device": p.device, "model": p.model, "preset": p.preset}
    for section in (*RUN_SECTIONS, *([own] if own else [])):
        d[section] = asdict(getattr(p, section))
    d.update(asdict(settings))
    return flat("params", d)


def base_record(name: str, p: Params, settings: RunSettings, device: str, env: dict, prov: dict,
                own: str | None = "bench") -> dict[str, Any]:
    """What a timed run's record holds before it is measured; `own`: the stage's own section, recorded too."""
    return {
        "variant": name,
        "device": device,
        **asdict(settings),
        "model": p.model,
        "batch_size": p.batch_size(settings),
        "block_size": p.shape.block_size,
        "tokens_per_step": p.batch_size(settings) * p.shape.block_size,
        "memory_cap_gib": p.harness.memory_cap_gib,  # 0: none; the card size this row answers for
        **flat("env", env),
        **prov,
        **resolved_params(p, settings, own),
    }


def skipped_record(base: dict[str, Any], reason: str) -> dict[str, Any]:
    return {**base, "status": "skipped", "message": reason, "repeats": 0}


def measured_record(base: dict[str, Any], runs: list[Measurement], cfg: GPTConfig, n_params: int,
                    steady_tolerance: float) -> dict[str, Any]:
    """Statistics across repeats; a failed repeat makes the whole variant failed."""
    failed = next((r for r in runs if r.status != "ok"), None)
    first = runs[0]
    out = {**base, "repeats": len(runs), "steps": len(first.step_ms) or len(first.losses),
           "warmup_steps": first.warmup_steps}
    if failed is not None:  # an OOM keeps the memory it held when it stopped: where a smaller card gives out
        held = {k: failed.memory.get(k) for k in (ALLOCATED, RESERVED)}
        return {**out, "status": failed.status, "message": failed.message, "diverged_step": failed.diverged_step,
                **({k: v for k, v in held.items() if v is not None} if failed.status == "oom" else {})}
    tokens = base["tokens_per_step"]
    medians = [stats.describe(r.timed_ms)["median"] for r in runs]
    tps = [tokens / (m / 1000.0) for m in medians]
    wall = [tokens * len(r.timed_ms) / (r.window_wall_ms / 1000.0) for r in runs if r.window_wall_ms]
    pooled = stats.describe([t for r in runs for t in r.timed_ms])
    tps_pi, tps_ci, ms_ci = stats.prediction_interval(tps), stats.t_interval(tps), stats.t_interval(medians)
    gaps = [stats.halves_gap(r.timed_ms) for r in runs]
    stalls = [stats.stalls(r.timed_ms, r.window_wall_ms, gap_ms=r.gap_ms) for r in runs]
    stall_ms = max(s.longest_ms for s in stalls)
    stall_outside_ms = max(s.outside_ms for s in stalls)
    growth = max(r.mem_growth_mb or 0.0 for r in runs)
    peak = max(r.peaks.compared() or 0.0 for r in runs)
    fpt = flops_per_token(cfg, n_params, base["block_size"])
    peak_tf = peak_tflops(base.get("env.gpu")) if base.get("env.cuda_available") and base.get("device") == "cuda" else None
    tps_median = stats.describe(tps)["median"]
    wall_median = stats.describe(wall)["median"] if wall else None
    vals = [r.val_loss for r in runs if r.val_loss is not None]
    out.update({
        "status": "ok",
        "message": "",
        "timed_steps": len(first.timed_ms),
        "tokens_per_sec": tps_median,  # global: every rank's tokens, at the slowest rank's step time
        "world_size": first.world_size,
        # Per rank: one GPU's share (or one gloo process's on a CPU).
        "tokens_per_sec_per_gpu": tps_median / first.world_size,
        "peak_mem_per_rank_mb": [max(vals) for vals in zip(*(r.rank_peak_mb for r in runs))] or None,
        "tokens_per_sec_mean": stats.describe(tps)["mean"],
        # Where the next independent run (a fresh process) should land, 95%: the table's interval.
        "tokens_per_sec_pi95_low": tps_pi[0] if tps_pi else None,
        "tokens_per_sec_pi95_high": tps_pi[1] if tps_pi else None,
        # Where the mean of these repeats lies, 95%: narrower; kept for reference.
        "tokens_per_sec_ci95_low": tps_ci[0] if tps_ci else None,
        "tokens_per_sec_ci95_high": tps_ci[1] if tps_ci else None,
        "tokens_per_sec_cv_pct": stats.describe(tps)["cv_pct"] if len(tps) > 1 else None,
        "repeat_tokens_per_sec": tps,
        # Wall clock over the timed window: host work between steps (batches, copies) included.
        "tokens_per_sec_wall": wall_median,
        "host_overhead_pct": 100.0 * (1.0 - wall_median / tps_median) if wall_median else None,
        "step_ms_median": stats.describe(medians)["median"],
        "step_ms_ci95_low": ms_ci[0] if ms_ci else None,
        "step_ms_ci95_high": ms_ci[1] if ms_ci else None,
        "step_ms_p10": pooled["p10"],
        "step_ms_p90": pooled["p90"],
        "step_ms_cv_pct": pooled["cv_pct"],
        "steady_gap_pct": 100.0 * max(gaps),
        # Steady: the timed window's halves agree and nothing stalled it (stats.stalls).
        "steady_state_ok": max(gaps) <= steady_tolerance and stall_ms == 0.0 and stall_outside_ms == 0.0,
        "stalled_steps": sum(s.steps for s in stalls),  # over all repeats
        "stall_ms_max": stall_ms,  # the worst stalled step's time beyond its window's median
        "stall_outside_steps_ms": stall_outside_ms,  # a stop between two steps, which no step's time holds
        **{k: _max_or_none(runs, k) for k in MEMORY_KEYS},
        # CUDA graphs allocate from private pools that the allocated peak does not see.
        ALLOCATED_COMPARABLE: base.get("compile_mode") not in CUDA_GRAPH_MODES,
        "mem_growth_mb": growth,
        # Judged on CUDA only, where the allocator counts tensor bytes exactly;
        # a CPU's resident set grows with the C allocator's caching too.
        "leak_suspected": growth > max(LEAK_MB, LEAK_FRACTION * peak) if base.get("device") == "cuda" else None,
        **neighbours(runs),
        "first_step_ms": first.first_step_ms,
        "warmup_s": first.warmup_s,
        "flops_per_token": fpt,
        "peak_tflops": peak_tf,
        "mfu_pct": mfu_pct(tps_median, fpt, peak_tf),
        "final_train_loss": first.losses[-1],
        "val_loss": vals[0],
        "val_perplexity": math.exp(vals[0]),
        "val_loss_repeat_spread": max(vals) - min(vals),
        "repeat_val_loss": vals,
        "repeat_tail_train_loss": [tail_loss(r.losses, TAIL_STEPS) for r in runs],
        "fp16_skipped_steps": first.skipped_steps,
        **energy(runs, tokens),
    })
    return out


def energy(runs: list[Measurement], tokens_per_step: int) -> dict[str, Any]:
    """The board's mean power and the tokens trained per joule over the timed windows, medians over repeats; None
    with the note that says why when any repeat's board power was not read (a CPU, no NVML)."""
    missing = next((r for r in runs if r.power_w is None or not r.energy_j), None)
    if missing is not None:
        return {"power_w_mean": None, "tokens_per_joule": None,
                "power_note": missing.power_note or "board power was not read"}
    per_joule = [tokens_per_step * len(r.timed_ms) / r.energy_j for r in runs]  # type: ignore[operator]
    return {"power_w_mean": stats.describe([r.power_w for r in runs])["median"],  # type: ignore[misc]
            "tokens_per_joule": stats.describe(per_joule)["median"], "power_note": ""}


def neighbours(runs: list[Measurement]) -> dict[str, Any]:
    """What else used the machine during any repeat's timed window, and whether that makes the figure suspect."""
    facts = [r.neighbours for r in runs if r.neighbours]
    if not facts:
        return {"interference_suspected": None}
    gpu = [f["other_gpu_processes"] for f in facts if f.get("other_gpu_processes") is not None]
    others = max(f["cpu_busy_others_pct"] for f in facts)
    pids = sorted({pid for seen in gpu for pid in seen})
    return {
        "other_gpu_processes": pids if gpu else None,
        "cpu_busy_others_pct_max": others,
        "cpu_busy_ours_pct_max": max(f["cpu_busy_ours_pct"] for f in facts),
        "interference_suspected": bool(pids) or others > BUSY_OTHERS_PCT,
    }


def metric_view(record: dict[str, Any]) -> dict[str, Any]:
    """The numbers a person compares across experiments, for the files DVC reads as metrics."""
    return numbers(record, METRIC_KEYS)


def _max_or_none(runs: list[Measurement], key: str) -> float | None:
    values = [r.memory.get(key) for r in runs if r.memory.get(key) is not None]
    return max(values) if values else None


def steps_csv(run: Measurement) -> str:
    """Per-step loss, learning rate and time of one run, for DVC plots."""
    lines = ["step,loss,lr,step_ms,timed"]
    for i, loss in enumerate(run.losses):
        ms = run.step_ms[i] if i < len(run.step_ms) else ""
        lines.append(f"{i},{loss:.6f},{run.lrs[i]:.6g},{ms if ms == '' else f'{ms:.4f}'},{int(i >= run.warmup_steps)}")
    return "\n".join(lines) + "\n"
