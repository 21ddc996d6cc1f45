"""benchlab/core/param_reads.py: what a stage read, noted only while a test asks, as dotted keys."""

from pathlib import Path

import pytest

from benchlab.core import param_reads
from benchlab.core.params import parse_params, with_changes
from tests.conftest import micro_params


@pytest.fixture()
def noting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> set[str]:
    """Tracing on for this test alone, writing to tmp_path/reads/stage/unit.txt (folders not there yet)."""
    reads: set[str] = set()
    monkeypatch.setattr(param_reads, "_reads", reads)
    monkeypatch.setattr(param_reads, "_path", tmp_path / "reads" / "stage" / "unit.txt")
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
    param_reads.write()
    assert not (tmp_path / "reads").exists()  # nothing read: no file
    assert (p.eval.batches, p.device) == (2, "auto")
    param_reads.write()
    assert p.bench.steps == 6
    param_reads.write()
    assert (tmp_path / "reads" / "stage" / "unit.txt").read_text() == "device\neval.batches\nbench.steps\n"


def test_the_corpus_check_notes_its_one_key(noting: set[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchlab.core.params import corpus_param

    (tmp_path / "params.yaml").write_text("data: {corpus: here.txt}\n")
    assert corpus_param(tmp_path / "params.yaml") == "here.txt" and noting == {"data.corpus"}
    monkeypatch.setattr(param_reads, "_reads", None)
    param_reads.note("data.corpus")  # not tracing: nothing to note into, and no error
    assert param_reads._reads is None


def test_start_names_the_file_after_the_dvc_stage(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(param_reads, "_reads", None)
    monkeypatch.setattr(param_reads, "_path", None)
    hooks: list[object] = []
    monkeypatch.setattr(param_reads.atexit, "register", hooks.append)
    monkeypatch.setenv("DVC_STAGE", "bench@fp16")
    monkeypatch.delenv(param_reads.ENV, raising=False)
    param_reads.start()
    assert param_reads._reads is None  # not asked: nothing noted
    monkeypatch.setenv(param_reads.ENV, str(tmp_path))
    param_reads.start()
    assert param_reads._reads == set() and param_reads._path == tmp_path / "bench@fp16.txt"
    assert hooks == [param_reads.write]  # written at exit
    param_reads.start()  # a second load of params.yaml in the process keeps what was noted
    assert param_reads._path == tmp_path / "bench@fp16.txt"


@pytest.mark.parametrize(("stage", "argv0", "file"), [
    ("search/dvc.yaml:search", "x", "search_dvc.yaml:search.txt"),  # DVC's address of a stage in another dvc.yaml
    ("", "/repo/stages/bench.py", "bench.txt"),  # run by hand: the module's name
])
def test_the_file_is_named_after_the_stage_or_else_the_module(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                              stage: str, argv0: str, file: str) -> None:
    monkeypatch.setattr(param_reads, "_reads", None)
    monkeypatch.setattr(param_reads.atexit, "register", lambda f: None)
    monkeypatch.setattr(param_reads.sys, "argv", [argv0, "first-argument"])
    monkeypatch.setenv("DVC_STAGE", stage)
    monkeypatch.setenv(param_reads.ENV, str(tmp_path))
    param_reads.start()
    assert param_reads._path == tmp_path / file
