"""End to end through DVC, in a scratch copy of the repository, with a micro config.

One module-scoped run of `dvc repro` feeds the checks: every declared output
exists, a second repro reruns nothing but the env check, an experiment with
`-S precision=bf16` reruns train and evaluate only, `dvc metrics diff` shows the
change, no socket was opened, and a run killed mid-training is redone cleanly.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, copy_sources, micro_params
from tests.unit.test_dvc_params import check_reads

pytestmark = pytest.mark.integration  # one DVC lab, built by `dvc repro` in a scratch copy: minutes

# One xdist worker runs this whole module, so its DVC repository is built once: tests/conftest.py collects
# these tests first, and xdist's first batch for the first worker holds them all.

COPY = ["dvc.yaml", "params.yaml", ".dvcignore", ".dvc/config", ".dvc/plots", "stages", "benchlab", "model"]

# Names a hostile params.yaml could give a variant: each would run `touch PWNED`
# if it ever reached a shell command line.
EVIL_NAMES = ["x';touch PWNED;'", "x;touch PWNED", "x$(touch PWNED)", "x`touch PWNED`", "x\ntouch PWNED\n",
              "x y;touch PWNED"]


def pipeline_params() -> dict:
    """The micro params with a matrix that covers every kind of variant: skipped, eager knobs, and one compiled."""
    data = micro_params(data__corpus="corpus.txt")
    data["variants"] = {
        "fp32_baseline": data["variants"]["fp32_baseline"],
        "fp16": {"precision": "fp16"},  # skipped on a CPU
        "bf16": {"precision": "bf16"},
        "recipe": data["variants"]["recipe"],  # compiled
        "ckpt_full": {"precision": "bf16", "attention": "sdpa", "activation_checkpointing": "full"},
        "loss_chunked": {"attention": "sdpa", "loss": "chunked", "batch_size": 4, "grad_accum": 2},
    }
    data["profile"]["variants"] = ["recipe"]
    data["parity"].update(reference="fp32_baseline", variants=["ckpt_full"], steps=6, tail_steps=2, tolerance=5.0)
    return data

# Loaded into every Python process of the pipeline: any attempt to open an
# internet socket is written down and refused.
NO_NETWORK = '''
import socket, os
_real_connect = socket.socket.connect
def _refuse(self, address, *args):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        with open(os.environ["NETWORK_LOG"], "a") as f:
            f.write(repr(address) + "\\n")
        raise OSError("network blocked by the test")
    return _real_connect(self, address, *args)
socket.socket.connect = _refuse
'''


def sh(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(repo / ".sitecustomize"), "NETWORK_LOG": str(repo / "network.log"),
           "BENCHLAB_PARAM_READS": f"{repo}-param-reads",  # what each stage read (tests/unit/test_dvc_params.py)
           "DVC_NO_ANALYTICS": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    cmd = [sys.executable, "-m", "dvc", *args] if args[0] != "git" else list(args)
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def ran(proc: subprocess.CompletedProcess) -> set[str]:
    """The stages a dvc command ran, read from its log."""
    return {line.split("'")[1] for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("Running stage '")}


def build_lab(repo: Path) -> None:
    """A scratch lab with the micro params, committed, reproduced once and committed again."""
    copy_sources(repo, COPY)
    (repo / "stages" / "__init__.py").touch()
    (repo / "corpus.txt").write_text((ROOT / "data/corpus/python_docs.txt").read_text()[:60_000])
    (repo / "params.yaml").write_text(yaml.safe_dump(pipeline_params(), sort_keys=False))
    (repo / ".sitecustomize").mkdir()
    (repo / ".sitecustomize" / "sitecustomize.py").write_text(NO_NETWORK)
    (repo / ".gitignore").write_text(".sitecustomize/\nnetwork.log\n__pycache__/\n")
    sh(repo, "git", "init", "-q")
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", "lab")
    first = sh(repo, "repro")
    (repo / "first_repro.log").write_text(first.stdout)
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", "first run")


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One lab for the module's tests; tests/conftest.py puts them first, so that one worker runs them all."""
    lab = tmp_path_factory.mktemp("lab")
    build_lab(lab)
    return lab


def test_repro_produces_every_declared_output(repo: Path) -> None:
    variants = list(pipeline_params()["variants"])
    expected = ["metrics/env.json", "data/prepared/train.bin", "data/prepared/val.bin", "data/prepared/meta.json",
                "data/prepared/tokenizer.json", "checkpoints/model.pt", "metrics/train.json", "metrics/records/train.json",
                "plots/train_steps.csv",
                "metrics/eval.json", "metrics/summary.json", "metrics/summary.md", "plots/summary.csv",
                "plots/summary/throughput.png", "plots/summary/memory.png", "plots/summary/step_times.png",
                "plots/summary/loss_curves.png"]
    expected += [f"plots/profiles/{v}_{kind}" for v in pipeline_params()["profile"]["variants"]
                 for kind in ("kernels.md", "trace.json.gz")]
    expected += [f"metrics/variants/{v}.json" for v in variants] + [f"plots/steps/{v}.csv" for v in variants]
    expected += [f"{folder}/{name}.{ext}" for name in ("reference-seeds", "ckpt_full")
                 for folder, ext in (("metrics/parity", "json"), ("plots/parity", "csv"))] + ["metrics/report.md"]
    missing = [p for p in expected if not (repo / p).is_file()]
    assert not missing
    parity = json.loads((repo / "metrics/parity/ckpt_full.json").read_text())
    assert parity["reference"] == "fp32_baseline" and parity["steps"] == 6 and parity["learns_same"] is True
    report = (repo / "metrics/report.md").read_text()
    assert "## Does it learn the same? (parity)" in report and "No parity records" not in report


def test_each_stage_lists_exactly_the_params_it_read(repo: Path) -> None:
    check_reads(Path(f"{repo}-param-reads"))


def test_stages_hand_each_other_what_they_read(repo: Path) -> None:
    summary = json.loads((repo / "metrics/summary.json").read_text())
    for name in pipeline_params()["variants"]:
        variant = json.loads((repo / f"metrics/variants/{name}.json").read_text())
        assert (f"{name}.tokens_per_sec" in summary) == (variant["status"] == "ok")
        if variant["status"] == "ok":
            assert summary[f"{name}.tokens_per_sec"] == variant["tokens_per_sec"]
            assert variant["provenance.source_sha256"] and variant["provenance.tree_clean"] is True
    assert json.loads((repo / "metrics/variants/fp16.json").read_text())["status"] == "skipped"
    assert summary["fp32_baseline.speedup_x"] == 1.0
    assert all(isinstance(v, (int, float)) for v in summary.values())  # DVC compares numbers, not env strings
    train = json.loads((repo / "metrics/train.json").read_text())
    assert all(isinstance(v, (int, float)) for v in train.values())
    record = json.loads((repo / "metrics/records/train.json").read_text())
    assert record["tokens_per_sec"] == train["tokens_per_sec"] and record["env.torch"]
    evaluation = json.loads((repo / "metrics/eval.json").read_text())
    assert abs(train["val_loss"] - evaluation["val_loss"]) < 1e-6  # same model, same batches, both fp32
    assert "| recipe " in (repo / "metrics/summary.md").read_text()


def test_second_repro_reruns_only_the_environment_check(repo: Path) -> None:
    again = sh(repo, "repro")
    assert ran(again) == {"env", "check_corpus"}  # the two stages that run on every repro, and nothing else
    assert sh(repo, "status").stdout.split() == ["env:", "always", "changed", "check_corpus:", "always", "changed"]


def test_changing_one_variant_reruns_only_it_and_the_aggregate(repo: Path) -> None:
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["variants"]["bf16"]["optimizer"] = "adamw_fused"
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        stale = set(json.loads(sh(repo, "status", "--json").stdout))
        assert stale == {"env", "check_corpus", "bench@bf16", "aggregate"}
    finally:
        sh(repo, "git", "checkout", "--", "params.yaml")


def test_plots_render(repo: Path) -> None:
    # .dvc/config names the offline page template, which lives beside it.
    shutil.copytree(ROOT / ".dvc" / "plots", repo / ".dvc" / "plots", dirs_exist_ok=True)
    sh(repo, "plots", "show", "-o", "rendered")
    html = (repo / "rendered" / "index.html").read_text()
    assert "cdn.jsdelivr.net" not in html and "vegaEmbed(" in html  # vega inlined, not fetched
    assert "loss_curves.png" in html or "loss_curves" in html
    assert "plots/steps/recipe.csv" in html


def test_no_stage_opened_a_network_connection(repo: Path) -> None:
    assert "Running stage 'bench@recipe'" in (repo / "first_repro.log").read_text()
    log = repo / "network.log"
    assert not log.exists() or log.read_text() == ""
    # The positive control: the same guard in the same environment does catch a connection.
    probe = "import socket\ntry:\n    socket.create_connection(('192.0.2.1', 9), timeout=1)\nexcept OSError:\n    pass\n"
    env = {**os.environ, "PYTHONPATH": str(repo / ".sitecustomize"), "NETWORK_LOG": str(repo / "probe.log")}
    subprocess.run([sys.executable, "-c", probe], env=env, check=True)
    assert "192.0.2.1" in (repo / "probe.log").read_text()


def test_experiment_with_bf16_reruns_train_and_evaluate_and_diffs(repo: Path) -> None:
    exp = sh(repo, "exp", "run", "-S", "precision=bf16")
    assert ran(exp) == {"env", "check_corpus", "train", "evaluate"}
    diff = sh(repo, "metrics", "diff", "--json").stdout
    changed = json.loads(diff)["metrics/train.json"]
    assert "tokens_per_sec" in changed and "val_loss" in changed
    assert json.loads((repo / "metrics/records/train.json").read_text())["precision"] == "bf16"
    shown = sh(repo, "exp", "show", "--json").stdout
    assert "bf16" in shown
    sh(repo, "checkout", "--force")
    sh(repo, "git", "checkout", "--", ".")


def _hostile_params(repo: Path) -> None:
    params = yaml.safe_load((repo / "params.yaml").read_text())
    for name in EVIL_NAMES:
        params["variants"][name] = {}
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


@pytest.mark.parametrize("how", ["repro", "repro -s", "repro target", "exp run -S", "exp run --queue", "exp apply"])
def test_no_variant_name_reaches_a_shell(repo: Path, how: str) -> None:
    # Someone else's params.yaml, with names that quote, chain, substitute and break lines.
    _hostile_params(repo)
    try:
        if how == "repro":
            assert sh(repo, "repro", check=False).returncode != 0
        elif how in ("repro -s", "repro target"):
            for name in EVIL_NAMES:
                args = ["repro", "-s", f"bench@{name}"] if how == "repro -s" else ["repro", f"bench@{name}"]
                sh(repo, *args, check=False)  # fails: DVC cannot find or run such a stage, or bench refuses it
        elif how == "exp run -S":
            assert sh(repo, "exp", "run", "-S", "aggregate.loss_tolerance=0.2", check=False).returncode != 0
        elif how == "exp run --queue":
            sh(repo, "exp", "run", "--queue", "-S", "aggregate.loss_tolerance=0.3", check=False)
            sh(repo, "queue", "start", "-j", "1", check=False)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and any(
                    word in sh(repo, "queue", "status", check=False).stdout for word in ("Queued", "Running")):
                time.sleep(2)
            sh(repo, "queue", "stop", "--kill", check=False)  # the worker must not outlive the test
        else:
            sh(repo, "git", "add", "params.yaml")
            sh(repo, "git", "commit", "-qm", "someone else's experiment")
            sh(repo, "exp", "apply", "HEAD", check=False)
            assert sh(repo, "repro", check=False).returncode != 0
            sh(repo, "git", "reset", "-q", "--hard", "HEAD~1")
        assert not (repo / "PWNED").exists()
        assert not any(p.name == "PWNED" for p in repo.parent.rglob("PWNED"))  # nor in DVC's temp workspaces
    finally:
        sh(repo, "git", "checkout", "--", "params.yaml")


TRAIN_OUTPUTS = ("checkpoints/model.pt", "metrics/train.json", "metrics/records/train.json", "plots/train_steps.csv")


def test_killed_training_is_redone_by_the_next_repro(repo: Path) -> None:
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"]["steps"] = 150  # long enough to be killed mid-run
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONUNBUFFERED": "1"}
    earlier = {name: (repo / name).read_bytes() for name in TRAIN_OUTPUTS}
    proc = start_training(repo, env)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # the earlier run's outputs, byte for byte (issue 53: DVC deleted them first); the lock still says they are stale
    assert {name: (repo / name).read_bytes() for name in TRAIN_OUTPUTS} == earlier
    assert "train" in sh(repo, "status").stdout
    redo = sh(repo, "repro", "train")
    assert "train" in ran(redo)
    assert (repo / "checkpoints/model.pt").is_file()
    assert json.loads((repo / "metrics/records/train.json").read_text())["status"] == "ok"
    assert sh(repo, "status", "train").returncode == 0
    sh(repo, "git", "checkout", "--", "params.yaml")


def start_training(repo: Path, env: dict) -> subprocess.Popen:
    """`dvc repro train` in its own session, returned once the stage has begun training."""
    proc = subprocess.Popen([sys.executable, "-m", "dvc", "repro", "train"], cwd=repo, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("train: model="):
            break
    return proc


def _processes_in(folder: Path, marker: str) -> list[int]:
    """PIDs of live processes whose command line holds `marker` and whose working folder is `folder`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "cmdline").read_bytes().decode(errors="replace") \
                    and Path(os.readlink(proc / "cwd")) == folder:
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_killing_only_dvc_stops_the_stage_and_it_never_writes(repo: Path) -> None:
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"]["steps"] = 4000
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONUNBUFFERED": "1"}
    earlier = {name: (repo / name).read_bytes() for name in TRAIN_OUTPUTS}
    proc = start_training(repo, env)
    try:
        assert _processes_in(repo, "stages.train"), "the stage should be running"
        os.kill(proc.pid, signal.SIGKILL)  # dvc alone: its shell and the stage live on unless they notice
        proc.wait()
        deadline = time.monotonic() + 20
        while _processes_in(repo, "stages.train") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _processes_in(repo, "stages.train"), "the stage outlived dvc"
        assert {name: (repo / name).read_bytes() for name in TRAIN_OUTPUTS} == earlier  # nothing written after
    finally:
        for pid in _processes_in(repo, "stages.train"):
            os.kill(pid, signal.SIGKILL)
        sh(repo, "git", "checkout", "--", "params.yaml")
        sh(repo, "checkout", "--force", check=False)
