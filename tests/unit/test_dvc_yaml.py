"""dvc.yaml against the code: each stage lists exactly the folders of the project modules it imports, and its own
module."""

import ast
from pathlib import Path

import yaml

from tests.conftest import ROOT

PACKAGES = ("benchlab", "model", "stages")


def project_imports(path: Path, tree: ast.AST | None = None) -> set[str]:
    """Project modules a file imports directly, as repository-relative .py paths."""
    found = set()
    for node in ast.walk(tree or ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            if name.split(".")[0] in PACKAGES:
                file = ROOT / (name.replace(".", "/") + ".py")
                if file.is_file():
                    found.add(str(file.relative_to(ROOT)))
    return found


def started_programs(path: Path) -> set[str]:
    """The stage programs a file starts as processes (`python -m stages.<name>`: a string constant naming one)."""
    return {f"stages/{node.value.split('.')[1]}.py" for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.value.startswith("stages.") and (ROOT / f"stages/{node.value[7:]}.py").is_file()}


def closure(start: str, programs: bool = False) -> set[str]:
    """The modules `start` imports, directly or not; with `programs`, those of the stage programs it starts too."""
    seen, todo = set(), [start]
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(project_imports(ROOT / current))
            todo.extend(started_programs(ROOT / current) if programs else ())
    return seen


def job_folder(module: str) -> str:
    """Where a stage's dependency on a module is declared: benchlab's folder holding it (benchlab/run, ...), model/
    for the model, or the module itself for a stage's own file."""
    parts = module.split("/")
    if parts[0] == "benchlab":
        assert len(parts) > 2, f"{module}: every benchlab module lives in a folder by job"
        return "/".join(parts[:2])
    return "model" if parts[0] == "model" else module


def test_every_stage_lists_exactly_the_folders_it_imports_from() -> None:
    stages = {**yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"],
              **yaml.safe_load((ROOT / "search/dvc.yaml").read_text())["stages"],
              **yaml.safe_load((ROOT / "ttl/dvc.yaml").read_text())["stages"]}
    assert "search" in stages and "bench" in stages and "ttl_reference" in stages and "ttl" in stages
    for name, stage in stages.items():
        body = stage.get("do", stage)
        module = body["cmd"].split("python -m ")[1].split()[0]
        entry = module.replace(".", "/") + ".py"
        listed = {d for d in body["deps"] if isinstance(d, str) and d.split("/")[0] in PACKAGES}
        imported = {job_folder(m) for m in closure(entry, programs=True)}
        assert listed == imported, f"stage {name}: deps differ from imports"
        assert all((ROOT / d).exists() for d in listed), name


def test_package_inits_hold_no_code() -> None:
    # They are imported by every stage without being listed: keep them inert.
    for package in (*PACKAGES, "benchlab/run/heads"):
        tree = ast.parse((ROOT / package / "__init__.py").read_text())
        assert all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in tree.body), package


def test_no_module_imports_itself_back() -> None:
    """No import circle among the project's modules, in a static reading of every import: type-only ones (under
    `if TYPE_CHECKING:`) and those inside functions count too. One that did would hide a tangle."""
    modules = [str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    for module in modules:
        seen, todo = set(), list(project_imports(ROOT / module))
        while todo:
            current = todo.pop()
            if current not in seen:
                seen.add(current)
                todo.extend(project_imports(ROOT / current))
        assert module not in seen, f"{module} imports itself back through {sorted(seen)}"


def test_every_stage_that_reads_a_variant_depends_on_the_bases_variants_are_written_on() -> None:
    """A variant written `{base: recipe, ...}` is bases.recipe's knobs with its changes: a stage timing it must rerun
    when the base changes, so every stage whose params name a variant names `bases` too."""
    readers = 0
    for path in ("dvc.yaml", "search/dvc.yaml", "ttl/dvc.yaml"):
        for name, stage in yaml.safe_load((ROOT / path).read_text())["stages"].items():
            params = [str(p) for p in stage.get("do", stage).get("params", [])]
            if any(p.startswith("variants.${") for p in params):
                readers += 1
                assert "bases" in params, f"{path}: stage {name} reads a variant but not bases"
    assert readers >= 6
