"""Rebuild the embedded default corpus from text that ships with CPython.

The corpus is the Python documentation that every CPython install carries:
the reference-manual topics behind `help("if")` (`pydoc_data.topics`) and the
docstrings of a fixed list of standard-library modules. The PSF wrote it, not
us. The snapshot is committed as `data/corpus/python_docs.txt` so that every
machine trains on the same bytes whatever its Python version; `prepare`
records its sha256 and size in `data/prepared/meta.json`.

Run with the Python whose docs you want (the committed file came from
CPython 3.11.7): `python data/make_corpus.py data/corpus/python_docs.txt`.
"""

import importlib
import inspect
import sys
from pathlib import Path

# Modules with long, prose-like docstrings; the order fixes the byte order.
MODULES = [
    "argparse", "asyncio", "collections", "contextlib", "csv", "dataclasses",
    "datetime", "decimal", "difflib", "email", "enum", "fractions", "functools",
    "heapq", "http.client", "inspect", "itertools", "json", "logging",
    "multiprocessing", "os", "pathlib", "pickle", "random", "re", "shutil",
    "socket", "sqlite3", "statistics", "string", "subprocess", "tarfile",
    "textwrap", "threading", "typing", "unittest", "urllib.parse", "zipfile",
]


def topic_texts() -> list[str]:
    """The reference-manual topics, sorted by name."""
    from pydoc_data.topics import topics

    return [topics[name].strip() for name in sorted(topics)]


def module_texts(name: str) -> list[str]:
    """The module docstring, then each public member's, in sorted order."""
    module = importlib.import_module(name)
    texts = [inspect.getdoc(module) or ""]
    for attr in sorted(dir(module)):
        if attr.startswith("_"):
            continue
        member = getattr(module, attr)
        if getattr(member, "__module__", None) != module.__name__:
            continue  # re-exported from elsewhere: counted there, or not at all
        doc = inspect.getdoc(member)
        if doc and len(doc) > 200:  # one-liners add little text
            texts.append(f"{name}.{attr}\n\n{doc}")
    return texts


def main(out: str) -> None:
    docs = topic_texts()
    for name in MODULES:
        docs.extend(module_texts(name))
    text = "\n\n".join(d for d in docs if d) + "\n"
    Path(out).write_text(text, encoding="utf-8")
    print(f"wrote {out}: {len(text.encode())} bytes, {len(docs)} documents")


if __name__ == "__main__":
    main(sys.argv[1])
