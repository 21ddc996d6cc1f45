"""The matrix's results in one table: speedups, memory, energy, loss and parity checks.

Only variants named in params.yaml are read, in that order, so a variant
removed from params leaves no stale row. Results measured in different
environments, or from different source code, are refused unless allowed:
their ratios would mean nothing. Code with uncommitted changes, the same for
every row, is flagged per row instead: a user's workspace is such a tree.
"""

import csv
import io
from collections.abc import Sequence
from typing import Any

from tabulate import tabulate

from benchlab.analysis.scaling import scaling
from benchlab.core import record, stats
from benchlab.core.knobs import KNOBS, changes_math
from benchlab.core.old_names import record_keys
from benchlab.core.record import ALLOCATED, ALLOCATED_COMPARABLE, RESERVED, RSS, Result, compared_memory
from benchlab.core.sections import AggregateParams

# (column, key in the row, format) for the markdown table.
COLUMNS: list[tuple[str, str, str]] = [
    ("variant", "variant", "s"),
    ("status", "status", "s"),
    ("track", "track", "s"),
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
    ("peak alloc MiB", ALLOCATED, ",.0f"),
    ("peak reserved MiB", RESERVED, ",.0f"),
    ("peak RSS MiB", RSS, ",.0f"),
    ("memory vs base %", "mem_change_pct", "+.1f"),
    ("MFU %", "mfu_pct", ".1f"),
    ("warm-up s", "warmup_s", ".1f"),
    ("train loss", "final_train_loss", ".4f"),
    ("val loss", "val_loss", ".4f"),
    ("val ppl", "val_perplexity", ".1f"),
    ("loss ok", "loss_ok", "s"),
    ("learns the same", "learns_same", "s"),
    ("parity gap nats", "parity_gap_nats", "+.3f"),
    ("board W", "power_w_mean", ".0f"),
    ("tokens/J", "tokens_per_joule", ",.1f"),
    ("energy", "energy_note", "s"),
    ("notes", "notes", "s"),
]
# Keys the CSV carries beyond the table's: the row every ratio was taken against.
CSV_ONLY = ("speedup_vs",)
UNCOMMITTED_NOTE = "measured from uncommitted code"
# A variant's place in the report's plots: the seed's matrix (the baseline and variants one knob from it), the
# knobs on the recipe (variants nearer aggregate.reference than the baseline), our own (aggregate.ours), the rest.
KINDS: dict[str, str] = {"seed": "the seed's matrix", "recipe": "knobs on the recipe", "ours": "our own",
                         "other": "other"}


def table(results: list[dict[str, Any]], agg: AggregateParams,
          parity: dict[str, dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """The summary's rows, each with its kind, and the line saying which row the ratios are against and why."""
    rows = summarize(results, agg.baseline, agg.loss_tolerance, agg.repeat_tolerance, agg.fallback_baselines, parity)
    assign_kinds(rows, agg.baseline, agg.reference, agg.ours)
    return rows, ratio_reference(results, agg.baseline, agg.fallback_baselines)[1]


def _ci(r: dict[str, Any]) -> tuple[float, float] | None:
    """The interval a row is judged by: where the next independent run should land, 95%."""
    low, high = r.get("tokens_per_sec_pi95_low"), r.get("tokens_per_sec_pi95_high")
    return (low, high) if low is not None and high is not None else None


def summarize(results: list[dict[str, Any]], baseline: str, tolerance: float,
              repeat_tolerance: float = float("inf"), fallbacks: Sequence[str] = (),
              parity: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One row per variant, compared with the baseline's row, or with the first of `fallbacks` that ran ok where
    the baseline did not (`ratio_reference`); `parity` holds the parity records by variant."""
    base_name, _ = ratio_reference(results, baseline, fallbacks)
    base = next((r for r in results if r["variant"] == base_name), None)
    rows = []
    for r in results:
        row = {k: r.get(k) for _, k, _ in COLUMNS if k in r}
        row.update({"variant": r["variant"], "status": r["status"], "notes": r.get("message", ""),
                    "settings": {k: r.get(k) for k in KNOBS}, "repeats": r.get("repeats")})
        row["track"] = track(row["settings"])
        ci = _ci(r)
        row["tokens_per_sec_pi95"] = f"{ci[0]:,.0f} to {ci[1]:,.0f}" if ci else None
        row["tokens_per_sec_pi95_low"], row["tokens_per_sec_pi95_high"] = ci or (None, None)  # plots' whiskers
        # Whether CUDA graphs hid their pools from the allocated peak: record.Memory reads it from the row too.
        row[ALLOCATED_COMPARABLE] = r.get(ALLOCATED_COMPARABLE)
        row.update(compare(r, base, tolerance))
        if r["status"] == "ok":
            row["notes"] = "; ".join(warnings(r, repeat_tolerance))
        if r.get("provenance.tree_clean") is False:
            row["notes"] = "; ".join(n for n in (row["notes"], UNCOMMITTED_NOTE) if n)
        row.update(energy(r), **parity_columns((parity or {}).get(r["variant"])))
        row.update(scaling(r, results))
        rows.append(row)
    return rows


def track(settings: dict[str, Any]) -> str:
    """systems-only (the same math, faster: this table's track), or the knobs that change the optimization, whose
    track is time to a target loss (ttl/dvc.yaml); a record without a knob's key predates it, which changed nothing."""
    changes = [f"{k}={v}" for k, v in settings.items() if v is not None and changes_math(k, v)]
    return f"changes the optimization: {', '.join(changes)}" if changes else "systems-only"


def compare(r: dict[str, Any], base: dict[str, Any] | None, tolerance: float) -> dict[str, Any]:
    """Speedup, memory change, significance and loss check of one row against the reference row `base`."""
    out: dict[str, Any] = {"speedup_x": None, "speedup_vs": None, "mem_change_pct": None, "significant": None,
                           "loss_ok": None}
    if r["status"] != "ok" or base is None:
        return out
    out["speedup_x"] = r["tokens_per_sec"] / base["tokens_per_sec"]
    out["speedup_vs"] = base["variant"]
    mem, base_mem = compared_memory(r), compared_memory(base)
    if mem is not None and base_mem:
        out["mem_change_pct"] = 100.0 * (mem - base_mem) / base_mem
    sep = stats.separated(_ci(r), _ci(base))
    out["significant"] = None if sep is None or r is base else ("yes" if sep else "no")
    gap = abs(r["val_loss"] - base["val_loss"])
    out["loss_ok"] = "yes" if gap <= tolerance else f"NO ({gap:.3f} > {tolerance})"
    if r.get("batch_size") != base.get("batch_size"):
        out["loss_ok"] = f"n/a (batch {r.get('batch_size')}, {base['variant']} {base.get('batch_size')})"
    return out


def warnings(r: dict[str, Any], repeat_tolerance: float) -> list[str]:
    """What a reader should know before trusting an ok row's figures."""
    out = []
    if r.get("stalled_steps") or r.get("stall_outside_steps_ms"):
        out.append(_stall(r))
    elif not r.get("steady_state_ok", True):
        out.append(f"timed halves differ by {r['steady_gap_pct']:.1f}%: not steady")
    if r.get("leak_suspected"):
        out.append(f"memory grew {r['mem_growth_mb']:.1f} MiB over the timed steps")
    spread = r.get("val_loss_repeat_spread") or 0.0
    if spread > repeat_tolerance:
        out.append(f"repeats disagree: val loss spread {spread:.4f} > {repeat_tolerance}")
    asked = r.get("repeats_asked")
    if asked and r.get("repeats", asked) < asked:
        out.append(f"{r['repeats']} of {asked} repeats: a time limit stopped the rest")
    if r.get("interference_suspected"):
        out.append(_interference(r))
    if r.get(ALLOCATED_COMPARABLE) is False:
        out.append("CUDA graphs: allocated peak misses the graph pools; compare reserved memory")
    if r.get("fp16_skipped_steps"):
        out.append(f"GradScaler skipped {r['fp16_skipped_steps']} steps")
    return out


def energy(r: dict[str, Any]) -> dict[str, Any]:
    """The board's mean power and tokens per joule as measured, or why they were not: never a figure of our own.
    A record from before power was measured (no power keys at all) says nothing."""
    out = {"power_w_mean": r.get("power_w_mean"), "tokens_per_joule": r.get("tokens_per_joule"), "energy_note": None}
    measured = out["power_w_mean"] is not None and out["tokens_per_joule"] is not None
    if r["status"] == "ok" and not measured and ("power_w_mean" in r or "power_note" in r):
        out["energy_note"] = f"not measured: {r['power_note']}" if r.get("power_note") else "not measured"
    return out


def parity_columns(rec: dict[str, Any] | None) -> dict[str, Any]:
    """A parity record's verdict in words ("yes", "no: worse by 0.12 nats", "not judged: ...") and its gap in nats;
    None for a variant parity did not train."""
    if rec is None:
        return {"learns_same": None, "parity_gap_nats": None}
    verdict = rec.get("verdict") or f"{rec.get('status', 'no verdict')}: {rec.get('message') or 'no message'}"
    text = {True: "yes", False: f"no: {verdict}"}.get(rec.get("learns_same"), verdict)
    gap = rec.get("gap_nats") if rec.get("status") == "ok" else None
    return {"learns_same": text, "parity_gap_nats": gap if isinstance(gap, (int, float)) else None}


def ratio_reference(results: list[dict[str, Any]], baseline: str,
                    fallbacks: Sequence[str] = ()) -> tuple[str | None, str]:
    """The variant every ratio is taken against (benchlab.core.record.ratio_reference), and one line saying which
    and why."""
    name = record.ratio_reference([Result.of(r) for r in results], baseline, fallbacks)
    if name == baseline:
        return baseline, f"Ratios (speedup, memory change, loss check) are against {baseline}, aggregate.baseline."
    why = f"{baseline} {not_run_reason({r['variant']: r for r in results}.get(baseline))}"
    if name is not None:
        return name, f"{why}; ratios are against {name}, the first fallback that ran."
    tried = ", ".join(fallbacks) or "none named in aggregate.fallback_baselines"
    return None, f"{why}, and no fallback ran ok ({tried}); the table has no ratios."


def not_run_reason(r: dict[str, Any] | None) -> str:
    """Why a row has no measurement, in words that fit after its name."""
    if r is None:
        return "has no result in this run"
    if r["status"] == "oom":
        return "ran out of memory" + stopped_at(r)
    return {"skipped": "was skipped", "diverged": "diverged", "error": "ended in an error"}.get(
        r["status"], f"ended {r['status']}") + (f" ({r['message']})" if r.get("message") else "")


def stopped_at(r: dict[str, Any]) -> str:
    """' at 23,900 MiB reserved (23,100 MiB allocated) under a 24 GiB cap': the memory an oom row stopped at, from
    its record; empty where the record has no figure."""
    parts = [f"{r[k]:,.0f} MiB {word}" for k, word in ((RESERVED, "reserved"), (ALLOCATED, "allocated")) if r.get(k)]
    where = f" at {parts[0]}" + (f" ({parts[1]})" if len(parts) > 1 else "") if parts else ""
    cap = memory_cap_gib(r)
    return where + (f" under a {cap:g} GiB cap" if cap else "")


def memory_cap_gib(r: dict[str, Any]) -> float | None:
    """The GPU memory cap a record ran under; None for none (0, or a record from before the cap existed). Records
    written before params.yaml was grouped by stage hold it under its old key (`record_keys`)."""
    cap = next((r[k] for k in record_keys("harness.memory_cap_gib") if k in r), r.get("memory_cap_gib"))
    return cap or None


def assign_kinds(rows: list[dict[str, Any]], baseline: str, reference: str, ours: Sequence[str]) -> None:
    """Set each row's "kind" (a key of KINDS) from its knobs: see KINDS."""
    settings = {r["variant"]: r.get("settings") or {} for r in rows}
    base, ref = settings.get(baseline), settings.get(reference)
    for r in rows:
        mine = settings[r["variant"]]
        to_base = knob_distance(mine, base) if base is not None else float("inf")
        to_ref = knob_distance(mine, ref) if ref is not None else float("inf")
        if r["variant"] in ours:
            r["kind"] = "ours"
        elif r["variant"] == reference or (ref is not None and (to_ref < to_base or reference == baseline)):
            r["kind"] = "recipe"
        elif to_base <= 1:
            r["kind"] = "seed"
        else:
            r["kind"] = "other"


def knob_distance(a: dict[str, Any], b: dict[str, Any]) -> int:
    """How many knobs two rows set differently; a knob an older record lacks counts as the same."""
    return sum(1 for k in KNOBS if a.get(k) is not None and b.get(k) is not None and a[k] != b[k])


def _stall(r: dict[str, Any]) -> str:
    """What stalled the timed window, and by how much (benchlab.core.stats.stalls)."""
    parts = []
    steps = r.get("stalled_steps") or 0
    if steps:
        median = f"the {r['step_ms_median']:.2f} ms" if r.get("step_ms_median") else "the"
        parts.append(f"{steps} timed step{'s' if steps > 1 else ''} stalled, the longest {r['stall_ms_max']:,.0f} ms "
                     f"beyond {median} median step (a stall: over {stats.STALL_FACTOR:g}x it)")
    if r.get("stall_outside_steps_ms"):
        parts.append(f"{r['stall_outside_steps_ms']:,.0f} ms passed between timed steps (the process was stopped or "
                     "starved)")
    return "timing disturbed: " + "; ".join(parts) + "; rerun on a quiet machine"


def _interference(r: dict[str, Any]) -> str:
    parts = []
    if r.get("other_gpu_processes"):
        parts.append(f"other GPU processes {r['other_gpu_processes']}")
    if (r.get("cpu_busy_others_pct_max") or 0.0) > 0:
        parts.append(f"others kept {r['cpu_busy_others_pct_max']:.0f}% of the CPU busy")
    return "machine shared while timed: " + ", ".join(parts)


def _fmt(value: Any, spec: str) -> str:
    """A dash for a figure not measured; text as it is; numbers by their format spec."""
    if value is None:
        return "–"
    return str(value) if spec == "s" else format(value, spec)


def markdown(rows: list[dict[str, Any]], env: dict[str, Any], note: str = "") -> str:
    """A GitHub markdown table, with the environment it was measured on above it, and `note` (which row the
    ratios are against, and why) below that."""
    used = [c for c in COLUMNS if any(row.get(c[1]) not in (None, "") for row in rows) or c[1] == "variant"]
    table = [[_fmt(row.get(key), spec) for _, key, spec in used] for row in rows]
    where = ", ".join(f"{k.removeprefix('env.')}: {v}" for k, v in env.items() if v is not None)
    head = f"Measured on {where}.\n\n" + (f"{note}\n\n" if note else "")
    return head + tabulate(table, headers=[c[0] for c in used], tablefmt="github") + "\n"


def to_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    keys = [key for _, key, _ in COLUMNS] + list(CSV_ONLY)
    writer = csv.DictWriter(buf, fieldnames=keys, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()
