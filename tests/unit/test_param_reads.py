"""benchlab/core/param_reads.py: what a stage read, noted only while a test asks, as dotted keys."""

from pathlib import Path

import pytest

from benchlab.core import param_reads
from benchlab.core.params import parse_params, with_changes
from tests.conftest import micro_params


@pytest.fixture()
def noting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> set[str]:
    """Tracing on for this test alone, writing to tmp_path/unit.txt."""
    reads: set[str] = set()
    monkeypatch.setattr(param_reads, "_reads", reads)
    monkeypatch.setattr(param_reads, "_path", tmp_path / "unit.txt")
    return reads


def test_nothing_is_noted_unless_a_stage_traces() -> None:
    p = parse_params(micro_params())
    assert p.shape.block_size == 32 and param_reads._reads is None


def test_a_read_is_noted_by_its_section_and_key(noting: set[str]) -> None:
    p = parse_params(micro_params())
    noting.clear()  # what parsing checked is not a stage's read
    assert (p.seed, p.optim.lr, p.harness.lock) == (1337, 0.002, "wait")
    assert noting == {"seed", "optim.lr", "harness.lock"}  # `p.optim` itself is no read: its keys are


def test_values_a_stage_put_in_itself_are_not_reads_of_params_yaml(noting: set[str]) -> None:
    p = parse_params(micro_params())
    noting.clear()
    arm = with_changes(p, seed=3)
    assert noting == set()  # building it read nothing
    assert arm.seed == 3 and arm.model == "tiny"
    assert noting == {"model"}
    with param_reads.quiet():
        assert arm.device == "auto"
    assert noting == {"model"}


def test_the_reads_are_appended_to_the_stage_s_file_and_noted_afresh(noting: set[str], tmp_path: Path) -> None:
    p = parse_params(micro_params())
    noting.clear()
    assert p.eval.batches == 2
    param_reads.write()
    assert p.bench.steps == 6
    param_reads.write()
    assert (tmp_path / "unit.txt").read_text() == "eval.batches\nbench.steps\n"


def test_start_names_the_file_after_the_dvc_stage(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(param_reads, "_reads", None)
    monkeypatch.setattr(param_reads, "_path", None)
    monkeypatch.setattr(param_reads.atexit, "register", lambda f: None)
    monkeypatch.setenv("DVC_STAGE", "bench@fp16")
    monkeypatch.delenv(param_reads.ENV, raising=False)
    param_reads.start()
    assert param_reads._reads is None  # not asked: nothing noted
    monkeypatch.setenv(param_reads.ENV, str(tmp_path))
    param_reads.start()
    assert param_reads._reads == set() and param_reads._path == tmp_path / "bench@fp16.txt"
