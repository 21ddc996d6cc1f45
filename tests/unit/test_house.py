"""The house's rules that a maintainer reads the code by (issue "the house, second step"): small files, modules in
folders by job with names of their own, a short pipeline file."""

import sys
from pathlib import Path

from tests.conftest import ROOT

JOBS = {"core", "prep", "run", "analysis", "search"}


def modules() -> list[Path]:
    return sorted(p for p in (ROOT / "benchlab").rglob("*.py") if "__pycache__" not in p.parts)


def test_no_benchlab_file_is_over_300_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in modules() if (n := len(p.read_text().splitlines())) > 300}
    assert long == {}, long


def test_every_module_lives_in_a_folder_by_job() -> None:
    loose = [str(p.relative_to(ROOT)) for p in modules() if p.parent == ROOT / "benchlab" and p.name != "__init__.py"]
    assert loose == []
    assert {p.name for p in (ROOT / "benchlab").iterdir() if p.is_dir() and p.name != "__pycache__"} == JOBS


def test_no_module_is_named_like_the_standard_library() -> None:
    # `import io` beside a module io.py in benchlab reads one or the other depending on where Python starts.
    clash = [str(p.relative_to(ROOT)) for p in modules() if p.stem in sys.stdlib_module_names]
    assert clash == [], clash


def test_dvc_yaml_stays_at_most_300_lines() -> None:
    assert len((ROOT / "dvc.yaml").read_text().splitlines()) <= 300
