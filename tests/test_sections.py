"""params.yaml owns the values of its sections: each dataclass default in `benchlab.core.sections` (and `Params`'
own fields) is the value params.yaml gives, so a key left out means what the file says. Only what names variants
defaults to none, since a section cannot know the matrix."""

from dataclasses import MISSING, Field, fields, is_dataclass
from typing import Any

import yaml

from benchlab.core.params import Params
from tests.conftest import ROOT

# The fields that name variants of the matrix: empty by default (params.yaml's are its own matrix).
NAMES_VARIANTS = {"variants", "profile.variants", "parity.variants", "ttl.variants"}


def default(f: Field) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default


def defaults_and_values(data: dict) -> list[tuple[str, Any, Any]]:
    """(key, dataclass default, params.yaml's value) for each field of Params and of each of its sections."""
    out = []
    for f in fields(Params):
        if f.name == "run":  # the knobs: their defaults are the unoptimized baseline (tests/test_knobs.py)
            continue
        value = default(f)
        if is_dataclass(value):
            out += [(f"{f.name}.{g.name}", default(g), data[f.name].get(g.name, "(missing)")) for g in fields(value)]
        else:
            out.append((f.name, value, data.get(f.name, "(missing)")))
    return out


def test_every_section_default_is_params_yaml_s_value() -> None:
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    rows = defaults_and_values(data)
    drifted = {key: (mine, theirs) for key, mine, theirs in rows if key not in NAMES_VARIANTS and mine != theirs}
    assert drifted == {}, "set these defaults in benchlab/core/sections.py to params.yaml's values (default, yaml)"
    assert all(not mine for key, mine, _ in rows if key in NAMES_VARIANTS)


def test_a_default_that_drifts_is_found() -> None:
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    data["train"]["steps"] += 1
    data["search"].pop("budget_s")
    drifted = {key for key, mine, theirs in defaults_and_values(data) if mine != theirs}
    assert {"train.steps", "search.budget_s"} <= drifted
