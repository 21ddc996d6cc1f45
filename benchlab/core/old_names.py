"""Old names in one place: the knobs of before the `optimizer` knob (how params.yaml is told what replaced them, and
how a committed results folder that still holds them is read in today's names, `benchlab.analysis.folder_report`),
and the keys that moved to another section (each refused in one line naming its new place)."""

from typing import Any

# The knobs that `optimizer` replaced (issue 35), and the old value that trained as each optimizer does, in the
# order the old if-chain picked them: adam_state=8bit, weight_dtype=bf16_sr, compile_update=true, fused_adamw=true.
OLD_OPTIMIZER_KNOBS: tuple[tuple[str, Any, str], ...] = (
    ("adam_state", "8bit", "adamw_8bit"), ("weight_dtype", "bf16_sr", "adamw_bf16_sr"),
    ("compile_update", True, "adamw_compiled"), ("fused_adamw", True, "adamw_fused"))


REPLACED_KNOBS = ("adam_state", "compile_update", "fused_adamw")


def old_knob_error(key: str, value: Any) -> str | None:
    """What to write instead of a knob, or a knob value, that `optimizer` replaced; None for any other."""
    if key == "weight_dtype":
        return "weight_dtype: bf16 with optimizer: adamw_bf16_sr" if value == "bf16_sr" else None
    for old, then, optimizer in OLD_OPTIMIZER_KNOBS:
        if key == old:
            return f"optimizer: {optimizer}" if value == then else "nothing (optimizer: adamw is the default)"
    return None


def from_old_knobs(settings: dict[str, Any]) -> dict[str, Any]:
    """A committed run's knobs in today's names. A results folder written before the `optimizer` knob holds the
    knobs it replaced, in its params.yaml and in every record; read from there, they become the optimizer that
    trains as they did. A mapping that sets none of them is returned as it is."""
    sr = settings.get("weight_dtype") == "bf16_sr"
    if not sr and not any(k in settings for k in REPLACED_KNOBS):
        return settings
    out = {k: v for k, v in settings.items() if k not in REPLACED_KNOBS}
    if sr:
        out["weight_dtype"] = "bf16"
    out["optimizer"] = next((opt for k, then, opt in OLD_OPTIMIZER_KNOBS if settings.get(k) == then), "adamw")
    return out


# Keys that moved when params.yaml was grouped by the stage that reads each section (issue 52): `train` and `bench`
# fed every stage; what every stage reads is now in shape, optim and harness, and train and bench keep their own.
MOVED_KEYS = {
    **{f"train.{k}": f"shape.{k}" for k in ("batch_size", "block_size")},
    **{f"train.{k}": f"optim.{k}" for k in ("lr", "min_lr", "lr_warmup_steps", "weight_decay", "grad_clip")},
    **{f"bench.{k}": f"harness.{k}" for k in ("warmup_steps", "steady_tolerance", "lock", "memory_cap_gib")},
}


def moved_key_error(key: str) -> str | None:
    """One line naming where a moved key lives now (`train.lr` -> `optim.lr`); None for any other key."""
    new = MOVED_KEYS.get(key)
    return (f"{key} has moved to {new} (params.yaml is grouped by the stage that reads each section, README "
            f"\"The pipeline\"): write it there, e.g. `dvc exp run -S {new}=...`") if new else None


def record_keys(key: str) -> tuple[str, ...]:
    """Where a record holds the param `key` (`shape.batch_size`): `params.<key>`, then, in a record written before
    the key moved, `params.<its old key>` (`params.train.batch_size`)."""
    old = next((was for was, now in MOVED_KEYS.items() if now == key), None)
    return (f"params.{key}", *([f"params.{old}"] if old else []))
