"""A committed results folder's report, rebuilt from its files:

    python -m benchlab.analysis.folder_report results/<folder>

writes results/<folder>/report.md and its PNGs under results/<folder>/report/, from the folder's params.yaml,
metrics/variants, plots/steps, and where the run has them, metrics/parity and plots/profiles
(`benchlab.analysis.run_report` writes it). A folder written before the `optimizer` knob holds the knobs it
replaced; they are read in today's names here (`benchlab.core.old_names`), the only reader of old records.
"""

import argparse
from dataclasses import fields
from pathlib import Path
from typing import Any

from benchlab.analysis.records import check_one_env, check_one_source, load_results
from benchlab.analysis.run_report import RunFiles, write_run_report
from benchlab.core import presets
from benchlab.core.errors import LabError
from benchlab.core.old_names import from_old_knobs
from benchlab.core.sections import AggregateParams
from benchlab.core.stage_main import run_main
from benchlab.core.yaml_files import read_yaml


def folder_params(folder: Path) -> dict[str, Any]:
    """A results folder's params.yaml as plain data: older folders hold keys today's params no longer know. The
    knobs that `optimizer` replaced are read as it (`benchlab.core.knobs.from_old_knobs`), at the top and in each
    variant."""
    path = folder / "params.yaml"
    data = read_yaml(path) if path.is_file() else {}
    if not isinstance(data, dict):
        return {}
    params = from_old_knobs(presets.applied(data))
    variants = params.get("variants")
    if isinstance(variants, dict):
        params["variants"] = {n: from_old_knobs(v) if isinstance(v, dict) else v for n, v in variants.items()}
    return params


def folder_aggregate(params: dict[str, Any], names: list[str]) -> AggregateParams:
    """The folder's aggregate settings, today's defaults for keys it predates; names it lacks are dropped."""
    known = {f.name for f in fields(AggregateParams)}
    agg = AggregateParams(**{k: v for k, v in (params.get("aggregate") or {}).items() if k in known})
    return AggregateParams(**{**agg.__dict__, "fallback_baselines": [n for n in agg.fallback_baselines if n in names],
                              "ours": [n for n in agg.ours if n in names]})


def folder_report(folder: Path, title: str | None = None) -> Path:
    """Write `folder`/report.md and its PNGs under `folder`/report/; the folder's own allow_mixed_* settings hold.
    The title names the folder as given, unless `title` says otherwise."""
    files = RunFiles.of_folder(folder)
    if not files.variants.is_dir():
        raise LabError(f"{files.variants} is missing: a results folder holds a run's metrics/variants")
    params = folder_params(folder)
    recorded = sorted(p.stem for p in files.variants.glob("*.json"))
    if not recorded:
        raise LabError(f"{files.variants} holds no variant records")
    names = [n for n in (params.get("variants") or {}) if n in recorded]
    names += [n for n in recorded if n not in names]
    records = [from_old_knobs(r) for r in load_results(files.variants, names)]
    agg = folder_aggregate(params, names)
    check_one_env(records, agg.allow_mixed_env)
    check_one_source(records, agg.allow_mixed_source)
    not_run = [n for n in (params.get("variants") or {}) if n not in recorded]
    write_run_report(records, files, agg, folder / "report.md", folder / "report",
                     title or f"Run report: {folder.as_posix()}", not_run)
    return folder / "report.md"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", type=Path, nargs="+", help="results folders, each holding metrics/variants")
    for folder in ap.parse_args(argv).folders:
        print(f"wrote {folder_report(folder)}")


if __name__ == "__main__":
    run_main(main)
