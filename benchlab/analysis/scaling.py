"""A run over several processes against its one-process counterpart in the same table: the summary's scaling
columns (scaling efficiency, the row it was scaled from, the validation-loss gap)."""

from typing import Any

from benchlab.core.knobs import KNOBS, knobs_in_group

PARALLEL_KNOBS = knobs_in_group("parallel")  # how a run is spread over processes: the knob table's "parallel" group


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
