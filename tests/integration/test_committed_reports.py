"""Every report the lab wrote for a committed results folder regenerates identical from the folder's files
(`python -m benchlab.analysis.folder_report`): the records and params behind each report still read, old knob
names included, and today's code tells them the same way."""

import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.unit.test_committed_reports import RUN_FOLDERS


@pytest.mark.integration
@pytest.mark.parametrize("folder", RUN_FOLDERS, ids=str)
def test_a_committed_report_regenerates_identical(folder: Path, tmp_path: Path) -> None:
    from benchlab.analysis.folder_report import folder_report

    copy = tmp_path / "run"
    shutil.copytree(ROOT / folder, copy, ignore=shutil.ignore_patterns("report", "report.md"))
    committed = (ROOT / folder / "report.md").read_text()
    folder_report(copy, title=committed.splitlines()[0].removeprefix("# "))
    assert (copy / "report.md").read_text() == committed
