"""Presets: one param moves a run to another scale; every preset is checked, whichever is chosen."""

import pytest
import yaml

from benchlab.core import presets
from benchlab.core.errors import LabError
from benchlab.core.params import parse_params
from tests.conftest import ROOT, micro_params


def with_preset(name: str, **preset_values: object) -> dict:
    data = micro_params()
    data["preset"] = name
    data["presets"] = {"cpu": {}, "big": {"model": "gpt_small", "shape": {"block_size": 64}, **preset_values}}
    return data


def test_cpu_replaces_nothing() -> None:
    data = micro_params()
    p = parse_params(data)
    assert p.preset == "cpu" and p.model == data["model"] and p.shape.block_size == 32


def test_a_preset_replaces_the_values_it_lists_and_keeps_the_rest() -> None:
    p = parse_params(with_preset("big", precision="bf16", bench={"repeats": 2}))
    assert (p.preset, p.model, p.shape.block_size, p.run.precision, p.bench.repeats) == ("big", "gpt_small", 64, "bf16", 2)
    assert p.shape.batch_size == 4 and p.bench.steps == 6  # not listed: params.yaml's own
    assert p.variants["recipe"].precision == "bf16"


def test_the_shipped_gpu_preset_is_gpt2_124m_at_batch_16_by_1024_on_cuda() -> None:
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    data["preset"] = "gpt2_124m"
    p = parse_params(data)
    assert (p.device, p.model, p.shape.batch_size, p.shape.block_size) == ("cuda", "gpt2_124m", 16, 1024)
    assert p.parity.steps >= 1000 and p.parity.reference == "tf32"
    assert (p.run.precision, p.run.attention, p.run.compile, p.run.optimizer) == ("bf16", "sdpa", True, "adamw_fused")


@pytest.mark.parametrize("data, words", [
    (with_preset("huge"), "preset='huge' is not valid; expected one of: cpu, big"),
    (with_preset("cpu", trian={"steps": 3}), "presets.big.trian.steps is not valid: params.yaml has no key trian.steps"),
    (with_preset("big", shape={"block_sise": 8}), "presets.big.shape.block_sise is not valid"),
    (with_preset("cpu", variants={"x": {}}), "presets.big.variants.x is not valid"),
    (with_preset("big", data={"corpus": "x.txt"}), "presets.big.data.corpus is not valid: dvc.yaml builds its stages"),
    (with_preset("big", parity={"reference": "recipe"}), "presets.big.parity.reference is not valid: dvc.yaml"),
    (with_preset("big", profile={"variants": []}), "presets.big.profile.variants is not valid"),
    # a bad value in a preset that is not chosen is named too, before any work
    (with_preset("cpu", shape={"block_size": -1}), "presets.big: shape.block_size=-1 is not valid"),
    (with_preset("cpu", precision="fp12"), "presets.big: precision='fp12' is not valid"),
])
def test_bad_presets_get_one_line_errors(data, words) -> None:
    with pytest.raises(LabError) as err:
        parse_params(data)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_presets_must_be_mappings() -> None:
    data = micro_params()
    data["presets"] = {"cpu": {}, "gpu": [1, 2]}
    with pytest.raises(LabError, match=r"presets.gpu=\[1, 2\] is not valid; expected a mapping"):
        parse_params(data)


def test_resolve_names_the_keys_it_replaced() -> None:
    name, resolved, replaced = presets.resolve({"preset": "g", "presets": {"g": {"train": {"steps": 9}, "model": "x"}},
                                                "train": {"steps": 1, "lr": 0.1}, "model": "tiny"})
    assert (name, resolved, replaced) == ("g", {"train": {"steps": 9, "lr": 0.1}, "model": "x"}, ["train.steps", "model"])
