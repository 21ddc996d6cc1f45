"""YAML as the lab reads it: params.yaml (or a results folder's copy) as UTF-8 whatever the locale, a line that is not
YAML or a key given twice refused naming its line, and a file as the last commit holds it. Torch-free."""

import subprocess
from pathlib import Path
from typing import Any

import yaml

from benchlab.core.errors import LabError, cut


def committed_yaml(path: Path) -> Any:
    """A YAML file as the last commit holds it; None outside a git checkout, or where HEAD has no such file."""
    try:
        proc = subprocess.run(["git", "show", f"HEAD:./{path.name}"], cwd=path.parent, capture_output=True,
                              timeout=30, check=False)  # a missing file or no checkout: None, below
    except (OSError, subprocess.TimeoutExpired):
        return None
    try:
        return yaml.safe_load(proc.stdout.decode("utf-8")) if proc.returncode == 0 else None
    except (UnicodeDecodeError, yaml.YAMLError):
        return None


def read_yaml(path: str | Path) -> Any:
    """A YAML file the lab reads (params.yaml), as UTF-8 whatever the locale. Text that is not YAML is refused
    naming its line, and so is a key given twice in one mapping, which YAML would let the second silently win.

    Through DVC a key given twice never gets here: DVC reads params.yaml itself before any stage runs and
    refuses it in its own message of a dozen lines. This line is what a direct stage run says."""
    path = Path(path)
    try:
        loader = yaml.SafeLoader(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise LabError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start}); save it as UTF-8") from None
    try:
        node = loader.get_single_node()
        _refuse_twice(node, path)
        return loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or type(err).__name__
        raise LabError(f"{path} is not valid YAML: {problem}{where}; fix that line") from None
    finally:
        loader.dispose()


def _refuse_twice(node: yaml.Node | None, path: Path) -> None:
    """Refuse a key that one mapping under `node` gives twice, naming it by its dotted path and both lines."""
    todo, seen_nodes = [(node, "")], set()
    while todo:
        node, where = todo.pop()
        if node is None or id(node) in seen_nodes:  # an alias repeats a node: once is enough
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            todo += [(item, f"{where}[{i}]") for i, item in enumerate(node.value)]
        elif isinstance(node, yaml.MappingNode):
            lines: dict[str, int] = {}
            for key, value in node.value:
                name = f"{where}.{key.value}" if where else str(key.value)
                line = key.start_mark.line + 1
                if name in lines and isinstance(key, yaml.ScalarNode):
                    raise LabError(f"{path} gives {cut(name)} twice (lines {lines[name]} and {line}): YAML would "
                                   "silently keep the second; delete one")
                lines[name] = line
                todo.append((value, name))
