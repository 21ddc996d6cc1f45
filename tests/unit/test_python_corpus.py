"""The corpus generated from a Python install's text (benchlab/prep/python_corpus.py, stages/python_corpus.py)."""

import hashlib
import json
from pathlib import Path

import pytest

from benchlab.core.errors import LabError
from benchlab.prep.python_corpus import MAX_FILE_BYTES, generate, source_roots


def fake_install(root: Path) -> list[tuple[str, Path]]:
    """A standard library with its own site-packages inside, and a site-packages folder of its own."""
    lib, site = root / "lib", root / "venv-site"
    files = {
        lib / "a.py": "print('a')\n", lib / "pkg" / "b.txt": "bee\n", lib / "docs" / "c.rst": "See\n===\n",
        lib / "big.py": "x" * (MAX_FILE_BYTES + 1), lib / "skip.json": "{}", lib / "__pycache__" / "a.py": "cached\n",
        lib / "site-packages" / "inner.py": "not the stdlib's\n", lib / "blank.txt": "  \n",
        site / "lib1" / "mod.py": "import os\n", site / "lib1" / "README.txt": "read me\n",
    }
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (lib / "latin1.txt").write_bytes(b"caf\xe9\n")  # not UTF-8: no document
    return [("stdlib", lib), ("site-packages", site)]


def lines(path: Path) -> list[str]:
    return [json.loads(line)["doc"] for line in path.read_text(encoding="utf-8").splitlines()]


def test_the_corpus_takes_each_text_source_once_in_a_fixed_spread_order(tmp_path: Path) -> None:
    roots = fake_install(tmp_path)
    record = generate(tmp_path / "out.jsonl", 10, "doc", roots)
    names = ["stdlib/a.py", "stdlib/pkg/b.txt", "stdlib/docs/c.rst", "site-packages/lib1/mod.py",
             "site-packages/lib1/README.txt"]
    texts = {"stdlib/a.py": "print('a')\n", "stdlib/pkg/b.txt": "bee\n", "stdlib/docs/c.rst": "See\n===\n",
             "site-packages/lib1/mod.py": "import os\n", "site-packages/lib1/README.txt": "read me\n"}
    order = sorted(names, key=lambda n: hashlib.sha256(n.encode()).hexdigest())
    taken = lines(tmp_path / "out.jsonl")
    assert taken == [texts[n] for n in order][: len(taken)]  # in sha256 order of the names, until 10 bytes
    assert sum(len(t) for t in taken[:-1]) < 10 <= sum(len(t) for t in taken) == record["text_bytes"]
    everything = generate(tmp_path / "all.jsonl", sum(map(len, texts.values())), "doc", roots)
    assert sorted(lines(tmp_path / "all.jsonl")) == sorted(texts.values()) and everything["documents"] == 5
    again = generate(tmp_path / "again.jsonl", sum(map(len, texts.values())), "doc", roots)
    assert again["sha256"] == everything["sha256"]  # the same install, the same bytes


def test_more_than_the_install_holds_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    roots = fake_install(tmp_path)
    with pytest.raises(LabError, match=r"^python_corpus.bytes=100000 is more than this install's 41 bytes of \.py"):
        generate(tmp_path / "out.jsonl", 100_000, "text", roots)
    assert not (tmp_path / "out.jsonl").exists() and list(tmp_path.glob(".out.jsonl*")) == []


def test_this_python_has_a_standard_library_to_read() -> None:
    roots = source_roots()
    assert roots[0][0] == "stdlib" and (roots[0][1] / "os.py").is_file()
