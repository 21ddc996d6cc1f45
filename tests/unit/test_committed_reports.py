"""The committed results folders whose reports tests/integration/test_committed_reports.py regenerates."""

from pathlib import Path

from tests.conftest import ROOT

RUN_FOLDERS = sorted(p.parent.parent.relative_to(ROOT) for p in (ROOT / "results").rglob("metrics/variants")
                     if (p.parent.parent / "report.md").is_file())


def test_the_committed_run_folders_are_found() -> None:
    assert len(RUN_FOLDERS) >= 30 and Path("results/h200-ours") in RUN_FOLDERS
