"""The report per run: the aggregate stage's metrics/report.md and `python -m benchlab.analysis.folder_report <folder>`, from
hand-made records, parity records and profiles; every figure it shows is one the files hold."""

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchlab.analysis.folder_report import folder_report
from benchlab.analysis.folder_report import main as runreport_main
from benchlab.core.errors import LabError
from stages import aggregate
from tests.conftest import ROOT, micro_params

NAMES = ("fp32_baseline", "tf32", "recipe", "fastest", "lean")
ENV = {"env.gpu": "NVIDIA H200", "env.gpu_count": 1, "env.gpu_capability": "9.0", "env.driver": "580.159.04",
       "env.cuda": "13.0", "env.cudnn": 91900, "env.torch": "2.11.0+cu130", "env.python": "3.12.3",
       "env.cpu": "Xeon", "env.cpu_count": 16, "env.torch_threads": 16, "env.torchao": "0.18.0",
       "env.liger_kernel": "0.8.5", "env.cut_cross_entropy": None, "env.gpu_topology": "GPU0 X",
       "provenance.source_sha256": "ab" * 32, "provenance.tree_clean": True, "provenance.git_commit": "c0ffee1" * 5,
       "provenance.date_utc": "2026-12-03T09:00:00+00:00"}
SETTINGS = {"params.model": "gpt2_124m", "params.shape.batch_size": 16, "block_size": 1024, "batch_size": 16,
            "params.bench.steps": 20, "params.harness.warmup_steps": 6, "params.bench.repeats": 3,
            "params.harness.memory_cap_gib": 24}
KERNELS = """# recipe: top kernels by device time

gpt2_124m, batch 16 x 1024, 2 traced steps after 6 warm-up steps.

| family | device ms per step | share % |
| --- | --- | --- |
| matmul | 16.30 | 53.2 |
| attention | 3.71 | 12.1 |

| kernel | family | calls per step | device ms per step | share % |
| --- | --- | --- | --- | --- |
| `nvjet_sm90_tst_256x128` | matmul | 49.0 | 5.276 | 17.5 |
"""


def record(name: str, status: str = "ok", tps: float | None = None, **kw: Any) -> dict[str, Any]:
    """A variant's record as the bench stage writes it, with the knobs params.yaml gives it."""
    knobs = micro_params()["variants"][name]
    ok = {"tokens_per_sec": tps, "val_loss": 5.0, "peak_mem_allocated_mb": 10240.0, "peak_mem_reserved_mb": 11000.0,
          "mfu_pct": 40.0, "repeats": 3, "tokens_per_sec_pi95_low": tps * 0.99, "tokens_per_sec_pi95_high": tps * 1.01,
          "power_w_mean": 650.0, "tokens_per_joule": tps / 650.0, "power_note": None} if status == "ok" else {}
    return {"variant": name, "status": status, "message": "", **knobs, **ENV, **SETTINGS, **ok, **kw}


def records() -> list[dict[str, Any]]:
    """fp32 ran out of memory under the 24 GiB cap; tf32 was measured without a power reading."""
    return [record("fp32_baseline", "oom", message="CUDA out of memory. Tried to allocate 768.00 MiB",
                   peak_mem_allocated_mb=23100.0, peak_mem_reserved_mb=23900.0),
            record("tf32", tps=120000.0, power_w_mean=None, tokens_per_joule=None,
                   power_note="the driver reports no power for this board"),
            record("recipe", tps=500000.0), record("fastest", tps=600000.0), record("lean", tps=450000.0)]


def write_run(root: Path, with_parity: bool = True) -> None:
    """metrics/variants, plots/steps and (optionally) metrics/parity and plots/profiles of one run under root."""
    for sub in ("metrics/variants", "plots/steps", "plots/profiles"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for r in records():
        (root / f"metrics/variants/{r['variant']}.json").write_text(json.dumps(r))
        rows = "".join(f"{i},{8.0 - 0.1 * i},0.001,{30.0 + i % 3},{int(i >= 6)}\n" for i in range(20))
        (root / f"plots/steps/{r['variant']}.csv").write_text("step,loss,lr,step_ms,timed\n"
                                                              + (rows if r["status"] == "ok" else ""))
    (root / "plots/profiles/recipe_kernels.md").write_text(KERNELS)
    if not with_parity:
        return
    (root / "metrics/parity").mkdir(parents=True)
    parity = {"recipe": (True, "same", 0.004), "fastest": (False, "worse by 0.12 nats", 0.12),
              "lean": (None, "not judged: the reference's own seeds differ by 0.08 nats", 0.01)}
    for name, (learns, verdict, gap) in parity.items():
        (root / f"metrics/parity/{name}.json").write_text(json.dumps({
            "variant": name, "reference": "tf32", "status": "ok", "message": "", "steps": 150, "tail_steps": 30,
            "tolerance": 0.05, "tail_loss": 5.0 + gap, "reference_tail_loss": 5.0, "gap_nats": gap,
            "noise_nats": 0.02, "val_loss": 5.1, "reference_val_loss": 5.09, "data_passes": 0.4,
            "learns_same": learns, "verdict": verdict}))
    (root / "metrics/parity/reference-seeds.json").write_text(json.dumps({
        "reference": "tf32", "status": "ok", "message": "", "steps": 150, "tail_steps": 30, "seeds": [1, 2],
        "tail_losses": [5.0, 5.02], "noise_nats": 0.02, "val_losses": [5.09, 5.1], "tolerance": 0.05}))


def params(**aggregate: Any) -> dict[str, Any]:
    data = micro_params()
    data["variants"] = {n: data["variants"][n] for n in NAMES}
    data["profile"]["variants"] = ["recipe"]
    data["aggregate"].update(aggregate)
    if "parity" in data:
        data["parity"].update(reference="tf32", variants=["recipe", "fastest", "lean"])
    return data


ARGS = ["metrics/variants", "plots/steps", "metrics/parity", "plots/profiles", "metrics/summary.json",
        "metrics/summary.md", "plots/summary.csv", "plots/summary", "metrics/report.md"]


@pytest.fixture()
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params(), sort_keys=False))
    write_run(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def table_row(report: str, name: str) -> list[str]:
    line = next(x for x in report.splitlines() if x.startswith(f"| {name} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_aggregate_writes_the_report_and_the_summary_with_fallback_ratios_energy_and_parity(run_dir: Path) -> None:
    aggregate.main(ARGS)
    report = (run_dir / "metrics/report.md").read_text()
    note = ("fp32_baseline ran out of memory at 23,900 MiB reserved (23,100 MiB allocated) under a 24 GiB cap; "
            "ratios are against recipe, the first fallback that ran.")
    assert note in report and note in (run_dir / "metrics/summary.md").read_text()
    assert "| GPU | NVIDIA H200 x 1, compute capability 9.0 |" in report
    assert "| libraries | liger_kernel 0.8.5, torchao 0.18.0 |" in report  # what the env has, nothing more
    assert "Model gpt2_124m, batch 16 x 1024 tokens, 20 steps per run of which 6 are warm-up" in report
    assert "GPU memory cap: 24 GiB" in report
    fastest = table_row(report, "fastest")
    assert fastest[:8] == ["fastest", "our own", "ok", "600,000", "594,000 to 606,000", "3", "1.20x", "10.00"]
    assert fastest[10:12] == ["923.1", "no: worse by 0.12 nats"]
    assert table_row(report, "recipe")[1] == "knobs on the recipe" and table_row(report, "tf32")[-2] == "–"
    assert "| tf32 | not measured: the driver reports no power for this board | – |" in report
    assert "| fastest | 650 | 923.1 |" in report
    assert "batch-order seeds 1, 2: mean loss over the last 30 steps 5.0000 and 5.0200, a gap of 0.0200" in report
    assert table_row(report, "lean")[11].startswith("not judged: the reference's own seeds")
    assert "| lean | not judged: the reference's own seeds differ by 0.08 nats | 5.0100 | 5.0000 | +0.0100 |" in report
    assert "| matmul | 16.30 ms (53%) |" in report
    assert ("| fp32_baseline | oom | CUDA out of memory. Tried to allocate 768.00 MiB | 23,900 MiB reserved "
            "(23,100 MiB allocated) under a 24 GiB cap |") in report
    for link in re.findall(r"!\[[^]]*\]\(([^)]+)\)", report):
        assert (run_dir / "metrics" / link).resolve().is_file(), link  # relative to the report
    assert "../plots/summary/throughput.png" in report and (run_dir / "plots/summary/energy.png").is_file()
    summary = json.loads((run_dir / "metrics/summary.json").read_text())
    assert summary["fastest.speedup_x"] == pytest.approx(1.2)
    assert summary["fastest.power_w_mean"] == 650.0 and summary["fastest.tokens_per_joule"] == pytest.approx(923.08,
                                                                                                             abs=0.01)
    assert summary["fastest.parity_gap_nats"] == 0.12 and "tf32.parity_gap_nats" not in summary
    assert "tf32.power_w_mean" not in summary  # not measured: no figure
    assert not any(isinstance(v, bool) for v in summary.values())


def test_a_stalled_timing_is_named_in_the_report_and_the_summary(run_dir: Path) -> None:
    stalled = record("lean", tps=450000.0, steady_state_ok=False, steady_gap_pct=0.4, step_ms_median=36.4,
                     stalled_steps=1, stall_ms_max=20_012.0, stall_outside_steps_ms=0.0)
    (run_dir / "metrics/variants/lean.json").write_text(json.dumps(stalled))
    aggregate.main(ARGS)
    note = "timing disturbed: 1 timed step stalled, the longest 20,012 ms beyond the 36.40 ms median step"
    assert note in table_row((run_dir / "metrics/report.md").read_text(), "lean")[-1]
    assert note in (run_dir / "metrics/summary.md").read_text()


def test_a_run_without_parity_or_profiles_says_so(run_dir: Path) -> None:
    shutil.rmtree(run_dir / "metrics/parity")
    shutil.rmtree(run_dir / "plots/profiles")
    (run_dir / "metrics/parity").mkdir()  # an empty folder reads the same as none
    aggregate.main(ARGS)
    report = (run_dir / "metrics/report.md").read_text()
    assert "No parity records (metrics/parity is missing or empty)" in report
    assert "No profiles (plots/profiles is missing" in report
    assert table_row(report, "recipe")[11] == "–"


def test_the_baseline_that_ran_is_the_reference_and_the_ratios_say_so(run_dir: Path) -> None:
    runs = records()
    runs[0] = record("fp32_baseline", tps=50000.0)
    (run_dir / "metrics/variants/fp32_baseline.json").write_text(json.dumps(runs[0]))
    aggregate.main(ARGS)
    report = (run_dir / "metrics/report.md").read_text()
    assert "Ratios (speedup, memory change, loss check) are against fp32_baseline, aggregate.baseline." in report
    assert table_row(report, "fastest")[6] == "12.00x" and "Every variant that ran, ran ok." in report


def test_uncommitted_code_is_flagged_and_the_run_goes_on(run_dir: Path) -> None:
    for path in (run_dir / "metrics/variants").glob("*.json"):
        path.write_text(json.dumps({**json.loads(path.read_text()), "provenance.tree_clean": False}))
    aggregate.main(ARGS)
    report = (run_dir / "metrics/report.md").read_text()
    assert "measured from uncommitted code (the tree differed from its commit)" in report
    assert "measured from uncommitted code" in table_row(report, "recipe")[-1]
    assert "measured from uncommitted code" in (run_dir / "metrics/summary.md").read_text()


def test_ours_and_fallbacks_that_name_no_variant_are_refused_when_params_load(run_dir: Path) -> None:
    (run_dir / "params.yaml").write_text(yaml.safe_dump(params(ours=["fastest", "ghost"]), sort_keys=False))
    with pytest.raises(LabError, match="aggregate.ours='ghost' is not valid; expected fp32_baseline, tf32"):
        aggregate.main(ARGS)
    (run_dir / "params.yaml").write_text(yaml.safe_dump(params(fallback_baselines=["nope"]), sort_keys=False))
    with pytest.raises(LabError, match="aggregate.fallback_baselines='nope' is not valid"):
        aggregate.main(ARGS)


def test_a_reference_and_ours_set_in_params_are_used(run_dir: Path) -> None:
    (run_dir / "params.yaml").write_text(yaml.safe_dump(params(ours=["lean"], reference="tf32",
                                                               fallback_baselines=["lean", "recipe"]), sort_keys=False))
    aggregate.main(ARGS)
    report = (run_dir / "metrics/report.md").read_text()
    assert "ratios are against lean, the first fallback that ran" in report
    assert table_row(report, "lean")[1] == "our own" and table_row(report, "fastest")[1] != "our own"
    assert table_row(report, "tf32")[1] == "knobs on the recipe"  # the reference heads that group


def test_the_folder_command_writes_a_report_beside_the_folders_files(tmp_path: Path) -> None:
    folder = tmp_path / "results" / "gpu-24g"
    write_run(folder, with_parity=False)
    old = params()
    old["aggregate"]["an_old_key"] = True  # a key this code no longer knows: read, not refused
    old["variants"]["gone"] = {"precision": "bf16"}  # named, but no record
    (folder / "params.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    bare = {"variant": "old_record", "status": "ok", "tokens_per_sec": 1000.0, "val_loss": 6.0, **ENV}
    (folder / "metrics/variants/old_record.json").write_text(json.dumps(bare))  # an older record format
    runreport_main([str(folder)])
    report = (folder / "report.md").read_text()
    assert report.startswith(f"# Run report: {folder.as_posix()}")
    assert sorted(p.name for p in (folder / "report").iterdir()) == [
        "energy.png", "loss_curves.png", "memory.png", "step_times.png", "throughput.png"]
    assert "![throughput](report/throughput.png)" in report
    row = table_row(report, "old_record")
    assert row[3] == "1,000" and row[4:6] == ["–", "–"] and row[10] == "–"  # what it lacks is a dash
    assert "| gone |" not in report and "Not run (the run stopped before them; the same command again runs them): gone." in report


def test_the_folder_command_refuses_mixed_code_and_a_folder_without_records(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    write_run(folder)
    (folder / "params.yaml").write_text(yaml.safe_dump(params(), sort_keys=False))
    path = folder / "metrics/variants/lean.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "provenance.source_sha256": "cd" * 32}))
    with pytest.raises(LabError, match="ran different source code"):
        folder_report(folder)
    with pytest.raises(LabError, match="metrics/variants is missing"):
        folder_report(tmp_path / "nothing")


def test_a_committed_results_folder_gets_its_report(tmp_path: Path) -> None:
    folder = tmp_path / "h200-ours"
    shutil.copytree(ROOT / "results/h200-ours", folder)
    folder_report(folder)
    report = (folder / "report.md").read_text()
    recorded = json.loads((folder / "metrics/variants/fastest.json").read_text())
    assert f"{recorded['tokens_per_sec']:,.0f}" in table_row(report, "fastest")[3]
    assert "Every variant: not recorded: the record predates power measurement." in report


def test_the_parity_section_says_whether_the_tolerance_can_judge() -> None:
    from benchlab.analysis.run_report import tolerance_words
    assert tolerance_words({"status": "ok", "noise_nats": 0.23, "tolerance": 0.05}).startswith("below that gap: no verdict")
    assert tolerance_words({"status": "ok", "noise_nats": 0.01, "tolerance": 0.05}).startswith("above that gap")
    assert tolerance_words({"status": "oom", "message": "out of memory"}) == "the reference oom: out of memory"


def test_a_stopped_runs_report_names_the_variants_it_did_not_reach() -> None:
    from benchlab.analysis.run_report import not_measured
    text = not_measured([{"variant": "a", "status": "ok"}], ["b", "c"])
    assert "Not run (the run stopped before them; the same command again runs them): b, c." in text
    assert text.endswith("Every variant that ran, ran ok.\n")
