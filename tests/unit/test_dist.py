"""benchlab/run/dist.py: which process is which rank, how torchrun is started, and which rank writes a stage's outputs.

The ranks' training itself (two gloo ranks against one process) is in tests/integration/test_distributed.py;
these tests need no second process, so a planted bug in a rank's identity or in who writes is caught in the
default selection.
"""

import contextlib
import sys
import types
from pathlib import Path

import pytest
import torch

from benchlab.core.errors import LabError
from benchlab.core.params import parse_params
from benchlab.run import dist, launch
from benchlab.run.runner import Measurement
from stages import profile
from tests.conftest import micro_params

RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
RDZV_VARS = ("BENCHLAB_NNODES", "BENCHLAB_RDZV_ENDPOINT", "BENCHLAB_RDZV_ID", "BENCHLAB_NODE_RANK")


@pytest.fixture()
def ranks(monkeypatch: pytest.MonkeyPatch):
    """Set this process's rank variables as torchrun would (`ranks(rank, world, local)`); none set before."""
    for name in (*RANK_VARS, *RDZV_VARS):
        monkeypatch.delenv(name, raising=False)

    def as_rank(rank: int, world: int, local: int) -> None:
        for name, value in zip(RANK_VARS, (rank, world, local)):
            monkeypatch.setenv(name, str(value))

    return as_rank


def test_outside_torchrun_a_process_is_rank_0_of_1_and_writes(ranks) -> None:
    assert not dist.launched()
    assert (dist.rank(), dist.world_size(), dist.local_rank()) == (0, 1, 0)
    assert dist.writes_record() is True
    assert dist.gather({"loss": 2.5}) == [{"loss": 2.5}]  # no process group: a list of one


@pytest.mark.parametrize("missing", RANK_VARS)
def test_torchrun_started_a_process_only_when_all_three_rank_variables_are_set(ranks, monkeypatch: pytest.MonkeyPatch,
                                                                                missing: str) -> None:
    ranks(3, 4, 1)
    assert dist.launched() is True
    assert (dist.rank(), dist.world_size(), dist.local_rank()) == (3, 4, 1)
    monkeypatch.delenv(missing)
    assert dist.launched() is False


@pytest.mark.parametrize(("rank", "world", "local", "writes"), [
    (0, 2, 0, True),    # one node: rank 0
    (1, 2, 1, False),   # one node: rank 1
    (2, 4, 0, True),    # the second node's first rank: its own file system gets the record too
    (3, 4, 1, False),
])
def test_the_first_rank_of_each_node_writes_the_record(ranks, rank: int, world: int, local: int, writes: bool) -> None:
    ranks(rank, world, local)
    assert dist.writes_record() is writes


def _one_repeat_as(ranks, rank: int, world: int, local: int, to: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """launch.one_repeat on this rank, its training and process group stood in for."""
    ranks(rank, world, local)
    monkeypatch.setattr(dist, "init", lambda device, max_ctas=0: device)
    monkeypatch.setattr(launch, "load_tokens", lambda data_dir: None)
    monkeypatch.setattr(launch, "train_variant", lambda *a, **k: Measurement(status="ok", losses=[2.0], step_ms=[5.0]))
    launch.one_repeat(parse_params(micro_params()), "fp32_baseline", "prep", to)


@pytest.mark.parametrize(("rank", "world", "local", "writes"), [(0, 2, 0, True), (1, 2, 1, False), (2, 4, 0, True)])
def test_a_repeat_s_record_is_written_by_each_node_s_first_rank_alone(ranks, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch, rank: int,
                                                                     world: int, local: int, writes: bool) -> None:
    to = tmp_path / "record.json"
    _one_repeat_as(ranks, rank, world, local, to, monkeypatch)
    assert to.exists() is writes
    if writes:
        assert Measurement.from_json(to.read_text()).losses == [2.0]


@pytest.mark.parametrize(("rank", "world", "local", "writes"), [(0, 2, 0, True), (1, 2, 1, False), (2, 4, 0, True)])
def test_a_profile_is_written_by_each_node_s_first_rank_alone(ranks, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             rank: int, world: int, local: int, writes: bool) -> None:
    ranks(rank, world, local)
    written: list[str] = []
    monkeypatch.setattr(dist, "init", lambda device, max_ctas=0: device)
    monkeypatch.setattr(profile, "load_tokens", lambda data_dir: None)
    monkeypatch.setattr(profile.profiling, "profiler", lambda *a: contextlib.nullcontext(types.SimpleNamespace(step=None)))
    monkeypatch.setattr(profile.launch, "train_variant", lambda *a, **k: Measurement(status="ok"))
    monkeypatch.setattr(profile.profiling, "write_profile", lambda prof, out, name, *a: written.append(name))
    profile.trace(parse_params(micro_params()), "fp32_baseline", "prep", tmp_path)
    assert written == (["fp32_baseline"] if writes else [])


def test_one_node_starts_torchrun_standalone(ranks) -> None:
    argv = dist.torchrun_argv(2, ["stages.bench", "--variant", "ddp_2"])
    assert argv == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=2",
                    "--max_restarts=0", "-m", "stages.bench", "--variant", "ddp_2"]


def test_several_nodes_meet_at_the_rendezvous(ranks, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCHLAB_NNODES", "2")
    with pytest.raises(LabError, match=r"^BENCHLAB_NNODES=2 needs BENCHLAB_RDZV_ENDPOINT=host:port, the same on every node$"):
        dist.torchrun_argv(4, ["stages.bench"])
    monkeypatch.setenv("BENCHLAB_RDZV_ENDPOINT", "node0:29400")
    assert dist.torchrun_argv(4, ["stages.bench"])[3:8] == [
        "--nnodes=2", "--node_rank=0", "--rdzv_backend=c10d", "--rdzv_endpoint=node0:29400", "--rdzv_id=benchlab"]
    monkeypatch.setenv("BENCHLAB_NODE_RANK", "1")
    monkeypatch.setenv("BENCHLAB_RDZV_ID", "job7")
    argv = dist.torchrun_argv(4, ["stages.bench"])
    assert argv[3:] == ["--nnodes=2", "--node_rank=1", "--rdzv_backend=c10d", "--rdzv_endpoint=node0:29400",
                        "--rdzv_id=job7", "--nproc_per_node=4", "--max_restarts=0", "-m", "stages.bench"]


@pytest.mark.parametrize("text", ["0", "-1", "two", "", "1.5"])
def test_a_node_count_that_is_not_a_positive_integer_is_refused(ranks, monkeypatch: pytest.MonkeyPatch,
                                                                text: str) -> None:
    monkeypatch.setenv("BENCHLAB_NNODES", text)
    with pytest.raises(LabError) as err:
        dist.nnodes()
    assert str(err.value) == f"BENCHLAB_NNODES={text!r} is not valid; expected a positive integer"


def test_a_node_count_is_read_from_the_environment(ranks, monkeypatch: pytest.MonkeyPatch) -> None:
    assert dist.nnodes() == 1
    monkeypatch.setenv("BENCHLAB_NNODES", "3")
    assert dist.nnodes() == 3


def test_a_cpu_rank_joins_a_gloo_group_gathers_in_rank_order_and_leaves(ranks, monkeypatch: pytest.MonkeyPatch) -> None:
    ranks(0, 1, 0)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "0")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    assert not dist.active()
    try:
        assert dist.init(torch.device("cpu")) == torch.device("cpu")
        assert dist.active() and dist.torch_dist.get_backend() == "gloo"
        assert dist.torch_dist.get_world_size() == 1
        assert dist.gather({"rank": 0}) == [{"rank": 0}]
    finally:
        dist.teardown()
    assert not dist.active()
    dist.teardown()  # no group: nothing to leave
