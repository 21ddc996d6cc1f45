"""scripts/merge_runs.py: the packs of several device calls become one results folder, or a clear refusal."""

import importlib.util
import json
import shutil
import tarfile
from pathlib import Path

import pytest
import yaml

from benchlab.errors import LabError

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "results/h200-weights/onecall/study"  # a committed study of four variants, one call
PROFILES = ROOT / "results/h200-weights/onecall/profiles/plots/profiles"  # another call's, of recipe and lean_sr
spec = importlib.util.spec_from_file_location("merge_runs", ROOT / "scripts/merge_runs.py")
merge_runs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(merge_runs)


def pack(part: Path, names: list[str], repeats: int = 3, steps: int | None = None,
         gpu: str | None = None, profiled: tuple[str, ...] = (), asked: tuple[str, ...] = (),
         env_json: str | None = None, stray: str | None = None, parity: dict[str, str] | None = None) -> Path:
    """A remote_gpu.sh OUT_DIR holding `names` of the committed run, as if one call had run only those, with the
    profiles of `profiled` and params asking for those of `asked` as well."""
    src = part / "src"
    (src / "metrics/variants").mkdir(parents=True)
    (src / "plots/steps").mkdir(parents=True)
    params = yaml.safe_load((RUN / "params.yaml").read_text())
    params["variants"] = {n: params["variants"][n] for n in names}
    params["bench"]["repeats"] = repeats
    params["profile"]["variants"] = [*profiled, *asked]
    if profiled:
        (src / "plots/profiles").mkdir()
    for n in profiled:
        shutil.copy(PROFILES / f"{n}_kernels.md", src / f"plots/profiles/{n}_kernels.md")
    if steps is not None:
        params["bench"]["steps"] = steps
    (src / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    shutil.copy(RUN / "dvc.lock", src / "dvc.lock")
    shutil.copy(RUN / "metrics/env.json", src / "metrics/env.json")
    if env_json is not None:
        (src / "metrics/env.json").write_text(env_json)
    for rel, text in (parity or {}).items():  # parity records and curves, by path in the pack
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    if stray is not None:  # a record the pack's params do not name
        shutil.copy(RUN / f"metrics/variants/{stray}.json", src / f"metrics/variants/{stray}.json")
    for n in names:
        shutil.copy(RUN / f"metrics/variants/{n}.json", src / f"metrics/variants/{n}.json")
        if gpu is not None:
            record = json.loads((RUN / f"metrics/variants/{n}.json").read_text())
            (src / f"metrics/variants/{n}.json").write_text(json.dumps({**record, "env.gpu": gpu}))
        shutil.copy(RUN / f"plots/steps/{n}.csv", src / f"plots/steps/{n}.csv")
    with tarfile.open(part / "results.tar.gz", "w:gz") as tar:
        for name in ("params.yaml", "dvc.lock", "metrics", "plots"):
            tar.add(src / name, arcname=name)
    (part / "dvc_log.txt").write_text(f"the log of {part.name}\n")
    shutil.rmtree(src)
    return part


def test_two_calls_merge_into_one_folder_with_one_summary(tmp_path: Path) -> None:
    a = pack(tmp_path / "a", ["recipe", "fastest_sr"], profiled=("recipe",))
    b = pack(tmp_path / "b", ["lean_sr", "lean"], repeats=1, profiled=("lean_sr",), asked=("lean",))
    (a / "gpu.txt").write_text("NVIDIA H200, 580.159.04\n")
    out = tmp_path / "merged"
    merge_runs.main([str(out), str(a), str(b)])
    params = yaml.safe_load((out / "params.yaml").read_text())
    assert list(params["variants"]) == ["recipe", "fastest_sr", "lean_sr", "lean"]
    assert params["variants"]["lean"] == yaml.safe_load((RUN / "params.yaml").read_text())["variants"]["lean"]
    assert params["profile"]["variants"] == ["recipe", "lean_sr"]  # lean's profile was asked for, never written
    for n in ("recipe", "lean_sr"):
        assert (out / f"plots/profiles/{n}_kernels.md").read_bytes() == (PROFILES / f"{n}_kernels.md").read_bytes()
    assert params["bench"]["repeats"] == 3  # the first part's; each record keeps its own
    assert sorted(p.stem for p in (out / "metrics/variants").glob("*.json")) == ["fastest_sr", "lean", "lean_sr", "recipe"]
    assert sorted(p.stem for p in (out / "plots/steps").glob("*.csv")) == ["fastest_sr", "lean", "lean_sr", "recipe"]
    for n in ("recipe", "lean"):
        assert (out / f"metrics/variants/{n}.json").read_bytes() == (RUN / f"metrics/variants/{n}.json").read_bytes()
    summary = json.loads((out / "metrics/summary.json").read_text())
    recorded = json.loads((RUN / "metrics/variants/fastest_sr.json").read_text())["tokens_per_sec"]
    assert summary["fastest_sr.tokens_per_sec"] == pytest.approx(recorded)
    assert all(f"| {n} " in (out / "metrics/summary.md").read_text() for n in ("recipe", "fastest_sr", "lean_sr", "lean"))
    assert yaml.safe_load((out / "parts/2/params.yaml").read_text())["bench"]["repeats"] == 1
    assert (out / "parts/2/dvc_log.txt").read_text() == "the log of b\n"
    assert sorted(p.name for p in (out / "parts/1").iterdir()) == ["dvc.lock", "dvc_log.txt", "gpu.txt", "params.yaml"]
    assert (out / "parts/1/gpu.txt").read_text() == "NVIDIA H200, 580.159.04\n"
    assert not (out / "parts/2/gpu.txt").exists()  # b's folder had none
    assert (out / "metrics/env.json").read_bytes() == (RUN / "metrics/env.json").read_bytes()
    report = (out / "report.md").read_text()  # the folder's report, as `python -m benchlab.runreport` writes it
    assert report.startswith(f"# Run report: {out.as_posix()}\n") and "![throughput](report/throughput.png)" in report
    assert (out / "report/throughput.png").is_file() and (out / "metrics/report.md").is_file()
    assert "| lean_sr | " in report and "scratch" not in report and ".merged." not in report


def test_parity_files_of_the_parts_are_merged_and_a_conflict_is_refused(tmp_path: Path) -> None:
    seeds = json.dumps({"reference": "recipe", "status": "ok", "noise_nats": 0.01})
    record = json.dumps({"variant": "lean", "status": "ok", "learns_same": True, "verdict": "same", "gap_nats": 0.002})
    a = pack(tmp_path / "a", ["recipe", "fastest_sr"], parity={"metrics/parity/reference-seeds.json": seeds})
    b = pack(tmp_path / "b", ["lean"], parity={"metrics/parity/reference-seeds.json": seeds,
                                               "metrics/parity/lean.json": record,
                                               "plots/parity/lean.csv": "step,loss,reference_loss\n0,8.0,8.0\n"})
    out = tmp_path / "merged"
    merge_runs.main([str(out), str(a), str(b)])
    assert sorted(p.name for p in (out / "metrics/parity").iterdir()) == ["lean.json", "reference-seeds.json"]
    assert (out / "plots/parity/lean.csv").is_file()
    assert "| lean | yes |" in (out / "report.md").read_text()
    other = pack(tmp_path / "c", ["lean"], parity={"metrics/parity/reference-seeds.json": seeds.replace("0.01", "0.2")})
    with pytest.raises(LabError, match="has another metrics/parity/reference-seeds.json than an earlier part"):
        merge_runs.main([str(tmp_path / "merged2"), str(a), str(other)])
    assert not (tmp_path / "merged2").exists()


@pytest.mark.parametrize("second, message", [
    (dict(names=["recipe", "lean"]), "variant recipe is in"),
    (dict(names=["lean"], steps=300), "ran other settings than"),
    (dict(names=["lean"], gpu="NVIDIA H100"), "measured in another environment"),
    (dict(names=["lean"], env_json='{"gpu": "NVIDIA H100"}'), "env.json differs"),
    (dict(names=["lean"], stray="lean_sr"), "records of lean_sr, which its params.yaml does not name"),
])
def test_parts_that_are_not_one_run_are_refused(tmp_path: Path, second: dict, message: str) -> None:
    a = pack(tmp_path / "a", ["recipe", "fastest_sr"])
    b = pack(tmp_path / "b", **second)
    out = tmp_path / "merged"
    with pytest.raises(LabError, match=message):
        merge_runs.main([str(out), str(a), str(b)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # no OUT_DIR, no scratch left


def test_a_folder_without_a_pack_and_a_used_out_dir_are_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(LabError, match=r"results\.tar\.gz is missing"):
        merge_runs.main([str(tmp_path / "merged"), str(tmp_path / "empty")])
    a = pack(tmp_path / "a", ["recipe"])
    (tmp_path / "used").mkdir()
    (tmp_path / "used/file").write_text("x")
    with pytest.raises(LabError, match="already exists and is not an empty folder"):
        merge_runs.main([str(tmp_path / "used"), str(a)])
    with pytest.raises(LabError, match="already exists and is not an empty folder"):
        merge_runs.main([str(tmp_path / "used/file"), str(a)])
    with pytest.raises(LabError, match="recorded no variant"):
        merge_runs.main([str(tmp_path / "merged"), str(pack(tmp_path / "none", []))])
    no_variants = pack(tmp_path / "no-variants", ["recipe"])
    with tarfile.open(no_variants / "results.tar.gz", "w:gz") as tar:
        (tmp_path / "params.yaml").write_text("variants: [recipe]\n")
        tar.add(tmp_path / "params.yaml", arcname="params.yaml")
    with pytest.raises(LabError, match="names no variants"):
        merge_runs.main([str(tmp_path / "merged"), str(no_variants)])
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "results.tar.gz").write_bytes(b"not a tar")
    with pytest.raises(LabError, match="cannot be unpacked"):
        merge_runs.main([str(tmp_path / "merged"), str(broken)])
    assert not (tmp_path / "merged").exists()


def test_ctrl_c_mid_merge_exits_130_and_leaves_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = pack(tmp_path / "a", ["recipe", "fastest_sr"])
    b = pack(tmp_path / "b", ["lean"])

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(merge_runs.subprocess, "run", interrupted)  # as the aggregate stage starts
    with pytest.raises(SystemExit) as stop:
        merge_runs.run_main(merge_runs.main, [str(tmp_path / "merged"), str(a), str(b)])
    assert stop.value.code == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # no OUT_DIR, no scratch left
