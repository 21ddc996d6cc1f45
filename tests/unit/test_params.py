"""params.yaml into `Params` (benchlab/core/params.py): variants written as changes to an entry of `bases` (`base:
recipe`) read as their whole settings, and a base that is not there is refused in one line; the variant a stage runs; the
file read (a key given twice, its encoding, a YAML error by its line) and a preset's values put in place."""


import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from benchlab.core.errors import LabError
from benchlab.core.params import load_params, parse_params, variant_from
from tests.conftest import micro_params


def test_a_variant_on_the_recipe_is_the_recipes_knobs_with_its_changes() -> None:
    data = micro_params()
    data["variants"]["mine"] = {"base": "recipe", "loss": "chunked", "optimizer": "adamw"}
    p = parse_params(data)
    assert p.variants["mine"] == replace(p.bases["recipe"], loss="chunked", optimizer="adamw")
    assert p.variants["mine"].precision == "bf16" and p.variants["mine"].compile  # the base's, not the defaults'
    assert p.variants["recipe"] == p.bases["recipe"]  # `{base: recipe}`: the base itself
    data["bases"]["recipe"]["attention"] = "manual"  # a change to the base reaches every variant written on it
    assert parse_params(data).variants["mine"].attention == "manual"
    matrix = {"fp32_baseline": {}, "mine": data["variants"]["mine"]}  # a matrix without the recipe may be written on it
    data["variants"], data["profile"]["variants"] = matrix, []
    data["aggregate"].update(fallback_baselines=[], ours=[], reference="fp32_baseline")
    assert parse_params(data).variants["mine"].loss == "chunked"


def test_every_variant_of_params_yaml_written_on_a_base_states_only_what_it_changes() -> None:
    data = micro_params()
    p = parse_params(data)
    for name, written in data["variants"].items():
        if isinstance(written, dict) and "base" in written:
            changed = {k: v for k, v in written.items() if k != "base"}
            assert all(getattr(p.bases[written["base"]], k) != v for k, v in changed.items()), name


@pytest.mark.parametrize("base", ["tf32", 3, None])
def test_a_base_that_is_not_in_bases_is_refused_naming_the_key(base: object) -> None:
    data = micro_params()
    data["variants"]["mine"] = {"base": base, "loss": "chunked"}
    with pytest.raises(LabError, match=r"^variants\.mine\.base=.* is not valid; expected one of bases: recipe$"):
        parse_params(data)
    data["bases"] = {}
    with pytest.raises(LabError, match=r"expected one of bases: \(none: add a bases section\)$"):
        parse_params(data)


# --- the variant to run, and the file ---------------------------------------------------------------------------

def test_variant_comes_from_the_flag_or_the_dvc_stage_name() -> None:
    p = parse_params(micro_params())
    name = next(iter(p.variants))
    assert variant_from(name, None, p) == name
    assert variant_from(None, f"bench@{name}", p) == name
    assert variant_from(None, f"profile@{name}", p, kind="profile") == name
    assert variant_from(name, "bench@not_this_one", p) == name  # the flag wins
    with pytest.raises(LabError) as err:
        variant_from(None, None, p)
    assert str(err.value) == "no variant given: pass --variant NAME, or run as the DVC stage bench@NAME"
    with pytest.raises(LabError, match="run as the DVC stage profile@NAME"):
        variant_from(None, f"bench@{name}", p, kind="profile")
    with pytest.raises(LabError) as err:
        variant_from("nope", None, p)
    assert str(err.value) == f"variant 'nope' is not in params.yaml; valid: {', '.join(p.variants)}"


def test_load_params_reads_a_file_and_names_the_bad_line(tmp_path: Path) -> None:
    good = tmp_path / "params.yaml"
    good.write_text(yaml.safe_dump(micro_params(seed=7)))
    assert load_params(good).seed == 7 and load_params(str(good)).shape.block_size == 32
    with pytest.raises(LabError) as err:
        load_params(tmp_path / "missing.yaml")
    assert str(err.value) == f"{tmp_path / 'missing.yaml'} not found; run from the repository root"
    bad = tmp_path / "bad.yaml"
    bad.write_text("seed: 1\ntrain: {batch_size: 4\n")
    with pytest.raises(LabError) as err:
        load_params(bad)
    assert str(err.value).startswith(f"{bad} is not valid YAML: ") and str(err.value).endswith("; fix that line")
    assert "at line 3, column 1" in str(err.value)


@pytest.mark.parametrize("text, message", [
    ("seed: 1\ntrain: {steps: 5}\nseed: 2\n", "gives seed twice (lines 1 and 3)"),
    ("variants:\n  recipe: {}\n  fast: {}\n  recipe: {precision: bf16}\n", "gives variants.recipe twice (lines 2 and 4)"),
    ("parity:\n  seeds: [1, 2]\nlist:\n  - {a: 1, a: 2}\n", "gives list[0].a twice (lines 4 and 4)"),
], ids=["top level", "a variant", "inside a list"])
def test_a_key_given_twice_is_refused_naming_its_path_and_both_lines(tmp_path: Path, text: str, message: str) -> None:
    """Issue 46: YAML lets the second of two equal keys win silently (`seed` twice trained with the second)."""
    path = tmp_path / "params.yaml"
    path.write_text(text)
    with pytest.raises(LabError) as err:
        load_params(path)
    assert str(err.value) == f"{path} {message}: YAML would silently keep the second; delete one"


def test_params_yaml_is_read_as_utf8_and_other_bytes_are_one_line(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text("# caf\u00e9\n" + yaml.safe_dump(micro_params(seed=3)), encoding="utf-8")
    assert load_params(path).seed == 3
    path.write_bytes(b"# caf\xe9 in latin-1\nseed: 1\n")
    with pytest.raises(LabError) as err:
        load_params(path)
    assert str(err.value) == f"{path} is not UTF-8 text (invalid continuation byte at byte 5); save it as UTF-8"


def test_a_long_key_in_a_variant_path_is_cut() -> None:
    data = micro_params()
    data["variants"]["v" * 1000] = {"precision": "int8"}
    with pytest.raises(LabError) as err:
        parse_params(data)
    assert str(err.value) == (f"variants.{'v' * 80}... (1,000 chars).precision='int8' is not valid; expected one of: "
                              "fp32, tf32, fp16, bf16")


def committed_params(folder: Path, **overrides: object) -> Path:
    """params.yaml (the micro params with `overrides`) committed in a fresh git checkout at `folder`."""
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(micro_params(**overrides), sort_keys=False))
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q"], ["add", "params.yaml"], ["commit", "-qm", "params"]):
        subprocess.run(["git", *args], cwd=folder, env=env, check=True, capture_output=True)
    return path


def set_in(path: Path, **values: object) -> None:
    """What `dvc exp run -S a.b=v` does: params.yaml rewritten with each value in place."""
    data = yaml.safe_load(path.read_text())
    for dotted, value in values.items():
        *parents, last = dotted.split("__")
        node = data
        for key in parents:
            node = node[key]
        node[last] = value
    path.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.mark.parametrize("committed, given", [
    ({"preset": "gpt2_124m"}, {"train__steps": 50}),
    ({}, {"preset": "gpt2_124m", "train__steps": 50}),
], ids=["preset committed", "preset given too"])
def test_a_value_set_where_the_preset_replaces_it_is_refused_naming_both(tmp_path: Path, committed: dict,
                                                                         given: dict) -> None:
    """Issue 45 item 7: under -S preset=gpt2_124m, -S train.steps=50 lost to the preset's value silently."""
    path = committed_params(tmp_path, **committed)
    set_in(path, **given)
    with pytest.raises(LabError) as err:
        load_params(path)
    assert str(err.value) == ("train.steps=50 is set in params.yaml (committed: 12), but preset=gpt2_124m replaces it "
                              "with presets.gpt2_124m.train.steps=100; set presets.gpt2_124m.train.steps instead (dvc "
                              "exp run -S presets.gpt2_124m.train.steps=...), or leave train.steps as committed")


def test_the_preset_s_own_key_a_key_it_leaves_and_its_own_value_are_taken(tmp_path: Path) -> None:
    path = committed_params(tmp_path)
    set_in(path, preset="gpt2_124m", presets__gpt2_124m__optim__lr=0.001, shape__batch_size=8, train__steps=100)
    p = load_params(path)
    assert p.preset == "gpt2_124m" and p.optim.lr == 0.001  # set where the preset reads it
    assert p.shape.batch_size == 8  # the preset does not replace batch_size: params.yaml's own value holds
    assert p.train.steps == 100  # the same value as the preset's: nothing is lost
    uncommitted = tmp_path / "elsewhere" / "params.yaml"
    uncommitted.parent.mkdir()
    uncommitted.write_text(path.read_text())
    set_in(uncommitted, train__steps=50)
    assert load_params(uncommitted).train.steps == 100  # no committed file to compare with: the preset's, unseen
