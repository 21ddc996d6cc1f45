"""The tests' own layout (torchtitan's): tests/integration/ holds the tests marked integration, tests/unit/ every
other one, and no test file sits directly in tests/. The commands select by the mark (`-m integration`), so a test
in the wrong folder would run in the other selection than its folder says; a test marked gpu may sit in either."""

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

FOLDERS = ("tests/unit", "tests/integration")

# Collects every test, none deselected, in a child process, and writes each one's id and marks as a JSON line to
# the file named by its argument.
COLLECT = """
import json, sys, pytest

class Marks:
    def pytest_collection_finish(self, session):
        with open(sys.argv[1], "w") as out:
            for item in session.items:
                out.write(json.dumps([item.nodeid, sorted({m.name for m in item.iter_markers()})]) + "\\n")

sys.exit(pytest.main(["--collect-only", "-q", "-o", "addopts=", "-p", "no:cacheprovider", "tests"], plugins=[Marks()]))
"""


def misplaced(tests: dict[str, set[str]]) -> list[str]:
    """Each test (id: its marks) outside tests/unit/ and tests/integration/, or in the one its mark does not name."""
    wrong = []
    for nodeid, marks in tests.items():
        folder = Path(nodeid.split("::")[0]).parent.as_posix()
        if folder not in FOLDERS:
            wrong.append(f"{nodeid}: outside tests/unit/ and tests/integration/")
        elif (folder == "tests/integration") != ("integration" in marks):
            wrong.append(f"{nodeid}: in {folder}/ but {'' if 'integration' in marks else 'not '}marked integration")
    return wrong


def test_the_check_names_a_test_in_the_wrong_folder_or_outside_both() -> None:
    tests = {"tests/unit/test_a.py::test_fast": {"parametrize"}, "tests/unit/test_a.py::test_gpu": {"gpu"},
             "tests/integration/test_a.py::test_slow": {"integration"},
             "tests/unit/test_b.py::test_slow[x]": {"integration", "parametrize"},
             "tests/integration/test_b.py::test_fast": set(), "tests/test_c.py::test_fast": set()}
    assert misplaced(tests) == [
        "tests/unit/test_b.py::test_slow[x]: in tests/unit/ but marked integration",
        "tests/integration/test_b.py::test_fast: in tests/integration/ but not marked integration",
        "tests/test_c.py::test_fast: outside tests/unit/ and tests/integration/"]


def test_every_test_sits_in_the_folder_its_integration_mark_names(tmp_path: Path) -> None:
    out = tmp_path / "marks.jsonl"
    proc = subprocess.run([sys.executable, "-c", COLLECT, str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    tests = {nodeid: set(marks) for nodeid, marks in map(json.loads, out.read_text().splitlines())}
    assert {Path(nodeid.split("::")[0]).parent.as_posix() for nodeid in tests} >= set(FOLDERS)  # both collected
    assert misplaced(tests) == []


def test_no_test_file_sits_directly_in_tests() -> None:
    assert sorted(p.name for p in (ROOT / "tests").glob("test*.py")) == []
