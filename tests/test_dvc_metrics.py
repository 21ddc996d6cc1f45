"""`dvc metrics show` and `dvc metrics diff`, the design's comparison commands, print no failure on a fresh clone,
before and after a search.

DVC reports a revision as failed when a metrics file that a dvc.yaml declares is missing from it. A fresh clone
holds only what git tracks, so every declared metrics file is committed, the search's too: metrics/search.json
says that no search has run until one writes its summary there.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

PIPELINES = ("dvc.yaml", "search/dvc.yaml", "ttl/dvc.yaml")
FAILED = "failed to load"  # DVC's line: "DVC failed to load some metrics for following revisions: ..."


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


def dvc(repo: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"dvc {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


@pytest.mark.integration
def test_metrics_show_and_diff_print_no_failure_before_and_after_a_search(files_in_git: set[str],
                                                                          tmp_path: Path) -> None:
    # The pipelines, params, lock and metrics as a fresh clone has them (a clone of the working tree's files).
    keep = [n for n in files_in_git if n.startswith(("metrics/", ".dvc/")) or n in (*PIPELINES, "params.yaml",
                                                                                      "dvc.lock", ".dvcignore")]
    for name in keep:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tmp_path / name)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "clone")
    for args in (("metrics", "show"), ("metrics", "diff")):
        proc = dvc(tmp_path, *args)
        assert FAILED not in proc.stderr + proc.stdout, proc.stderr
    # A search writes its summary (benchlab/search/report.py's keys): the diff shows it against the commit.
    (tmp_path / "metrics/search.json").write_text(json.dumps({"status": "ok", "runs": 7, "spent_s": 280.5}))
    diff = dvc(tmp_path, "metrics", "diff")
    assert FAILED not in diff.stderr + diff.stdout, diff.stderr
    assert any(line.split()[:2] == ["metrics/search.json", "runs"] and "7" in line for line in diff.stdout.splitlines())
    git(tmp_path, "commit", "-qam", "searched")
    for args in (("metrics", "show"), ("metrics", "diff", "HEAD~1")):
        proc = dvc(tmp_path, *args)
        assert FAILED not in proc.stderr + proc.stdout, proc.stderr
