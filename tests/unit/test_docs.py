"""The README's generated tables come from the code and the committed results, and its commands are the real ones."""

import json
import re
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

from benchlab.core.params import RunSettings
from tests.conftest import ROOT

TABLES = [sys.executable, str(ROOT / "scripts/readme_tables.py")]


def tables(readme: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TABLES, "--readme", str(readme), *args], cwd=ROOT, capture_output=True, text=True)


def section(text: str, kind: str) -> str:
    return text.split(f"<!-- generated:{kind}", 1)[1].split(f"<!-- /generated:{kind} -->", 1)[0]


def test_readme_generated_sections_are_up_to_date() -> None:
    proc = tables(ROOT / "README.md", "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_an_edited_generated_section_fails_the_check(tmp_path: Path) -> None:
    (tmp_path / "results").symlink_to(ROOT / "results")
    readme = tmp_path / "README.md"
    text = (ROOT / "README.md").read_text()
    knobs = section(text, "knobs")
    readme.write_text(text.replace(knobs, knobs.replace("runs everywhere", "runs nowhere", 1)))
    proc = tables(readme, "--check")
    assert proc.returncode == 1 and "`knobs` is out of date" in proc.stdout, proc.stdout + proc.stderr
    headline = section(text, "headline")
    edited = re.sub(r"\| \d[\d,]* \|", "| 1 |", headline, count=1)
    assert edited != headline
    readme.write_text(text.replace(headline, edited))
    proc = tables(readme, "--check")
    assert proc.returncode == 1 and "`headline results/" in proc.stdout, proc.stdout + proc.stderr
    assert tables(readme).returncode == 0 and readme.read_text() == text  # the script writes back what it checks


def test_the_knob_table_lists_every_runsettings_field() -> None:
    knobs = section((ROOT / "README.md").read_text(), "knobs")
    assert re.findall(r"^\| `(\w+)` \|", knobs, re.M) == [f.name for f in fields(RunSettings)]


def test_a_results_folder_from_another_gpu_passes(tmp_path: Path) -> None:
    """A contributor's RTX 4090 run, on which the fp32 baseline ran out of memory, makes its own headline table."""
    run = tmp_path / "results/rtx4090"
    (run / "metrics/variants").mkdir(parents=True)
    (run / "metrics/parity").mkdir()
    shutil.copy(ROOT / "results/h200/params.yaml", run / "params.yaml")
    env = {**json.loads((ROOT / "results/h200/metrics/env.json").read_text()), "gpu": "NVIDIA GeForce RTX 4090"}
    (run / "metrics/env.json").write_text(json.dumps(env))
    for name in ("fp32_baseline", "recipe", "fastest"):
        rec = json.loads((ROOT / f"results/h200/metrics/variants/{name}.json").read_text())
        rec["env.gpu"] = env["gpu"]
        if name == "fp32_baseline":
            rec.update(status="oom", message="out of memory at 23,850 MiB under harness.memory_cap_gib=24")
        if name == "recipe":
            rec["tokens_per_joule"] = 1500.0
        (run / f"metrics/variants/{name}.json").write_text(json.dumps(rec))
    (run / "metrics/parity/fastest.json").write_text(json.dumps(
        {"status": "ok", "learns_same": True, "gap_nats": 0.01, "noise_nats": 0.02, "verdict": "same"}))
    readme = tmp_path / "README.md"
    readme.write_text("# a fork\n\n<!-- generated:headline results/rtx4090 -->\n<!-- /generated:headline -->\n")
    assert tables(readme, "--check").returncode == 1  # empty: out of date until written
    proc = tables(readme)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert tables(readme, "--check").returncode == 0
    text = readme.read_text()
    assert "**NVIDIA GeForce RTX 4090**" in text and "(results/rtx4090/report.md)" in text
    assert "`fp32_baseline` did not run (oom), so ratios are against `recipe`" in text  # fallback_baselines' default
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| `")}
    assert "oom: out of memory at 23,850 MiB" in rows["| `fp32_baseline`"]
    assert rows["| `fp32_baseline`"].endswith("| 29,467 | – | – |")  # the memory it held when it stopped
    assert "| 1.000x | " in rows["| `recipe`"] and "| 1,500 |" in rows["| `recipe`"]
    fastest = rows["| `fastest`"]
    assert "not measured" in fastest and "yes: +0.010 nats (the reference's seeds: 0.020)" in fastest


def test_a_headline_marker_naming_a_variant_the_folder_lacks_fails(tmp_path: Path) -> None:
    (tmp_path / "results").symlink_to(ROOT / "results")
    readme = tmp_path / "README.md"
    readme.write_text("<!-- generated:headline results/h200 recipe no_such_variant -->\n<!-- /generated:headline -->\n")
    proc = tables(readme, "--check")
    assert proc.returncode == 1 and "no record of no_such_variant" in proc.stderr


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci/run").read_text()
    assert "python -m pytest -q" in readme and "python -m pytest -q" in ci
    assert "python -m pytest -q -m integration" in ci  # the end-to-end checks the README's command leaves out
    assert "pip install -r requirements-test.txt" in readme and "-r requirements-test.txt" in ci


def test_the_readme_is_short_and_the_user_docs_name_no_tooling_of_ours() -> None:
    """Users have neither our remote GPU machine nor the scripts made for it."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 400
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        for pattern in (r"scripts/gpu_\w+\.sh", r"shared/GPU\.md", r"device tool", r"`device` tool", r"nvidia-h200",
                        r"ten-minute"):
            assert not re.search(pattern, text), f"{doc.name} mentions {pattern}"


def test_every_committed_run_names_its_machine() -> None:
    """Whatever the machine: a GPU run names its GPU, a CPU run its CPU."""
    env_files = sorted((ROOT / "results").glob("**/metrics/env.json"))
    assert env_files
    for env_file in env_files:
        env = json.loads(env_file.read_text())
        assert env.get("gpu") or env.get("cpu"), env_file


def test_mutation_scores_count_a_verdict_file_by_module(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import mutation_scores
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    verdicts = tmp_path / "v.txt"
    verdicts.write_text("# machine and date\nbenchlab.core.stats.x_describe__mutmut_1: killed\n"
                        "benchlab.core.stats.x_describe__mutmut_2: survived\n"
                        "benchlab.run.heads.chunked.xǁCǁf__mutmut_1: timeout\nbenchlab.run.heads.chunked.x_g__mutmut_1: killed\n")
    counts = mutation_scores.scores_from_verdicts(verdicts)
    assert counts == {"benchlab/core/stats.py": {"killed": 1, "survived": 1},
                      "benchlab/run/heads/chunked.py": {"timeout": 1, "killed": 1}}
    lines = mutation_scores.table(counts).splitlines()
    assert lines[2] == "| benchlab/core/stats.py | 2 | 1 | 0 | 1 | 0 | 0 | 50.0 |"
    assert lines[3] == "| benchlab/run/heads/chunked.py | 2 | 1 | 1 | 0 | 0 | 0 | 100.0 |"  # a hang is caught too
    assert lines[4] == "| all | 4 | 2 | 1 | 1 | 0 | 0 | 75.0 |"


# Where the code and the docs point a reader: the README's sections by name, and the project's files by path. A line
# that names a commit points into git history, where the file was; docs/mutation.md is a log of past sessions.
POINTERS = [*(ROOT / name for name in ("params.yaml", "dvc.yaml", "search/dvc.yaml", "ttl/dvc.yaml")),
            *(p for folder in ("benchlab", "stages", "scripts", "tests", "model", "docs") for p in (ROOT / folder).rglob("*")
              if p.suffix in (".py", ".md") and p.name not in ("mutation.md", "test_docs.py") and "__pycache__" not in p.parts)]


def pointers(pattern: str) -> set[tuple[str, str]]:
    """(what is named, the file naming it) for every match of `pattern` outside a line naming a commit."""
    return {(m, str(p.relative_to(ROOT))) for p in POINTERS for line in p.read_text().splitlines()
            if not re.search(r"\bcommit `?[0-9a-f]{7}", line) for m in re.findall(pattern, line)}


def test_every_readme_section_the_code_and_docs_name_exists() -> None:
    headings = {line.lstrip("#").strip() for line in (ROOT / "README.md").read_text().splitlines()
                if line.startswith("#")}
    named = pointers(r'README "([^"]+)"')
    assert len(named) > 5 and {(m, p) for m, p in named if m not in headings} == set()


def test_every_project_file_the_code_and_docs_name_exists() -> None:
    named = pointers(r"\b((?:benchlab|stages|scripts|model|docs)/[\w/.-]+\.(?:py|md|yaml))\b")
    assert len(named) > 50 and {(m, p) for m, p in named if not (ROOT / m).exists()} == set()
