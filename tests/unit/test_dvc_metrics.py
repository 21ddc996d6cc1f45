"""`dvc metrics show` and `dvc metrics diff`, the design's comparison commands, print no failure on a fresh clone,
before and after a search.

DVC reports a revision as failed when a metrics file that a dvc.yaml declares is missing from it. A fresh clone
holds only what git tracks, so every declared metrics file is committed, the search's too: metrics/search.json
says that no search has run until one writes its summary there.
"""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

PIPELINES = ("dvc.yaml", "search/dvc.yaml", "ttl/dvc.yaml")


def declared_metrics(pipeline: Path, root: Path) -> list[str]:
    """The metrics files a dvc.yaml declares (its stages' and its top-level ones), relative to the project root."""
    data = yaml.safe_load(pipeline.read_text())
    found = [(".", entry) for entry in data.get("metrics", [])]
    for stage in data.get("stages", {}).values():
        stage = stage.get("do", stage)  # a foreach stage's body
        found += [(stage.get("wdir", "."), entry) for entry in stage.get("metrics", [])]
    names = [(wdir, next(iter(entry)) if isinstance(entry, dict) else entry) for wdir, entry in found]
    return sorted({(pipeline.parent / wdir / name).resolve().relative_to(root.resolve()).as_posix()
                   for wdir, name in names})


def tracked(root: Path) -> set[str]:
    """The files git tracks in `root`: what a fresh clone holds."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True, check=True).stdout
    return {name for name in out.split("\0") if name}


@pytest.fixture(scope="module")
def files_in_git() -> set[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing tells what a fresh clone holds")
    return tracked(ROOT)


def test_the_declared_metrics_are_read_from_every_pipeline(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub/dvc.yaml").write_text(yaml.safe_dump({
        "metrics": ["top.json"],
        "stages": {"a": {"cmd": "x", "wdir": "..", "metrics": [{"m/a.json": {"cache": False}}]},
                   "b": {"foreach": [1], "do": {"cmd": "y", "metrics": ["b.json"]}}}}))
    assert declared_metrics(tmp_path / "sub/dvc.yaml", tmp_path) == ["m/a.json", "sub/b.json", "sub/top.json"]


def test_every_declared_metrics_file_is_committed(files_in_git: set[str]) -> None:
    declared = [name for pipeline in PIPELINES for name in declared_metrics(ROOT / pipeline, ROOT)]
    assert "metrics/search.json" in declared and "metrics/summary.json" in declared
    missing = [name for name in declared if name not in files_in_git]
    assert not missing, f"declared metrics that a fresh clone lacks (DVC calls the revision failed): {missing}"


def test_the_committed_search_metrics_say_no_search_ran() -> None:
    assert json.loads((ROOT / "metrics/search.json").read_text()) == {"status": "not run", "runs": 0}
