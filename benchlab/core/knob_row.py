"""How one row of the knob table (`benchlab.core.knobs.RunSettings`) is declared: `knob()`, the steps of
`benchlab.run.apply_knobs.apply` a row may name (`STEPS`, the one declaration of their order), and the groups a
knob belongs to. Torch-free, like the table.
"""

from dataclasses import Field, field
from typing import Any, Literal, get_args

from benchlab.core.skips import SkipCheck

# What a knob is about: analysis.scaling.PARALLEL_KNOBS (how a run is spread over processes) is the "parallel" group's.
Group = Literal["precision", "kernels", "memory", "loss", "optimizer", "compile", "batch", "parallel"]

# The steps of `benchlab.run.apply_knobs.apply`, in the order it takes them (the constructor's, the attention
# kernel, comes before apply): the one declaration of that order. A knob names the steps it is applied at, the knob
# table numbers each by its place here, and apply_knobs.STEP_FUNCTIONS names the function of each step after the
# constructor's (checked on import; tests/unit/test_apply_knobs.py checks that apply calls them in this order).
STEPS: tuple[str, ...] = ("constructor", "placement", "matmul_flags", "float8", "checkpointing", "parallel",
                          "loss_head", "optimizer", "autocast")

_DEFAULT = object()  # knob()'s `unoptimized` when not given: the default


def knob(default: Any, doc: str, applied: dict[str, str] | str, skip: SkipCheck | None = None, *, group: Group,
         searched: bool = True, unoptimized: Any = _DEFAULT, changes_math: bool | tuple = False,
         top_level: str = "") -> Any:
    """One row of the knob table: a dataclass field with its documentation, where it is applied, its device check
    and what the analysis and the search read. `applied` maps steps of STEPS to what happens there, or is a place
    outside `apply` (unnumbered).

    `group`: what the knob is about (the "parallel" group: how a run is spread over processes).
    `searched`: whether the search (benchlab/search/) tries the knob's values; the batch and the process layout are
    a search's inputs, not its answers.
    `unoptimized`: the value a search for speed never moves the knob back to; by default `default`, the baseline's.
    None: no value is slower by itself (grad_accum, which the search moves by its goal).
    `changes_math`: the values that change the optimization itself, not only its speed (True: every value but the
    default). Parity does not judge them and the search does not try them; the time-to-loss track (ttl/) does.
    `top_level`: empty where the train stage reads the knob from params.yaml's top level (params.yaml has its line,
    dvc.yaml's train stage its key); else the train stage cannot honour it there, and this says where to set it
    instead: the end of the line that refuses it when params load."""
    unknown = [s for s in applied if s not in STEPS] if isinstance(applied, dict) else []
    if unknown:  # a bug in benchlab/core/knobs.py, found on import
        raise ValueError(f"knob applied at unknown steps {unknown}; the steps: {', '.join(STEPS)}")
    if group not in get_args(Group):
        raise ValueError(f"knob group {group!r}; the groups: {', '.join(get_args(Group))}")
    return field(default=default, metadata={
        "doc": doc, "applied": applied, "skip": skip, "group": group, "searched": searched,
        "unoptimized": default if unoptimized is _DEFAULT else unoptimized, "changes_math": changes_math,
        "top_level": top_level})


def applied_at(f: Field) -> str:
    """Where a knob is applied, as the table shows it: each step numbered by its place in STEPS."""
    applied = f.metadata["applied"]
    if isinstance(applied, str):
        return applied
    return "; ".join(f"{STEPS.index(step)}. {words}" for step, words in applied.items())
