"""benchlab/core/files.py: a stage's new outputs wait aside and replace the earlier ones only when it succeeds."""

import errno
import hashlib
import os
import tracemalloc
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


def test_a_claimed_folder_holds_what_the_new_run_wrote_into_it_nested_or_not(tmp_path: Path) -> None:
    earlier(tmp_path)
    files.claim_outputs(tmp_path / "plots")
    files.write_text(tmp_path / "plots" / "memory" / "a.png", "a")  # its subfolder is the first thing written
    files.write_text(tmp_path / "plots" / "memory" / "b.png", "b")
    files.commit_outputs()
    assert {k: v for k, v in state(tmp_path).items() if k.startswith("plots")} == {"plots/memory/a.png": b"a",
                                                                                     "plots/memory/b.png": b"b"}


def test_a_claimed_folder_the_new_run_wrote_nothing_into_is_removed_whole(tmp_path: Path) -> None:
    earlier(tmp_path)
    files.claim_outputs(tmp_path / "a.json", tmp_path / "plots")
    files.write_json(tmp_path / "a.json", {"run": "new"})
    files.commit_outputs()
    assert not (tmp_path / "plots").exists() and (tmp_path / "b.csv").exists()


def test_a_file_outside_the_claimed_outputs_is_written_in_place_at_once(tmp_path: Path) -> None:
    before = earlier(tmp_path)
    files.claim_outputs(tmp_path / "a.json", tmp_path / "plots")
    files.write_text(tmp_path / "notes.txt", "written now")
    assert state(tmp_path) == {**before, "notes.txt": b"written now"}


def test_json_is_written_with_sorted_keys(tmp_path: Path) -> None:
    files.write_json(tmp_path / "r.json", {"b": 1, "a": {"d": 2, "c": 3}})
    assert (tmp_path / "r.json").read_text() == '{\n  "a": {\n    "c": 3,\n    "d": 2\n  },\n  "b": 1\n}\n'


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


def test_a_folder_left_aside_by_a_killed_run_with_this_pid_is_emptied_first(tmp_path: Path) -> None:
    (tmp_path / f".prep.new-{os.getpid()}").mkdir()
    (tmp_path / f".prep.new-{os.getpid()}" / "train.bin").write_bytes(b"half")
    new = files.aside(tmp_path / "prep")
    assert new.is_dir() and list(new.iterdir()) == []


def test_a_folder_written_aside_is_removed_when_the_stage_fails(tmp_path: Path) -> None:
    (tmp_path / "prep").mkdir()
    (tmp_path / "prep" / "meta.json").write_text("earlier")
    new = files.aside(tmp_path / "prep")
    (new / "train.bin").write_bytes(b"half")
    files.discard_outputs()
    assert state(tmp_path) == {"prep/meta.json": b"earlier"}


def test_a_stage_that_fails_removes_the_files_it_put_in_place_but_not_another_runs(tmp_path: Path) -> None:
    for name in ("gone.txt", "mine.txt", "theirs.txt"):  # outside any claimed output: renamed into place at once
        files.write_text(tmp_path / name, "this run")
    (tmp_path / "gone.txt").unlink()  # removed already (by hand, or by the stop's first cleanup)
    (tmp_path / "other-run.tmp").write_text("another run")
    os.replace(tmp_path / "other-run.tmp", tmp_path / "theirs.txt")  # another run wrote it since
    files.discard_outputs()
    assert state(tmp_path) == {"theirs.txt": b"another run"}


def test_discarding_after_the_aside_folder_is_gone_still_removes_the_rest(tmp_path: Path) -> None:
    """The watcher's stop and the stage's own failure may both discard: the second finds the folder gone."""
    new = files.aside(tmp_path / "prep")
    files.write_text(tmp_path / "log.txt", "this run")
    new.rmdir()
    files.discard_outputs()
    assert state(tmp_path) == {}


def test_a_guard_that_refuses_at_commit_moves_nothing_into_place(tmp_path: Path) -> None:
    before = earlier(tmp_path)
    files.claim_outputs(tmp_path / "a.json", tmp_path / "b.csv", tmp_path / "plots")
    files.write_json(tmp_path / "a.json", {"run": "new"})

    def params_unchanged() -> None:
        raise LabError("params.yaml changed while the stage ran")

    files.guard(params_unchanged)
    with pytest.raises(LabError, match="params.yaml changed"):
        files.commit_outputs()
    files.discard_outputs()
    assert state(tmp_path) == before


def test_a_write_refused_for_a_full_disk_names_the_output_not_the_aside_folder(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    new = files.aside("data/prepared")
    err = files.disk_full(new / "train.bin", OSError(28, "No space left on device"))
    assert str(err).startswith("writing data/prepared/train.bin failed: the disk is full")


def test_a_full_disk_s_message_says_what_to_do(tmp_path: Path) -> None:
    err = files.disk_full(tmp_path / "ckpt.pt", OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert str(err) == (f"writing {tmp_path / 'ckpt.pt'} failed: the disk quota is used up; nothing was recorded. "
                        "Free space (or raise the limit) and rerun the stage")


@pytest.mark.parametrize("err, first", [
    (OSError("1024 requested and 512 written"), "1024 requested and 512 written"),  # numpy's tofile, no errno
    (RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0\nframe #0"),  # torch.save's
     "[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0"),
    (RuntimeError(), "RuntimeError"),
], ids=["numpy", "torch", "no words"])
def test_a_write_stopped_short_without_an_errno_names_the_error_s_first_line(tmp_path: Path, err: Exception,
                                                                           first: str) -> None:
    assert str(files.disk_full(tmp_path / "train.bin", err)) == (
        f"writing {tmp_path / 'train.bin'} failed: the write stopped short ({first}): the disk is full or a file-size "
        "limit (ulimit -f) was reached; nothing was recorded. Free space (or raise the limit) and rerun the stage")


def test_a_path_outside_the_aside_folder_keeps_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    new = files.aside("data/prepared")
    assert files.final_name("data/other.bin") == Path("data/other.bin")
    assert files.final_name(new) == Path("data/prepared")


def test_a_file_s_sha256_is_that_of_its_bytes_read_a_chunk_at_a_time(tmp_path: Path) -> None:
    data = bytes(range(256)) * 4097 * 16  # 16 MiB and 4 KiB: more than a chunk, not a whole number of them
    (tmp_path / "train.bin").write_bytes(data)
    (tmp_path / "empty.bin").write_bytes(b"")
    tracemalloc.start()
    try:
        digest = files.file_sha256(tmp_path / "train.bin")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert digest == hashlib.sha256(data).hexdigest()
    assert peak < 6 << 20, f"{peak / 2**20:.1f} MiB held to hash a 16 MiB file"  # read whole, it would be 16
    assert files.file_sha256(tmp_path / "empty.bin") == hashlib.sha256(b"").hexdigest()


def test_nested_dicts_become_dotted_keys() -> None:
    env = {"torch": "2.13.0+cpu", "gpu": {"name": "H200", "count": 1, "mig": {}}, "cpus": 2}
    assert files.flat("env", env) == {"env.torch": "2.13.0+cpu", "env.gpu.name": "H200", "env.gpu.count": 1,
                                      "env.cpus": 2}
