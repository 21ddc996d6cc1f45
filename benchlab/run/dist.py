"""Data-parallel runs on PyTorch's own engine: torchrun starts the ranks, torch.distributed joins them.

A stage that runs a `parallel` variant starts `python -m torch.distributed.run`
(torchrun) with the same stage module in its repeat mode (`torchrun_argv`);
torchrun sets RANK, WORLD_SIZE and LOCAL_RANK, and each rank joins the process
group here (`init`): NCCL on CUDA, gloo on a CPU. There is no launcher of ours:
benchlab/run/launch.py only starts torchrun and reads back what the ranks wrote.

Across machines the same stage runs on every node with the environment below,
and torchrun's c10d rendezvous makes one job of them (docs/parallelism.md):
  BENCHLAB_NNODES          nodes in the job (default 1: `--standalone`)
  BENCHLAB_RDZV_ENDPOINT   host:port of the rendezvous, reachable from every node
  BENCHLAB_RDZV_ID         the job's id, the same on every node (default benchlab)
  BENCHLAB_NODE_RANK       this node's rank (default 0; c10d may assign ranks in join order)
"""

import os
import sys
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as torch_dist

from benchlab.core.errors import LabError

# A rank that dies leaves the others waiting in a collective; torchrun stops
# them when it sees the death, and this bounds the wait if it cannot.
TIMEOUT = timedelta(minutes=10)


def launched() -> bool:
    """Whether torchrun started this process (it sets the rank variables)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def nnodes() -> int:
    """Nodes the next launch spans, from BENCHLAB_NNODES."""
    text = os.environ.get("BENCHLAB_NNODES", "1")
    if not text.isdigit() or int(text) < 1:
        raise LabError(f"BENCHLAB_NNODES={text!r} is not valid; expected a positive integer")
    return int(text)


def torchrun_argv(nproc: int, module_args: list[str]) -> list[str]:
    """The argument list that runs `python -m <module_args>` on `nproc` ranks per node under torchrun."""
    nodes = nnodes()
    if nodes == 1:
        where = ["--standalone", "--nnodes=1"]
    else:
        endpoint = os.environ.get("BENCHLAB_RDZV_ENDPOINT")
        if not endpoint:
            raise LabError(f"BENCHLAB_NNODES={nodes} needs BENCHLAB_RDZV_ENDPOINT=host:port, the same on every node")
        where = [f"--nnodes={nodes}", f"--node_rank={os.environ.get('BENCHLAB_NODE_RANK', '0')}",
                 "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}",
                 f"--rdzv_id={os.environ.get('BENCHLAB_RDZV_ID', 'benchlab')}"]
    return [sys.executable, "-m", "torch.distributed.run", *where, f"--nproc_per_node={nproc}",
            "--max_restarts=0", "-m", *module_args]


def init(device: torch.device, max_ctas: int = 0) -> torch.device:
    """Join the process group torchrun set up; returns this rank's device (cuda:LOCAL_RANK on a GPU).

    `max_ctas` (knob nccl_max_ctas) caps the thread blocks of each NCCL collective; 0 leaves NCCL's choice."""
    if device.type == "cuda":
        device = torch.device("cuda", local_rank())
        torch.cuda.set_device(device)
        options = None
        if max_ctas:
            options = torch_dist.ProcessGroupNCCL.Options()
            options.config.min_ctas = 1
            options.config.max_ctas = max_ctas
        torch_dist.init_process_group("nccl", timeout=TIMEOUT, device_id=device, pg_options=options)
    else:
        torch_dist.init_process_group("gloo", timeout=TIMEOUT)
    return device


def teardown() -> None:
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()


def active() -> bool:
    """Whether this process is one rank of a process group."""
    return torch_dist.is_available() and torch_dist.is_initialized()


def gather(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank (a plain list of one when not distributed)."""
    if not active():
        return [obj]
    out: list[Any] = [None] * torch_dist.get_world_size()
    torch_dist.all_gather_object(out, obj)
    return out


def writes_record() -> bool:
    """Whether this rank writes the run's record: the first rank of each node (one writer per file system).

    On one node that is rank 0 alone; on several, each node's parent stage gets the same gathered record.
    """
    return local_rank() == 0
