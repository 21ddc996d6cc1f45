"""Reading the records the bench and parity stages wrote, and refusing a set that cannot share one table: rows
measured on different machines or software, or from different source code."""

import json
from pathlib import Path
from typing import Any

from benchlab.core.errors import LabError

SOURCE_KEY = "provenance.source_sha256"

ENV_KEYS = ("env.gpu", "env.driver", "env.cuda", "env.torch", "env.python", "env.cpu", "env.torch_threads")


def load_results(result_dir: str | Path, names: list[str]) -> list[dict[str, Any]]:
    """Each named variant's result; a missing or unreadable one is an error naming its stage."""
    if not names:
        raise LabError("params.yaml names no variants, so there is nothing to tabulate; add one under `variants:`")
    out = []
    for name in names:
        path = Path(result_dir) / f"{name}.json"
        if not path.is_file():
            raise LabError(f"{path} is missing; run `dvc repro bench@{name}`")
        try:
            out.append(json.loads(path.read_text(encoding="utf-8")))
        except json.JSONDecodeError as err:
            raise LabError(f"{path} is not valid JSON ({err}); rerun `dvc repro -f bench@{name}`") from None
    return out


def load_parity(parity_dir: str | Path) -> dict[str, dict[str, Any]]:
    """The parity stages' records by variant, the reference's two-seed record under record.REFERENCE_SEEDS; empty where
    the folder is missing or empty (a run without parity stages)."""
    out = {}
    for path in sorted(Path(parity_dir).glob("*.json")):
        try:
            out[path.stem] = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise LabError(f"{path} is not valid JSON ({err}); rerun `dvc repro -f parity@{path.stem}`") from None
    return out


def env_of(result: dict[str, Any]) -> dict[str, Any]:
    return {k: result.get(k) for k in ENV_KEYS}


def check_one_env(results: list[dict[str, Any]], allow_mixed: bool) -> None:
    """Refuse a table whose rows were measured on different machines or software."""
    first = env_of(results[0])
    for r in results[1:]:
        if env_of(r) != first and not allow_mixed:
            diff = {k: (first[k], r.get(k)) for k in ENV_KEYS if first[k] != r.get(k)}
            raise LabError(
                f"{r['variant']} was measured in another environment than {results[0]['variant']} ({diff}); "
                "rerun the matrix on one machine, or set aggregate.allow_mixed_env=true to compare anyway"
            )


def check_one_source(results: list[dict[str, Any]], allow_mixed: bool) -> None:
    """Refuse a table whose rows ran different code. A modified tree is not refused: `summarize` flags its rows."""
    if allow_mixed:
        return
    sources = {r.get(SOURCE_KEY) for r in results}
    if len(sources) > 1:
        groups = ", ".join(f"{str(src)[:12]}: {', '.join(r['variant'] for r in results if r.get(SOURCE_KEY) == src)}"
                           for src in sources)
        raise LabError(f"the variants ran different source code ({groups}); rerun them from one commit "
                       "(`dvc repro -f` the stale ones), or set aggregate.allow_mixed_source=true to compare anyway")


def uncommitted(results: list[dict[str, Any]]) -> list[str]:
    """The variants measured from a tree whose code differs from its commit (no commit names their code)."""
    return [r["variant"] for r in results if r.get("provenance.tree_clean") is False]
