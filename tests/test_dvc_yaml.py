"""dvc.yaml against the code: each stage lists exactly the project modules it imports."""

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


def closure(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(project_imports(ROOT / current))
    return seen


def test_every_stage_lists_exactly_the_modules_it_imports() -> None:
    stages = {**yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"],
              **yaml.safe_load((ROOT / "search/dvc.yaml").read_text())["stages"]}
    assert "search" in stages and "bench" in stages
    for name, stage in stages.items():
        body = stage.get("do", stage)
        module = body["cmd"].split("python -m ")[1].split()[0]
        entry = module.replace(".", "/") + ".py"
        listed = {d for d in body["deps"] if isinstance(d, str) and d.endswith(".py")}
        assert listed == closure(entry), f"stage {name}: deps differ from imports"


def test_package_inits_hold_no_code() -> None:
    # They are imported by every stage without being listed: keep them inert.
    for package in (*PACKAGES, "benchlab/heads"):
        tree = ast.parse((ROOT / package / "__init__.py").read_text())
        assert all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in tree.body), package


def runtime_imports(path: Path) -> set[str]:
    """Project modules a file imports when it runs: those under `if TYPE_CHECKING:` only name types."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            node.body = []
    return project_imports(path, tree)


def test_no_module_imports_itself_back() -> None:
    """No import cycle among the project's modules (issue 35): what a module imports at run time never leads
    back to it. One that did would hide behind a function-level import."""
    modules = [str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    for module in modules:
        seen, todo = set(), list(runtime_imports(ROOT / module))
        while todo:
            current = todo.pop()
            if current not in seen:
                seen.add(current)
                todo.extend(runtime_imports(ROOT / current))
        assert module not in seen, f"{module} imports itself back through {sorted(seen)}"
