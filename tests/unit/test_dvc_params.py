"""Each stage lists in dvc.yaml exactly the params it reads (issue 52): a whole section where it reads all of it,
else its keys. dvc.yaml owns the lists; the stages note what they read (benchlab/core/param_reads.py) when
BENCHLAB_PARAM_READS is set, and `check_reads` holds each list to those notes. tests/test_pipeline.py runs the whole
pipeline that way, and tests/integration/test_dvc_params.py the search's and time-to-loss stages; the tests here
check the comparison itself and the lists' form."""

from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from benchlab.core.knobs import TOP_LEVEL_KNOBS
from benchlab.core.params import Params
from tests.conftest import ROOT

PIPELINES = ("dvc.yaml", "search/dvc.yaml", "ttl/dvc.yaml")
PRESET_KEYS = {"preset", "presets.${preset}"}  # the preset's values are put in place when params.yaml loads


def sections() -> dict[str, list[str]]:
    """Each section of Params (a dataclass field) and its keys."""
    return {f.name: [g.name for g in fields(f.default_factory())]  # type: ignore[misc]
            for f in fields(Params) if callable(f.default_factory) and hasattr(f.default_factory, "SECTION")}


def declared(entries: list[str]) -> set[str]:
    """A stage's params as the keys it says it reads: sections spelled out, a variant's key as `variants` (the
    stage reads the one it runs), the top-level knobs as `run` (the settings they make), the preset's left out."""
    whole = sections()
    keys: set[str] = set()
    for entry in entries:
        if entry in PRESET_KEYS:
            continue
        if entry.startswith("variants."):
            keys.add("variants")
        elif entry.startswith("ttl.variants."):
            keys.add("ttl.variants")
        elif entry in TOP_LEVEL_KNOBS:
            keys.add("run")
        elif entry in whole:
            keys |= {f"{entry}.{key}" for key in whole[entry]}
        else:
            keys.add(entry)
    return keys


def stage_params(pipeline: str) -> dict[str, list[str]]:
    """Each stage's (or foreach block's) params list as written. A foreach block's list of names is its too: DVC
    makes one stage per name, so the stage may check that its own is there (`parity.variants`)."""
    stages = yaml.safe_load((ROOT / pipeline).read_text())["stages"]
    return {name: [*(stage.get("do") or stage).get("params", []),
                   *([stage["foreach"].removeprefix("${").removesuffix("}")] if "foreach" in stage else [])]
            for name, stage in stages.items()}


def read_by(folder: Path) -> dict[str, set[str]]:
    """What each stage noted it read, by its name in its dvc.yaml (`bench@fp16` counts as `bench`; DVC names a stage
    of another dvc.yaml `search/dvc.yaml:search`, its file `search_dvc.yaml:search.txt`)."""
    reads: dict[str, set[str]] = {}
    for path in folder.glob("*.txt"):
        reads.setdefault(path.stem.rsplit(":", 1)[-1].split("@")[0], set()).update(path.read_text().split())
    return reads


def mismatches(listed: dict[str, list[str]], reads: dict[str, set[str]]) -> list[str]:
    """Each stage that ran whose list is not what it read: the keys read but not listed, and listed but not read.
    `bases` goes with `variants` (a variant is written on a base); the preset's keys with any load of params.yaml."""
    out = []
    for stage, read in sorted(reads.items()):
        entries = listed.get(stage)
        if entries is None:
            out.append(f"{stage}: not a stage of this pipeline")
            continue
        wanted = declared(entries) - {"bases"}
        variant = "variants" in read or "ttl.variants" in read
        if variant != ("bases" in entries):
            out.append(f"{stage}: reads a variant but does not list bases" if variant
                       else f"{stage}: lists bases but reads no variant")
        if read - {"data.corpus"} and not PRESET_KEYS <= set(entries):
            out.append(f"{stage}: loads params.yaml, so it must list preset and presets.${{preset}}")
        got = read - {"preset"}
        if got != wanted:
            out.append(f"{stage}: read but not listed {sorted(got - wanted)}; listed but not read {sorted(wanted - got)}")
    return out


def check_reads(folder: Path, pipeline: str = "dvc.yaml", only: set[str] | None = None) -> None:
    """Fail naming every stage of `pipeline` (or those in `only`) whose params list is not exactly what it read into
    `folder`."""
    reads = {stage: read for stage, read in read_by(folder).items() if only is None or stage in only}
    assert reads, f"no stage noted its reads in {folder}"
    problems = mismatches(stage_params(pipeline), reads)
    assert not problems, "\n".join(problems)


def test_each_stage_s_notes_count_under_its_name_in_its_dvc_yaml(tmp_path: Path) -> None:
    for name, keys in (("bench@fp16", "seed\n"), ("bench@recipe", "device\n"), ("ttl_dvc.yaml:ttl@muon", "model\n"),
                       ("search_dvc.yaml:search", "search.budget_s\n")):
        (tmp_path / f"{name}.txt").write_text(keys)
    assert read_by(tmp_path) == {"bench": {"seed", "device"}, "ttl": {"model"}, "search": {"search.budget_s"}}


def test_a_section_listed_whole_counts_each_of_its_keys() -> None:
    assert declared(["shape", "harness.lock", "precision", "variants.${key}", "preset"]) == {
        "shape.batch_size", "shape.block_size", "harness.lock", "run", "variants"}


def test_a_stage_reading_a_key_it_does_not_list_is_named() -> None:
    listed = {"evaluate": ["preset", "presets.${preset}", "device", "shape"]}
    problems = mismatches(listed, {"evaluate": {"device", "shape.batch_size", "shape.block_size", "eval.batches"}})
    assert problems == ["evaluate: read but not listed ['eval.batches']; listed but not read []"]


def test_a_stage_listing_a_key_it_never_reads_is_named() -> None:
    listed = {"evaluate": ["preset", "presets.${preset}", "device", "shape"]}
    assert mismatches(listed, {"evaluate": {"device", "shape.batch_size"}}) == [
        "evaluate: read but not listed []; listed but not read ['shape.block_size']"]


def test_a_variant_needs_bases_and_a_load_needs_the_preset() -> None:
    listed = {"bench": ["device", "variants.${key}"]}
    assert mismatches(listed, {"bench": {"device", "variants"}}) == [
        "bench: reads a variant but does not list bases",
        "bench: loads params.yaml, so it must list preset and presets.${preset}"]
    listed = {"aggregate": ["preset", "presets.${preset}", "aggregate.baseline", "bases"]}
    assert mismatches(listed, {"aggregate": {"aggregate.baseline"}}) == ["aggregate: lists bases but reads no variant"]


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_every_listed_param_is_in_params_yaml(pipeline: str) -> None:
    """A typo in a list would make DVC track a key that does not exist; each entry names a real section or key."""
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    for stage, entries in stage_params(pipeline).items():
        for entry in entries:
            if "${" in entry:
                continue
            node = data
            for part in entry.split("."):
                assert isinstance(node, dict) and part in node, f"{pipeline}: {stage} lists {entry}, not in params.yaml"
                node = node[part]


def test_the_root_and_search_pipelines_stay_short() -> None:
    """Issue 52's limit: a stage names sections, so the two files together stay under 220 lines."""
    lines = sum(len((ROOT / name).read_text().splitlines()) for name in ("dvc.yaml", "search/dvc.yaml"))
    assert lines < 220, lines

