"""A corpus generated offline from text that every Python install holds: its standard library's and its
site-packages' sources and documents (.py, .txt, .rst), written by their authors, not by us.

The default corpus (686 kB) is too small for a target loss that means something: a model memorizes it. This one
is as large as `python_corpus.bytes` asks, up to what the install holds. Each file is one document (a JSON line
whose `data.text_field` holds its text); the files are taken in the order of the sha256 of their names
(`stdlib/<path>`, `site-packages/<path>`), which spreads any size over every package, and is the same on every run
of the same install. Another Python or other packages give other text: the stage's record names the Python and
the output's sha256, and `prepare` records the corpus's.
"""

import hashlib
import json
import os
import platform
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from benchlab.core.errors import LabError
from benchlab.core.files import atomic_path, file_sha256

SUFFIXES = (".py", ".txt", ".rst")
# Larger files are mostly generated tables (unicode data, test vectors, vendored bundles), not text people wrote.
MAX_FILE_BYTES = 256 * 1024
SITE_DIRS = ("site-packages", "dist-packages")


def source_roots() -> list[tuple[str, Path]]:
    """(label, folder) of the standard library and of each site-packages folder, each once."""
    paths = sysconfig.get_paths()
    roots, seen = [], set()
    for label, key in (("stdlib", "stdlib"), ("site-packages", "purelib"), ("site-packages", "platlib")):
        folder = Path(paths[key]).resolve()
        if folder not in seen and folder.is_dir():
            seen.add(folder)
            roots.append((label, folder))
    return roots


def source_files(label: str, root: Path) -> Iterator[tuple[str, Path]]:
    """Each text source under `root` as (`label/relative path`, path); the standard library's walk leaves its
    site-packages to their own root, and no walk follows links or enters __pycache__."""
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__" and not (label == "stdlib" and d in SITE_DIRS)]
        for name in files:
            path = Path(folder) / name
            if name.endswith(SUFFIXES) and not path.is_symlink():
                yield f"{label}/{path.relative_to(root).as_posix()}", path


def ordered_sources(roots: list[tuple[str, Path]]) -> list[tuple[str, Path]]:
    """Every source of every root, in the order of the sha256 of its name: fixed, and spread over all packages."""
    found = {name: path for label, root in roots for name, path in source_files(label, root)}
    return sorted(found.items(), key=lambda item: hashlib.sha256(item[0].encode()).hexdigest())


def document(path: Path) -> str | None:
    """A file's text, or None where it is no document: too large, not UTF-8, holding NUL bytes, or empty."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return None
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return text if text.strip() and "\x00" not in text else None


def generate(out: str | Path, target_bytes: int, text_field: str,
             roots: list[tuple[str, Path]] | None = None) -> dict:
    """Write the corpus as JSON lines to `out`, taking sources in order until `target_bytes` of text; its record."""
    roots = source_roots() if roots is None else roots
    taken, size = 0, 0
    with atomic_path(out) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            for name, path in ordered_sources(roots):
                if size >= target_bytes:
                    break
                text = document(path)
                if text is None:
                    continue
                f.write(json.dumps({text_field: text}, ensure_ascii=False) + "\n")
                taken, size = taken + 1, size + len(text.encode("utf-8"))
        if size < target_bytes:  # inside the block: the partial file is never renamed into place
            raise LabError(f"python_corpus.bytes={target_bytes} is more than this install's {size} bytes of .py, .txt "
                           f"and .rst text under {', '.join(str(r) for _, r in roots)}; set at most {size}")
        # read where it was written: a stage's output is moved into place only when the stage ends (commit_outputs)
        written, sha256 = Path(tmp).stat().st_size, file_sha256(tmp)
    return {"documents": taken, "text_bytes": size, "file_bytes": written, "sha256": sha256,
            "python": platform.python_version(),
            "roots": [f"{label}: {root}" for label, root in roots]}
