"""Faults met through DVC as a user meets them: an added variant, a stop while another run finishes, a corpus
holding a device, and `dvc` itself killed.

One small lab (env and prepare reproduced, committed) serves the module; each test puts back what it changed.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, copy_sources, micro_params
from tests.integration.test_faults import ENDS_WITHIN_S
from tests.integration.test_pipeline import COPY, _processes_in, start_training

pytestmark = pytest.mark.integration  # each test runs `dvc`, and torch in its stages: seconds each
TIMEOUT_S = 300  # a hang fails the test instead of the suite


def lab_params() -> dict:
    """The micro params with one variant, nothing profiled and the corpus a folder, as a user's own data."""
    data = micro_params(data__corpus="corpus")
    data["variants"] = {"fp32_baseline": data["variants"]["fp32_baseline"]}
    data["profile"]["variants"] = []
    if "parity" in data:
        data["parity"].update(reference="fp32_baseline", variants=[])
    return data


def env_of(repo: Path) -> dict:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONUNBUFFERED": "1",
            "DVC_NO_ANALYTICS": "1", "BENCHLAB_LOCK_DIR": str(repo / ".locks"), "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def run(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`dvc ARGS` (or `git ...`) in the lab, as a user types it, never hanging past TIMEOUT_S."""
    cmd = list(args) if args[0] == "git" else [sys.executable, "-m", "dvc", *args]
    proc = subprocess.run(cmd, cwd=repo, env=env_of(repo), capture_output=True, text=True, timeout=TIMEOUT_S)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def set_params(repo: Path, data: dict) -> None:
    (repo / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("faultlab")
    copy_sources(repo, COPY)
    (repo / "corpus").mkdir()
    (repo / "corpus" / "docs.txt").write_text((ROOT / "data/corpus/python_docs.txt").read_text()[:60_000])
    set_params(repo, lab_params())
    (repo / ".locks").mkdir()
    (repo / ".gitignore").write_text("__pycache__/\n.locks/\n")
    run(repo, "git", "init", "-q")
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "lab")
    run(repo, "repro", "prepare")
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "prepared")
    return repo


def test_an_added_variant_counts_as_committed_code(lab: Path) -> None:
    """README's way to add a variant: params.yaml only. DVC tracks params; only code counts as uncommitted."""
    data = lab_params()
    data["variants"]["sdpa_fused"] = {"attention": "sdpa", "optimizer": "adamw_fused"}
    set_params(lab, data)
    record = lab / "metrics/variants/sdpa_fused.json"
    try:
        run(lab, "repro", "bench@sdpa_fused")
        assert json.loads(record.read_text())["provenance.tree_clean"] is True
        with (lab / "benchlab/core/stats.py").open("a") as f:  # a change to code the stage runs does count
            f.write("# an uncommitted edit\n")
        run(lab, "repro", "bench@sdpa_fused")
        assert json.loads(record.read_text())["provenance.tree_clean"] is False
    finally:
        run(lab, "git", "checkout", "--", "params.yaml", "dvc.lock", "benchlab/core/stats.py")


HOLDER = """
import json, sys, time, torch
from pathlib import Path
from benchlab.core import locks
# The first timing: holds the device, finishes its outputs when told, then exits and releases the device.
with locks.device_lock(torch.device("cpu"), "fail", "bench@fp32_baseline"):
    print("held", flush=True)
    sys.stdin.readline()
    Path("metrics/variants").mkdir(parents=True, exist_ok=True)
    Path("plots/steps").mkdir(parents=True, exist_ok=True)
    Path("metrics/variants/fp32_baseline.json").write_text(json.dumps({"run": "first"}))
    Path("plots/steps/fp32_baseline.csv").write_text("step,loss\\n0,first\\n")
print("written", flush=True)
"""


def test_stopping_a_waiting_timing_keeps_the_other_runs_result(lab: Path) -> None:
    data = lab_params()
    data["bench"]["steps"] = 100_000  # the second run is still timing when it is stopped
    set_params(lab, data)
    env = {**env_of(lab), "PYTHONPATH": str(lab)}
    first = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=lab, env=env, text=True, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    second = None
    try:
        assert first.stdout is not None and first.stdin is not None and first.stdout.readline().strip() == "held"
        second = subprocess.Popen([sys.executable, "-m", "dvc", "repro", "bench@fp32_baseline"], cwd=lab, env=env,
                                  text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        assert second.stdout is not None
        for line in second.stdout:
            if "waiting for pid" in line:
                break
        first.stdin.write("finish\n")
        first.stdin.flush()
        assert first.stdout.readline().strip() == "written" and first.wait(timeout=60) == 0
        time.sleep(2.0)  # the second now holds the device and trains
        os.killpg(second.pid, signal.SIGINT)  # Ctrl-C in its terminal
        out = second.communicate(timeout=60)[0]
        assert second.returncode != 0 and "stopped by the user" in out, out
        assert json.loads((lab / "metrics/variants/fp32_baseline.json").read_text()) == {"run": "first"}
        assert (lab / "plots/steps/fp32_baseline.csv").read_text().endswith("0,first\n")
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        run(lab, "git", "checkout", "--", "params.yaml")


def _link(target: str):
    return lambda path: path.symlink_to(target)


def _socket(path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()  # the socket file stays


@pytest.mark.parametrize("kind, make, command", [
    ("a character device (a link to /dev/zero)", _link("/dev/zero"), ["repro"]),
    ("a character device (a link to /dev/urandom)", _link("/dev/urandom"), ["exp", "run"]),
    ("a FIFO (named pipe)", os.mkfifo, ["repro"]),
    ("a socket", _socket, ["repro"]),
], ids=["dev-zero", "dev-urandom", "fifo", "socket"])
def test_a_special_file_in_the_corpus_is_refused_before_dvc_reads_it(lab: Path, kind: str, make, command: list[str]) -> None:
    special = lab / "corpus" / "extra.txt"
    make(special)
    try:
        proc = run(lab, *command, check=False)  # before the fix: hangs, and the timeout fails the test
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, out
        assert f"holds corpus/extra.txt, {kind}" in out and "remove it (rm corpus/extra.txt)" in out, out
        assert "Running stage 'prepare'" not in out and "Traceback" not in out
    finally:
        special.unlink()
        run(lab, "exp", "remove", "--all", check=False)


def training(lab: Path, steps: int) -> tuple[subprocess.Popen, dict]:
    """`dvc repro train` of `steps` steps, returned once it trains, with the params it was started with."""
    data = lab_params()
    data["train"]["steps"] = steps
    set_params(lab, data)
    return start_training(lab, env_of(lab)), data


def test_killing_dvc_names_the_cause_and_the_stage_ends_within_three_seconds(lab: Path) -> None:
    """README: 'Killing `dvc` alone stops its stage within three seconds, naming the cause' (and nothing is written
    after)."""
    proc, _ = training(lab, 100_000)
    try:
        assert proc.stdout is not None
        time.sleep(2.0)  # training
        assert _processes_in(lab, "stages.train"), "the stage should be running"
        os.kill(proc.pid, signal.SIGKILL)  # dvc alone
        killed = time.monotonic()
        proc.wait()
        while _processes_in(lab, "stages.train") and time.monotonic() - killed < 20:
            time.sleep(0.02)
        took = time.monotonic() - killed
        assert not _processes_in(lab, "stages.train"), "the stage outlived dvc"
        out = proc.stdout.read()  # the stage wrote to dvc's output, which this pipe still holds
        # a slow machine may not have finished a step yet; either way the cause is named
        assert "stopped because the process that started it (" in out, out
        assert ") died at step " in out or ") died before its first step; nothing recorded" in out, out
        assert "Traceback" not in out and "by the user" not in out, out
        assert took < ENDS_WITHIN_S, f"the stage took {took:.2f} s to end"
        assert not (lab / "checkpoints/model.pt").exists() and not (lab / "metrics/train.json").exists()
    finally:
        for pid in _processes_in(lab, "stages.train"):
            os.kill(pid, signal.SIGKILL)
        run(lab, "git", "checkout", "--", "params.yaml")


# ---------------------------------------------------------------- issue 53: nothing lost before it is replaced

KEPT = ["metrics/env.json", "data/prepared", "checkpoints/model.pt", "metrics/train.json", "metrics/records/train.json",
        "plots/train_steps.csv", "metrics/eval.json"]


def snapshot(repo: Path, names: list[str]) -> dict[str, bytes]:
    """Every file at or under `names`, byte for byte."""
    paths = [p for name in names for p in ([repo / name] if (repo / name).is_file() else (repo / name).rglob("*"))]
    return {str(p.relative_to(repo)): p.read_bytes() for p in sorted(paths) if p.is_file()}


def _bad_param(repo: Path) -> None:
    data = lab_params()
    data["optim"]["lr"] = -1.0
    set_params(repo, data)


def _fp16_on_cpu(repo: Path) -> None:
    data = lab_params()
    data["precision"] = "fp16"
    set_params(repo, data)


def _latin1_file(repo: Path) -> None:
    (repo / "corpus" / "zz-latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))


@pytest.mark.parametrize("breaker, command, message", [
    (_bad_param, "evaluate", "optim.lr=-1.0 is not valid"),  # env refuses it: metrics/env.json, tracked by git, stays
    (_fp16_on_cpu, "train", "precision=fp16 with loss scaling needs a CUDA GPU"),
    (_latin1_file, "prepare", "is not UTF-8 text"),  # found while prepare reads the corpus
], ids=["env refuses a param", "train refuses the device", "prepare finds the corpus bad"])
def test_a_refused_stage_under_dvc_keeps_every_earlier_output(lab: Path, breaker, command: str, message: str) -> None:
    """Issue 53: DVC deleted a stage's outputs before running it, so a refused run lost them (metrics/env.json, a
    file git tracks, with them; `dvc status` then listed every timing stage as changed)."""
    try:
        run(lab, "repro", "evaluate")
        before = snapshot(lab, KEPT)
        assert len(before) == 10, sorted(before)  # env, the prepared data (4 files), train's 4, eval
        breaker(lab)
        proc = run(lab, "repro", command, check=False)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and message in out and "Traceback" not in out, out
        assert snapshot(lab, KEPT) == before
        assert not [p for p in lab.rglob(".*") if any(m in p.name for m in (".tmp-", ".new-", ".old-"))]
        run(lab, "git", "checkout", "--", "params.yaml")
        (lab / "corpus" / "zz-latin1.txt").unlink(missing_ok=True)
        assert "metrics/env.json" not in run(lab, "status", "train").stdout  # the timing stages did not change
    finally:
        run(lab, "git", "checkout", "--", "params.yaml", "dvc.lock")  # the lock without train: DVC checks out no model
        (lab / "corpus" / "zz-latin1.txt").unlink(missing_ok=True)
        for name in KEPT[2:]:  # the module's other tests start with nothing trained
            (lab / name).unlink(missing_ok=True)


def exp_training(lab: Path, *args: str) -> subprocess.Popen:
    """`dvc exp run ARGS train` in its own session, returned once its stage has read its params and trains."""
    proc = subprocess.Popen([sys.executable, "-m", "dvc", "exp", "run", *args, "train"], cwd=lab, env=env_of(lab),
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    assert proc.stdout is not None
    began = next((line for line in proc.stdout if line.startswith("train: model=") or "ERROR" in line), "")
    assert began.startswith("train: model="), began
    return proc


def filed(lab: Path, name: str) -> tuple[dict, dict]:
    """The params.yaml and the train record that DVC filed under experiment `name`."""
    refs = run(lab, "git", "for-each-ref", "--format=%(refname)", "refs/exps").stdout.split()
    ref = next(r for r in refs if r.endswith(f"/{name}"))
    return (yaml.safe_load(run(lab, "git", "show", f"{ref}:params.yaml").stdout),
            json.loads(run(lab, "git", "show", f"{ref}:metrics/records/train.json").stdout))


def _end(proc: subprocess.Popen, lab: Path) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for pid in _processes_in(lab, "stages.train"):
        os.kill(pid, signal.SIGKILL)


def test_a_second_dvc_exp_run_in_the_workspace_is_refused_before_it_writes_and_the_first_is_filed(lab: Path) -> None:
    """Issue 53: `dvc exp run -n exp_tf32 -S precision=tf32` started while another ran trained with bf16: DVC lets go
    of its lock while a stage runs, so the second wrote its params.yaml under the first, and both failed. The stage
    now holds DVC's experiments lock, which DVC asks before it touches the workspace: the second is refused in a line
    naming --queue and --temp (a --temp one too, which would stash the workspace first), the first is filed."""
    # long enough to be still training when both others have been refused (CI saw 40 steps, half a second, end
    # before the second attempt began)
    first = exp_training(lab, "-n", "first", "-S", "train.steps=3000")
    try:
        for second in (["-n", "second"], ["--temp", "-n", "second_temp"]):
            proc = run(lab, "exp", "run", *second, "-S", "precision=bf16", "train", check=False)
            said = proc.stdout + proc.stderr
            assert proc.returncode != 0 and "'workspace' is busy" in said and "Traceback" not in said, said
            line = next(line for line in said.splitlines() if "(PID " in line)
            assert "stage train is running in this workspace" in line and "`dvc exp run --queue`" in line \
                and "`dvc exp run --temp`" in line, said
            assert yaml.safe_load((lab / "params.yaml").read_text())["precision"] == "fp32"  # nothing written
        out = first.communicate(timeout=300)[0]
        assert first.returncode == 0, out
        assert run(lab, "exp", "list", "--name-only").stdout.split() == ["first"]
        params, record = filed(lab, "first")
        assert (params["precision"], params["train"]["steps"]) == ("fp32", 3000)
        assert (record["precision"], record["steps"]) == ("fp32", 3000)  # what it ran is what it was started with
        assert yaml.safe_load((lab / "params.yaml").read_text()) == params
    finally:
        _end(first, lab)
        run(lab, "exp", "remove", "--all", check=False)
        run(lab, "git", "checkout", "--", "params.yaml", "dvc.lock")  # the lock without train: DVC checks out no model
        for name in KEPT[2:]:  # the module's other tests start with nothing trained
            (lab / name).unlink(missing_ok=True)


def test_dvc_exp_runs_with_temp_go_side_by_side_each_with_its_own_params(lab: Path) -> None:
    """Each --temp run's stages work in a copy under .dvc/tmp/exps and hold that copy's entry, not the workspace's."""
    first = exp_training(lab, "--temp", "-n", "t_first", "-S", "train.steps=60")
    try:
        second = run(lab, "exp", "run", "--temp", "-n", "t_second", "-S", "precision=bf16", "train", check=False)
        assert second.returncode == 0, second.stdout + second.stderr
        out = first.communicate(timeout=300)[0]
        assert first.returncode == 0, out
        for name, precision, steps in (("t_first", "fp32", 60), ("t_second", "bf16", lab_params()["train"]["steps"])):
            params, record = filed(lab, name)
            assert (params["precision"], params["train"]["steps"]) == (precision, steps) \
                == (record["precision"], record["steps"]), name
        assert run(lab, "git", "status", "--porcelain", "--", "params.yaml").stdout == ""  # the workspace's is as it was
    finally:
        _end(first, lab)
        run(lab, "exp", "remove", "--all", check=False)


def test_a_stage_whose_params_yaml_changed_while_it_ran_records_nothing(lab: Path) -> None:
    """The first of two runs: its stage read one params.yaml and DVC would file its result under another."""
    proc, data = training(lab, 400)  # long enough that the change lands before it ends, however loaded the machine
    try:
        data["precision"] = "bf16"  # what a second `dvc exp run -S precision=bf16` writes
        set_params(lab, data)
        out = proc.communicate(timeout=300)[0]
        assert proc.returncode != 0, out
        assert "error: params.yaml changed while train ran (another `dvc exp run` in this workspace?), so nothing " \
               "was recorded under params it did not run with; run experiments side by side with" in out, out
        assert not (lab / "checkpoints/model.pt").exists() and not (lab / "metrics/train.json").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        run(lab, "git", "checkout", "--", "params.yaml")
