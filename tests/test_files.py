"""benchlab/core/files.py: a stage's new outputs wait aside and replace the earlier ones only when it succeeds."""

from pathlib import Path

import pytest

from benchlab.core import files
from benchlab.core.errors import LabError
from benchlab.core.stage_main import run_main


def earlier(tmp_path: Path) -> dict[str, bytes]:
    """An earlier run's outputs: two files and a folder of plots."""
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "old.png").write_bytes(b"old png")
    (tmp_path / "a.json").write_bytes(b'{"run": "earlier"}\n')
    (tmp_path / "b.csv").write_bytes(b"step,loss\n0,9.9\n")
    return state(tmp_path)


def state(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_what_a_stage_writes_waits_aside_until_it_commits(tmp_path: Path) -> None:
    before = earlier(tmp_path)
    files.claim_outputs(tmp_path / "a.json", tmp_path / "b.csv", tmp_path / "plots")
    files.write_json(tmp_path / "a.json", {"run": "new"})
    files.write_text(tmp_path / "plots" / "new.png", "new png")
    assert {k: v for k, v in state(tmp_path).items() if not Path(k).name.startswith(".")} == before
    files.commit_outputs()
    after = state(tmp_path)
    # a.json replaced; b.csv, which the new run did not write, removed; the folder holds the new run's files alone
    assert after == {"a.json": b'{\n  "run": "new"\n}\n', "plots/new.png": b"new png"}


@pytest.mark.parametrize("fail_after", ["claim", "one write", "every write"])
def test_a_stage_that_fails_at_any_point_leaves_the_earlier_outputs_byte_for_byte(tmp_path: Path, fail_after: str,
                                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    before = earlier(tmp_path)

    def stage(argv: list[str] | None) -> None:
        files.claim_outputs(tmp_path / "a.json", tmp_path / "b.csv", tmp_path / "plots")
        if fail_after != "claim":
            files.write_json(tmp_path / "a.json", {"run": "new"})
        if fail_after == "every write":
            files.write_text(tmp_path / "b.csv", "step,loss\n")
            files.write_text(tmp_path / "plots" / "new.png", "new png")
        raise LabError("the corpus went bad half way")

    with pytest.raises(SystemExit):
        run_main(stage, [])
    assert "error: the corpus went bad half way" in capsys.readouterr().err
    assert state(tmp_path) == before  # no aside file left either


def test_a_folder_written_aside_replaces_the_earlier_one_whole(tmp_path: Path) -> None:
    (tmp_path / "prep").mkdir()
    (tmp_path / "prep" / "meta.json").write_text("earlier")
    (tmp_path / "prep" / "stale.bin").write_text("earlier")
    new = files.aside(tmp_path / "prep")
    assert new.parent == tmp_path and new.name.startswith(".prep.new-")
    (new / "meta.json").write_text("new")
    assert (tmp_path / "prep" / "meta.json").read_text() == "earlier"  # the reader of the old folder still sees it
    files.commit_outputs()
    assert state(tmp_path) == {"prep/meta.json": b"new"}


def test_a_folder_written_aside_is_removed_when_the_stage_fails(tmp_path: Path) -> None:
    (tmp_path / "prep").mkdir()
    (tmp_path / "prep" / "meta.json").write_text("earlier")
    new = files.aside(tmp_path / "prep")
    (new / "train.bin").write_bytes(b"half")
    files.discard_outputs()
    assert state(tmp_path) == {"prep/meta.json": b"earlier"}


def test_a_write_refused_for_a_full_disk_names_the_output_not_the_aside_folder(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    new = files.aside("data/prepared")
    err = files.disk_full(new / "train.bin", OSError(28, "No space left on device"))
    assert str(err).startswith("writing data/prepared/train.bin failed: the disk is full")
