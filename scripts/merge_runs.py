"""Merge the packed results of several `scripts/remote_gpu.sh` calls (or any OUT_DIR holding results.tar.gz) into one results folder.

    python scripts/merge_runs.py OUT_DIR PART_DIR [PART_DIR ...]

A matrix too long for one device call runs as several calls on one machine, each on a subset of the variants
(`VARIANTS=...`, perhaps with different `-S bench.repeats`). Each call's OUT_DIR is a PART_DIR here: it holds
`results.tar.gz` and `dvc_log.txt`. OUT_DIR gets
  - every part's `metrics/variants/`, `plots/steps/`, `plots/profiles/`, `metrics/parity/` and `plots/parity/`
    files, and `metrics/env.json`;
  - a `params.yaml` whose variants (and profiled variants) are those the parts recorded, in the parts' order,
    the rest being the parts' shared settings;
  - `parts/<n>/` with each part's own `params.yaml`, `dvc.lock`, `dvc_log.txt` and `gpu.txt` (where it has one);
  - the summary and report that `stages.aggregate` makes of all the variants (`metrics/summary.*`,
    `metrics/report.md`, `plots/summary*`);
  - the folder's own `report.md` with its PNGs in `report/`, as `python -m benchlab.runreport OUT_DIR` writes it.
It refuses parts measured in different environments or from different source (the aggregate stage's checks), parts
with different settings other than the variants, the profiled variants and the repeats, a variant recorded by two
parts, two parts with different files of one name under metrics/parity or plots/parity, and an OUT_DIR that already
has files. A refused merge leaves no OUT_DIR.
"""

import argparse
import copy
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchlab.errors import LabError, run_main  # noqa: E402
from benchlab.runreport import folder_report  # noqa: E402

# What a part's folder holds beside its pack and is kept with it: the DVC log, and the machine's name and driver as
# `nvidia-smi --query-gpu=name,driver_version --format=csv,noheader` printed them.
PART_FILES = ("dvc_log.txt", "gpu.txt")
# The settings parts may differ in: what each call ran, and how often.
PER_PART = (("variants",), ("profile", "variants"), ("bench", "repeats"))


def shared_settings(params: dict[str, Any]) -> dict[str, Any]:
    """A part's params without the settings parts may differ in."""
    out = copy.deepcopy(params)
    for *parents, last in PER_PART:
        node = out
        for key in parents:
            node = node.get(key, {})
        node.pop(last, None)
    return out


def unpack(part: Path, into: Path) -> None:
    packed = part / "results.tar.gz"
    if not packed.is_file():
        raise LabError(f"{packed} is missing: a PART_DIR is the OUT_DIR of one scripts/remote_gpu.sh call")
    try:
        with tarfile.open(packed) as tar:
            tar.extractall(into, filter="data")
    except (tarfile.TarError, OSError) as err:
        raise LabError(f"{packed} cannot be unpacked ({err}); copy it again from the device's files") from None
    if not (into / "params.yaml").is_file():
        raise LabError(f"{packed} holds no params.yaml; it is not a results pack")


def read_params(packed: Path, path: Path) -> dict[str, Any]:
    try:
        params = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise LabError(f"{packed}'s params.yaml is not valid YAML ({err}); copy the pack again") from None
    if not isinstance(params, dict) or not isinstance(params.get("variants"), dict):
        raise LabError(f"{packed}'s params.yaml names no variants; it is not a results pack")
    return params


def merge(parts: list[Path], work: Path, out_name: str = "") -> None:
    """Write the merged folder of `parts` at `work`, its report titled with `out_name` (the OUT_DIR it becomes)."""
    records: dict[str, int] = {}  # the part of each variant
    first_params: dict[str, Any] | None = None
    variants: dict[str, Any] = {}
    profiled: list[str] = []
    env_text: str | None = None
    for n, part in enumerate(parts, 1):
        unpacked = work / "parts" / str(n) / "unpacked"
        unpack(part, unpacked)
        params = read_params(part / "results.tar.gz", unpacked / "params.yaml")
        if first_params is None:
            first_params = params
        elif shared_settings(params) != shared_settings(first_params):
            raise LabError(f"{part} ran other settings than {parts[0]} (beyond the variants, the profiled variants "
                           "and bench.repeats); merge only calls of one matrix")
        found = {path.stem: path for path in (unpacked / "metrics" / "variants").glob("*.json")}
        if unknown := sorted(set(found) - set(params["variants"])):
            raise LabError(f"{part} has records of {', '.join(unknown)}, which its params.yaml does not name")
        for name in (v for v in params["variants"] if v in found):  # a variant a time limit cut has no record
            if name in records:
                raise LabError(f"variant {name} is in {parts[records[name] - 1]} and in {part}; "
                               "each variant must come from one part")
            records[name] = n
            variants[name] = params["variants"][name]
        profiled += [v for v in params.get("profile", {}).get("variants", [])
                     if (unpacked / "plots" / "profiles" / f"{v}_kernels.md").is_file()]
        env_path = unpacked / "metrics" / "env.json"
        if env_path.is_file():
            if env_text is not None and env_path.read_text() != env_text:
                raise LabError(f"{part}'s metrics/env.json differs from the first part's: the calls ran on different "
                               "machines or software")
            env_text = env_path.read_text()
        for sub in ("metrics/variants", "plots/steps", "plots/profiles"):
            if (unpacked / sub).is_dir():
                shutil.copytree(unpacked / sub, work / sub, dirs_exist_ok=True)
        for sub in ("metrics/parity", "plots/parity"):
            copy_parity(unpacked / sub, work / sub, part)
        for name in ("params.yaml", "dvc.lock"):
            if (unpacked / name).is_file():
                shutil.copy2(unpacked / name, work / "parts" / str(n) / name)
        for name in PART_FILES:
            if (part / name).is_file():
                shutil.copy2(part / name, work / "parts" / str(n) / name)
        shutil.rmtree(unpacked)
    assert first_params is not None  # argparse asks for at least one part
    if not records:
        raise LabError("the parts recorded no variant (metrics/variants/ is empty in every pack)")
    if env_text is not None:
        (work / "metrics" / "env.json").write_text(env_text)
    merged = {**first_params, "variants": variants, "profile": {**first_params.get("profile", {}), "variants": profiled}}
    (work / "params.yaml").write_text(yaml.safe_dump(merged, sort_keys=False))
    # The aggregate stage refuses records of other machines, software or source, as it does in a DVC run.
    aggregate = [sys.executable, "-m", "stages.aggregate", "metrics/variants", "plots/steps", "metrics/parity",
                 "plots/profiles", "metrics/summary.json", "metrics/summary.md", "plots/summary.csv", "plots/summary",
                 "metrics/report.md"]
    done = subprocess.run(aggregate, cwd=work, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1].removeprefix("error: ")
        raise LabError(f"the aggregate stage refused the merged variants: {last}")
    folder_report(work, f"Run report: {out_name or work.name}")


def copy_parity(src: Path, dst: Path, part: Path) -> None:
    """A part's parity records or curves into the merged folder; the same name with other contents is refused."""
    for path in sorted(src.glob("*")) if src.is_dir() else []:
        if (dst / path.name).is_file() and (dst / path.name).read_bytes() != path.read_bytes():
            raise LabError(f"{part} has another {path.relative_to(src.parent.parent)} than an earlier part; "
                           "merge only calls whose parity runs differ in their variants")
        dst.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dst / path.name)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("parts", type=Path, nargs="+")
    args = ap.parse_args(argv)
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        raise LabError(f"{args.out} already exists and is not an empty folder; merge into a new folder")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.out.parent, prefix=f".{args.out.name}.") as tmp:
        work = Path(tmp) / "merged"
        work.mkdir()
        merge(args.parts, work, args.out.as_posix())
        if args.out.exists():
            args.out.rmdir()
        work.rename(args.out)
    print(f"merged {len(args.parts)} parts into {args.out}: {', '.join(sorted(p.stem for p in (args.out / 'metrics' / 'variants').glob('*.json')))}")


if __name__ == "__main__":
    run_main(main)
