"""results/ is an index of folders that each carry a report, and no page links a file the repository lacks."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
INDEX = RESULTS / "README.md"
MAX_INDEX_LINES = 150

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CITED_FOLDER = re.compile(r"(?<![\w./-])results/([A-Za-z0-9_.-]+)")


def folders() -> list[Path]:
    return sorted(p for p in RESULTS.iterdir() if p.is_dir())


def relative_links(text: str) -> list[str]:
    """The targets of the markdown links and images in `text` that name a path, without code spans and blocks."""
    text = INLINE_CODE.sub("", FENCE.sub("", text))
    targets = (m.group(1) for m in LINK.finditer(text))
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def broken_links(files: list[Path]) -> list[str]:
    broken = []
    for md in files:
        for target in relative_links(md.read_text(encoding="utf-8")):
            path = target.split("#", 1)[0]
            if path and not (md.parent / path).exists():
                broken.append(f"{md}: {target}")
    return broken


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(RESULTS.rglob("*.md"))]


def test_the_link_check_finds_a_broken_link_and_passes_a_good_one(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("x\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md) ![img](there.md#top) [web](https://example.com) [anchor](#top) `[code](gone.md)`\n"
        "```\n[fenced](gone.md)\n```\n[gone](missing/report.md)\n"
    )
    assert relative_links(page.read_text()) == ["there.md", "there.md#top", "missing/report.md"]
    assert [b.rsplit(": ", 1)[1] for b in broken_links([page])] == ["missing/report.md"]


def test_every_results_folder_has_its_report() -> None:
    found = folders()
    assert found, "results/ holds no folder"
    missing = [p.name for p in found if not (p / "report.md").is_file()]
    assert not missing, f"results folders without report.md: {missing}"


def test_the_index_is_short_and_links_every_folder_report() -> None:
    text = INDEX.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_INDEX_LINES
    linked = set(relative_links(text))
    unlinked = [p.name for p in folders() if f"{p.name}/report.md" not in linked]
    assert not unlinked, f"results/README.md does not link the report of: {unlinked}"


def test_every_relative_link_in_the_pages_points_to_a_file_in_the_tree() -> None:
    broken = broken_links(pages())
    assert not broken, "links to files that are not in the repository:\n" + "\n".join(broken)


def missing_cited_folders(files: list[Path], results: Path) -> dict[str, str]:
    """Each `results/<folder>` that one of `files` names but `results` lacks, with the first file naming it."""
    gone: dict[str, str] = {}
    for md in files:
        for name in CITED_FOLDER.findall(md.read_text(encoding="utf-8")):
            if not (results / name).exists():
                gone.setdefault(name, md.name)
    return gone


def test_the_citation_check_finds_a_folder_that_is_gone(tmp_path: Path) -> None:
    (tmp_path / "results" / "kept").mkdir(parents=True)
    report = tmp_path / "report.md"
    report.write_text("as `results/kept/metrics` and results/gone-2/ show; not fresults/other or ../results/x\n")
    assert missing_cited_folders([report], tmp_path / "results") == {"gone-2": "report.md"}


def test_every_results_folder_the_readme_docs_and_committed_reports_cite_exists() -> None:
    # A curation once removed folders that an issue's closing note cited (h200-capped); a page of the tree citing
    # a folder keeps it, and results/README.md links every folder's report (above), so an indexed folder is cited.
    committed = sorted(RESULTS.rglob("*.md"))
    assert any(p.name == "report.md" for p in committed)
    gone = missing_cited_folders([ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *committed], RESULTS)
    assert not gone, f"results folders cited but not in the tree (folder: the first page citing it): {gone}"


def test_no_source_cites_a_page_outside_the_repository() -> None:
    # The team's notes on the GPU machine live outside the project; a reader of the code cannot open them.
    sources = [p for folder in ("benchlab", "stages", "model", "scripts", "tests") for p in (ROOT / folder).rglob("*.py")]
    citing = [str(p.relative_to(ROOT)) for p in sources if "GPU.md" in p.read_text() and p.name != "test_results_index.py"]
    assert citing == []
