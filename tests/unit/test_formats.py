"""The corpus readers: every format gives the same documents, and what is no text is named before it is read."""

import gzip
import json
import os
from pathlib import Path

import pytest

from benchlab.core.errors import LabError
from benchlab.core.sections import DataParams
from benchlab.prep.corpus import prepare
from benchlab.prep.formats import special_files
from tests.unit.test_corpus import all_tokens, documents


def write_formats(root: Path, docs: list[str]) -> dict[str, Path]:
    """The same documents as a folder of .txt files, .jsonl, .jsonl.gz and .parquet."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    (root / "txt").mkdir()
    for i, doc in enumerate(docs):
        (root / "txt" / f"{i:03d}.txt").write_text(doc, encoding="utf-8")
    lines = "".join(json.dumps({"id": i, "text": doc}) + "\n" for i, doc in enumerate(docs))
    (root / "c.jsonl").write_text(lines, encoding="utf-8")
    (root / "c.jsonl.gz").write_bytes(gzip.compress(lines.encode(), mtime=0))
    pq.write_table(pa.table({"id": list(range(len(docs))), "content": docs}), root / "c.parquet", row_group_size=7)
    return {"text": root / "txt", "jsonl": root / "c.jsonl", "jsonl.gz": root / "c.jsonl.gz", "parquet": root / "c.parquet"}


def test_every_input_format_gives_the_same_tokens(tmp_path: Path) -> None:
    paths = write_formats(tmp_path, documents())
    results = {}
    for name, path in paths.items():
        field = "content" if name == "parquet" else "text"
        meta = prepare(DataParams(corpus=str(path), vocab_size=400, text_field=field), tmp_path / name / "out",
                       piece_bytes=1024)  # long documents are cut into pieces too
        assert meta["corpus_documents"] == 40, name
        results[name] = all_tokens(tmp_path / name / "out").tolist()
    assert results["jsonl"] == results["text"] == results["jsonl.gz"] == results["parquet"]
    # A pretrained tokenizer.json instead of training one: the same tokenizer gives the same tokens.
    trained = tmp_path / "text" / "out" / "tokenizer.json"
    meta = prepare(DataParams(corpus=str(paths["jsonl"]), tokenizer=str(trained)), tmp_path / "pre")
    assert all_tokens(tmp_path / "pre").tolist() == results["text"] and meta["tokenizer_sample"] == "none: pretrained"


@pytest.mark.parametrize("name, field, message", [
    ("jsonl", "body", "line 1 has no 'body' field; set data.text_field"),
    ("parquet", "text", "has no column 'text'; set data.text_field to one of: id, content"),
])
def test_a_missing_text_field_names_the_fix(tmp_path: Path, name: str, field: str, message: str) -> None:
    path = write_formats(tmp_path, documents(4))[name]
    with pytest.raises(LabError, match=message):
        prepare(DataParams(corpus=str(path), vocab_size=300, text_field=field), tmp_path / "out")


def test_special_files_are_found_by_their_metadata_alone(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("text")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "zero.txt").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "sub" / "pipe.txt")  # opening it would block: it is only stat-ed
    (tmp_path / "sub" / "up").symlink_to(tmp_path)  # a loop back up the tree is walked once
    (tmp_path / "dangling.txt").symlink_to(tmp_path / "gone")
    found = {path.relative_to(tmp_path).as_posix(): kind for path, kind in special_files(tmp_path)}
    assert found == {"sub/zero.txt": "a character device", "sub/pipe.txt": "a FIFO (named pipe)",
                     "dangling.txt": "a broken link"}
