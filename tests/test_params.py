"""params.yaml's variants written as changes to the recipe (benchlab/core/params.py, `base: recipe`): each reads as
its whole settings, and a base that no stage depends on is refused in one line."""

from dataclasses import replace

import pytest

from benchlab.core.errors import LabError
from benchlab.core.params import BASE, parse_params
from tests.conftest import micro_params


def test_a_variant_on_the_recipe_is_the_recipes_knobs_with_its_changes() -> None:
    data = micro_params()
    data["variants"]["mine"] = {"base": BASE, "loss": "chunked", "optimizer": "adamw"}
    p = parse_params(data)
    assert p.variants["mine"] == replace(p.variants[BASE], loss="chunked", optimizer="adamw")
    assert p.variants["mine"].precision == "bf16" and p.variants["mine"].compile  # the recipe's, not the defaults'
    data["variants"][BASE]["attention"] = "manual"  # a change to the recipe reaches every variant written on it
    assert parse_params(data).variants["mine"].attention == "manual"


def test_every_variant_of_params_yaml_written_on_the_recipe_states_only_what_it_changes() -> None:
    data = micro_params()
    p = parse_params(data)
    for name, written in data["variants"].items():
        if isinstance(written, dict) and written.get("base") == BASE:
            changed = {k: v for k, v in written.items() if k != "base"}
            assert changed and all(getattr(p.variants[BASE], k) != v for k, v in changed.items()), name


@pytest.mark.parametrize("variants, message", [
    ({"mine": {"base": "tf32", "loss": "chunked"}},
     "variants.mine.base='tf32' is not valid; expected recipe (the one base every matrix stage depends on)"),
    ({"recipe": {"base": "recipe", "loss": "chunked"}}, "variants.recipe.base=recipe needs variants.recipe written"),
])
def test_a_base_other_than_the_recipe_is_refused_naming_the_key(variants: dict, message: str) -> None:
    data = micro_params()
    data["variants"].update(variants)
    with pytest.raises(LabError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_params(data)
