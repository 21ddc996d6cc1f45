"""The matrix's results in one table: speedups, memory, loss checks, and plots.

Only variants named in params.yaml are read, in that order, so a variant
removed from params leaves no stale row. Results measured in different
environments are refused unless allowed: their ratios would mean nothing.
"""

import csv
import io
import json
from pathlib import Path
from typing import Any

from tabulate import tabulate

from benchlab import stats
from benchlab.config import KNOBS
from benchlab.errors import LabError

# Knobs that say how a run is spread over processes; a multi-process row's one-process
# counterpart has every other knob the same.
PARALLEL_KNOBS = ("parallel", "nproc", "ddp_bucket_mb", "ddp_grad_as_bucket_view", "ddp_comm_hook",
                  "fsdp_reshard_after_forward", "fsdp_param_dtype", "fsdp_blocks_per_unit",
                  "nccl_max_ctas")

# (column, key in the row, format) for the markdown table.
COLUMNS: list[tuple[str, str, str]] = [
    ("variant", "variant", "s"),
    ("status", "status", "s"),
    ("tokens/s", "tokens_per_sec", ",.0f"),
    ("ranks", "world_size", "d"),
    ("tokens/s per GPU", "tokens_per_sec_per_gpu", ",.0f"),
    ("scaling eff %", "scaling_efficiency_pct", ".1f"),
    ("scaled from", "scaling_ref", "s"),
    ("val loss - 1-proc", "val_loss_gap_1proc", "+.4f"),
    ("next run 95% tokens/s", "tokens_per_sec_pi95", "s"),
    ("speedup", "speedup_x", ".2f"),
    ("significant", "significant", "s"),
    ("wall tokens/s", "tokens_per_sec_wall", ",.0f"),
    ("host gap %", "host_overhead_pct", ".1f"),
    ("step ms median", "step_ms_median", ".2f"),
    ("p10", "step_ms_p10", ".2f"),
    ("p90", "step_ms_p90", ".2f"),
    ("peak alloc MiB", "peak_mem_allocated_mb", ",.0f"),
    ("peak reserved MiB", "peak_mem_reserved_mb", ",.0f"),
    ("peak RSS MiB", "peak_rss_mb", ",.0f"),
    ("memory vs base %", "mem_change_pct", "+.1f"),
    ("MFU %", "mfu_pct", ".1f"),
    ("warm-up s", "warmup_s", ".1f"),
    ("train loss", "final_train_loss", ".4f"),
    ("val loss", "val_loss", ".4f"),
    ("val ppl", "val_perplexity", ".1f"),
    ("loss ok", "loss_ok", "s"),
    ("notes", "notes", "s"),
]
SOURCE_KEY = "provenance.source_sha256"
ENV_KEYS = ("env.gpu", "env.driver", "env.cuda", "env.torch", "env.python", "env.cpu", "env.torch_threads")


def load_results(result_dir: str | Path, names: list[str]) -> list[dict[str, Any]]:
    """Each named variant's result; a missing or unreadable one is an error naming its stage."""
    out = []
    for name in names:
        path = Path(result_dir) / f"{name}.json"
        if not path.is_file():
            raise LabError(f"{path} is missing; run `dvc repro bench@{name}`")
        try:
            out.append(json.loads(path.read_text()))
        except json.JSONDecodeError as err:
            raise LabError(f"{path} is not valid JSON ({err}); rerun `dvc repro -f bench@{name}`") from None
    return out


def env_of(result: dict[str, Any]) -> dict[str, Any]:
    return {k: result.get(k) for k in ENV_KEYS}


def check_one_env(results: list[dict[str, Any]], allow_mixed: bool) -> None:
    """Refuse a table whose rows were measured on different machines or software."""
    first = env_of(results[0])
    for r in results[1:]:
        if env_of(r) != first and not allow_mixed:
            diff = {k: (first[k], r.get(k)) for k in ENV_KEYS if first[k] != r.get(k)}
            raise LabError(
                f"{r['variant']} was measured in another environment than {results[0]['variant']} ({diff}); "
                "rerun the matrix on one machine, or set aggregate.allow_mixed_env=true to compare anyway"
            )


def check_one_source(results: list[dict[str, Any]], allow_mixed: bool) -> None:
    """Refuse a table whose rows ran different code, or code from a modified tree."""
    if allow_mixed:
        return
    sources = {r.get(SOURCE_KEY) for r in results}
    if len(sources) > 1:
        groups = ", ".join(f"{str(src)[:12]}: {', '.join(r['variant'] for r in results if r.get(SOURCE_KEY) == src)}"
                           for src in sources)
        raise LabError(f"the variants ran different source code ({groups}); rerun them from one commit "
                       "(`dvc repro -f` the stale ones), or set aggregate.allow_mixed_source=true to compare anyway")
    dirty = [r["variant"] for r in results if r.get("provenance.tree_clean") is False]
    if dirty:
        raise LabError(f"{', '.join(dirty)} ran from a tree with uncommitted changes, so no commit names their code; "
                       "commit and rerun them, or set aggregate.allow_mixed_source=true to tabulate anyway")


def _ci(r: dict[str, Any]) -> tuple[float, float] | None:
    """The interval a row is judged by: where the next independent run should land, 95%."""
    low, high = r.get("tokens_per_sec_pi95_low"), r.get("tokens_per_sec_pi95_high")
    return (low, high) if low is not None and high is not None else None


def summarize(results: list[dict[str, Any]], baseline: str, tolerance: float,
              repeat_tolerance: float = float("inf")) -> list[dict[str, Any]]:
    """One row per variant, compared with the baseline's row."""
    base = next((r for r in results if r["variant"] == baseline), None)
    base_ok = base is not None and base["status"] == "ok"
    rows = []
    for r in results:
        row = {k: r.get(k) for _, k, _ in COLUMNS if k in r}
        row.update({"variant": r["variant"], "status": r["status"], "notes": r.get("message", ""),
                    "settings": {k: r.get(k) for k in KNOBS}})
        ci = _ci(r)
        row["tokens_per_sec_pi95"] = f"{ci[0]:,.0f} to {ci[1]:,.0f}" if ci else None
        row["speedup_x"] = row["mem_change_pct"] = row["significant"] = row["loss_ok"] = None
        row["mem_reserved"] = r.get("peak_mem_allocated_comparable") is False  # plots draw its reserved peak
        if r["status"] == "ok" and base_ok:
            assert base is not None
            row["speedup_x"] = r["tokens_per_sec"] / base["tokens_per_sec"]
            mem, base_mem = _mem(r), _mem(base)
            if mem is not None and base_mem:
                row["mem_change_pct"] = 100.0 * (mem - base_mem) / base_mem
            sep = stats.separated(ci, _ci(base))
            row["significant"] = None if sep is None or r is base else ("yes" if sep else "no")
            gap = abs(r["val_loss"] - base["val_loss"])
            row["loss_ok"] = "yes" if gap <= tolerance else f"NO ({gap:.3f} > {tolerance})"
            if r.get("batch_size") != base.get("batch_size"):
                row["loss_ok"] = f"n/a (batch {r.get('batch_size')}, baseline {base.get('batch_size')})"
        if r["status"] == "ok":
            warnings = []
            if not r.get("steady_state_ok", True):
                warnings.append(f"timed halves differ by {r['steady_gap_pct']:.1f}%: not steady")
            if r.get("leak_suspected"):
                warnings.append(f"memory grew {r['mem_growth_mb']:.1f} MiB over the timed steps")
            spread = r.get("val_loss_repeat_spread") or 0.0
            if spread > repeat_tolerance:
                warnings.append(f"repeats disagree: val loss spread {spread:.4f} > {repeat_tolerance}")
            asked = r.get("repeats_asked")
            if asked and r.get("repeats", asked) < asked:
                warnings.append(f"{r['repeats']} of {asked} repeats: a time limit stopped the rest")
            if r.get("interference_suspected"):
                warnings.append(_interference(r))
            if r.get("peak_mem_allocated_comparable") is False:
                warnings.append("CUDA graphs: allocated peak misses the graph pools; compare reserved memory")
            if r.get("fp16_skipped_steps"):
                warnings.append(f"GradScaler skipped {r['fp16_skipped_steps']} steps")
            row["notes"] = "; ".join(warnings)
        row.update(scaling(r, results))
        rows.append(row)
    return rows


def _same_but_parallel(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in KNOBS if k not in PARALLEL_KNOBS and k != "batch_size")


def scaling(r: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
    """A multi-process row against its one-process counterpart (same knobs but the parallel ones) in this table.

    Scaling efficiency: tokens/s over world_size times the one-process tokens/s at the same batch per
    process (else at the same global batch; `scaling_ref` names the row used). The validation-loss gap is
    taken at the same global batch, where the two runs see the same data in the same order.
    """
    out: dict[str, Any] = {"scaling_efficiency_pct": None, "scaling_ref": None, "val_loss_gap_1proc": None}
    world = r.get("world_size") or 1
    if r["status"] != "ok" or world == 1:
        return out
    ones = [o for o in results if o["status"] == "ok" and (o.get("world_size") or 1) == 1 and _same_but_parallel(r, o)]
    per_rank = [o for o in ones if o.get("batch_size") * world == r.get("batch_size")]
    same_global = [o for o in ones if o.get("batch_size") == r.get("batch_size")]
    ref = (per_rank or same_global or [None])[0]
    if ref is not None:
        out["scaling_efficiency_pct"] = 100.0 * r["tokens_per_sec"] / (world * ref["tokens_per_sec"])
        basis = "per-rank" if per_rank else "global"
        out["scaling_ref"] = f"{ref['variant']} (same {basis} batch)"
    if same_global:
        out["val_loss_gap_1proc"] = r["val_loss"] - same_global[0]["val_loss"]
    return out


def _interference(r: dict[str, Any]) -> str:
    parts = []
    if r.get("other_gpu_processes"):
        parts.append(f"other GPU processes {r['other_gpu_processes']}")
    if (r.get("cpu_busy_others_pct_max") or 0.0) > 0:
        parts.append(f"others kept {r['cpu_busy_others_pct_max']:.0f}% of the CPU busy")
    return "machine shared while timed: " + ", ".join(parts)


def _mem(r: dict[str, Any]) -> float | None:
    """The memory figure rows are compared on: CUDA peak allocated (reserved under CUDA graphs), else peak RSS."""
    if r.get("peak_mem_allocated_comparable") is False:
        return r.get("peak_mem_reserved_mb")
    return r.get("peak_mem_allocated_mb") if r.get("peak_mem_allocated_mb") is not None else r.get("peak_rss_mb")


def _fmt(value: Any, spec: str) -> str:
    """A dash for a figure not measured; text as it is; numbers by their format spec."""
    if value is None:
        return "–"
    return str(value) if spec == "s" else format(value, spec)


def markdown(rows: list[dict[str, Any]], env: dict[str, Any]) -> str:
    """A GitHub markdown table, with the environment it was measured on above it."""
    used = [c for c in COLUMNS if any(row.get(c[1]) not in (None, "") for row in rows) or c[1] == "variant"]
    table = [[_fmt(row.get(key), spec) for _, key, spec in used] for row in rows]
    where = ", ".join(f"{k.removeprefix('env.')}: {v}" for k, v in env.items() if v is not None)
    return f"Measured on {where}.\n\n" + tabulate(table, headers=[c[0] for c in used], tablefmt="github") + "\n"


def to_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    keys = [key for _, key, _ in COLUMNS]
    writer = csv.DictWriter(buf, fieldnames=keys, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()
