"""Data parallelism without ranks: its knobs, its wrappers (DDP, FSDP2) around stand-ins, and its scaling figures.
Two gloo ranks under torchrun against one process are in tests/integration/test_distributed.py."""

import shutil
import types
from pathlib import Path

import pytest
import torch
import yaml

from benchlab.analysis.scaling import scaling
from benchlab.core.errors import LabError
from benchlab.core.knobs import unsupported_reason
from benchlab.core.params import RunSettings, parse_params
from benchlab.core.skips import DeviceFacts
from benchlab.core.stage_main import run_main
from benchlab.run import dist
from stages import env
from tests.conftest import ROOT, micro_params


def write_params(root: Path, variants: dict, **overrides: object) -> None:
    data = micro_params(data__corpus="corpus.txt", **overrides)
    data["variants"] = {"fp32_baseline": {}, **variants}
    data["profile"]["variants"] = []
    (root / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.fixture()
def dist_workdir(workdir: Path, prepared: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The workdir with tokens, where torchrun's ranks can import the project and take the CPU lock."""
    shutil.copytree(prepared, workdir / "prep")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("BENCHLAB_LOCK_DIR", str(workdir))
    # The stage's git status (provenance) runs in the checkout, in this process and in the ranks: reading only.
    monkeypatch.setenv("GIT_OPTIONAL_LOCKS", "0")
    return workdir


# --- knobs and combinations (fast) ---

def test_parallel_none_takes_one_process_and_says_which_key() -> None:
    data = micro_params()
    data["variants"]["odd"] = {"nproc": 2}
    with pytest.raises(LabError, match=r"variants.odd.nproc=2 is not valid; expected 1 with parallel=none"):
        parse_params(data)
    data["variants"]["odd"] = {"parallel": "ddp", "nproc": 3}  # 3 ranks cannot split the batch of 4
    with pytest.raises(LabError, match=r"variants.odd.nproc=3 is not valid; .*divides the global batch size 4"):
        parse_params(data)
    data["variants"]["odd"] = {"parallel": "ddp", "fsdp_param_dtype": "bf16"}
    with pytest.raises(LabError, match=r"variants.odd.parallel='ddp' is not valid; expected fsdp2 when"):
        parse_params(data)
    data["variants"]["odd"] = {"parallel": "fsdp2", "ddp_comm_hook": "bf16"}
    with pytest.raises(LabError, match=r"^variants.odd.parallel='fsdp2' is not valid; expected ddp when ddp_bucket_mb, "
                                       r"ddp_grad_as_bucket_view or ddp_comm_hook is set$"):
        parse_params(data)


def test_more_ranks_than_gpus_or_cores_is_skipped_with_the_reason() -> None:
    two = RunSettings(parallel="ddp", nproc=2)
    gpu = DeviceFacts(kind="cuda", name="H200", capability=(9, 0), bf16=True, gpu_count=1)
    assert unsupported_reason(two, gpu) == "nproc=2 asks for 2 GPUs per node; this machine has 1"
    assert unsupported_reason(two, DeviceFacts(kind="cuda", capability=(9, 0), gpu_count=2)) is None
    assert "of 1 cores" in unsupported_reason(two, DeviceFacts(kind="cpu", cpu_count=1))
    assert unsupported_reason(two, DeviceFacts(kind="cpu", cpu_count=2)) is None


def test_a_wrong_nproc_gets_the_one_line_error(dist_workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_params(dist_workdir, {"bad": {"parallel": "fsdp2", "nproc": 0}})
    with pytest.raises(SystemExit) as exit_info:
        run_main(env.main, ["metrics/env.json"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "error: variants.bad.nproc=0 is not valid; expected 1 or more", err
    assert not (dist_workdir / "metrics" / "env.json").exists()


def test_scaling_efficiency_and_loss_gap_against_one_process() -> None:
    one = {"variant": "one", "status": "ok", "batch_size": 16, "tokens_per_sec": 100.0, "val_loss": 3.0}
    one_32 = {**one, "variant": "one_32", "batch_size": 32, "tokens_per_sec": 110.0, "val_loss": 2.9}
    two = {**one, "variant": "two", "parallel": "ddp", "nproc": 2, "world_size": 2, "batch_size": 32,
           "tokens_per_sec": 190.0, "val_loss": 2.91}
    out = scaling(two, [one, one_32, two])
    assert out["scaling_efficiency_pct"] == pytest.approx(95.0)  # against 16 per rank on one process
    assert out["scaling_ref"] == "one (same per-rank batch)"
    assert out["val_loss_gap_1proc"] == pytest.approx(0.01)  # against the same global batch
    assert scaling(one, [one, two])["scaling_efficiency_pct"] is None


class _FakeDDP:
    """Stands in for DistributedDataParallel (whose bf16 hook needs NCCL): records what it was given."""

    def __init__(self, module: torch.nn.Module, **kwargs: object) -> None:
        self.module, self.kwargs, self.hooks = module, kwargs, []

    def register_comm_hook(self, state: object, hook: object) -> None:
        self.hooks.append((state, hook))


@pytest.mark.parametrize("hook", ["none", "bf16"])
def test_ddp_wraps_with_the_run_s_buckets_and_comm_hook(hook: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

    from benchlab.run.apply_knobs import ddp

    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", _FakeDDP)
    settings = RunSettings(parallel="ddp", nproc=2, ddp_bucket_mb=100, ddp_grad_as_bucket_view=True, ddp_comm_hook=hook)
    module = torch.nn.Linear(2, 2)
    wrapped = ddp(settings, torch.device("cpu"))(module)
    assert wrapped.module is module
    assert wrapped.kwargs == {"device_ids": None, "bucket_cap_mb": 100, "gradient_as_bucket_view": True,
                              "broadcast_buffers": False}
    assert wrapped.hooks == ([(None, bf16_compress_hook)] if hook == "bf16" else [])


def test_fsdp2_compiles_each_block_inside_its_hooks_and_the_head_apart() -> None:
    """Compiled from outside, FSDP2's hooks broke the graph at every block (two H200s: 39% of DDP's tokens/s)."""
    from benchlab.run.apply_knobs import compile_blocks, wrapper
    from model.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    settings = RunSettings(parallel="fsdp2", nproc=2, compile=True)
    compile_blocks(model, settings)
    assert all(hasattr(block.forward, "_torchdynamo_orig_callable") for block in model.blocks)
    assert not hasattr(model.forward, "_torchdynamo_orig_callable")
    assert "blocks.0.attn.qkv.weight" in model.state_dict()  # keys as saved without compile
    assert wrapper(settings, torch.device("cpu"))(model) is model  # nothing compiled around the hooks
    ddp_compiled = wrapper(RunSettings(parallel="none", compile=True), torch.device("cpu"))(model)
    assert ddp_compiled is not model  # elsewhere compile still wraps the loss head's module


@pytest.mark.parametrize("per_unit, units", [(1, [[0], [1], [2], [3], [4]]), (2, [[0, 1], [2, 3], [4]]), (0, [])])
def test_fsdp2_shards_the_blocks_in_units_of_the_chosen_size(per_unit: int, units: list,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from benchlab.run.apply_knobs import shard
    from model.gpt import GPT, GPTConfig

    sharded: list = []
    monkeypatch.setattr("torch.distributed.fsdp.fully_shard", lambda module, **kwargs: sharded.append(module))
    monkeypatch.setattr("torch.distributed.fsdp.register_fsdp_forward_method", lambda module, name: None)
    monkeypatch.setattr("torch.distributed.device_mesh.init_device_mesh", lambda *args, **kwargs: None)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    model = GPT(GPTConfig(n_layer=5, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    shard(model, RunSettings(parallel="fsdp2", nproc=2, fsdp_blocks_per_unit=per_unit), torch.device("cpu"))
    index = {id(block): i for i, block in enumerate(model.blocks)}
    *blocks, root = sharded
    assert root is model  # the root unit last, around everything
    assert [[index[id(m)] for m in (unit if isinstance(unit, list) else [unit])] for unit in blocks] == units
    assert [isinstance(unit, torch.nn.Module) for unit in blocks] == [len(u) == 1 for u in units]  # one: as itself


@pytest.mark.parametrize("loss, compile, head_compiled", [
    ("standard", True, True), ("inline", True, True), ("standard", False, None), ("chunked", True, None)])
def test_fsdp2_compiles_the_standard_and_inline_heads_apart_from_the_body(
        loss: str, compile: bool, head_compiled: bool | None, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchlab.core.sections import OptimParams
    from benchlab.run.apply_knobs import apply
    from benchlab.run.heads.standard import BodyThenHead
    from model.gpt import GPT, GPTConfig

    monkeypatch.setattr("benchlab.run.apply_knobs.shard", lambda model, settings, device: None)  # no process group here
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    run = apply(model, RunSettings(parallel="fsdp2", nproc=2, compile=compile, loss=loss), torch.device("cpu"),
                OptimParams())
    if head_compiled is None:
        assert not isinstance(run.loss, BodyThenHead)
    else:
        assert isinstance(run.loss, BodyThenHead) and run.loss.kind == loss
        assert isinstance(run.loss.head, torch._dynamo.eval_frame.OptimizedModule)


@pytest.mark.parametrize("max_ctas", [0, 4])
def test_the_nccl_group_gets_the_thread_block_limit_only_when_one_is_set(max_ctas: int,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, dict]] = []

    class Options:  # the CPU build of torch has no ProcessGroupNCCL
        def __init__(self) -> None:
            self.config = types.SimpleNamespace(min_ctas=None, max_ctas=None)

    monkeypatch.setattr(dist.torch_dist, "ProcessGroupNCCL", types.SimpleNamespace(Options=Options), raising=False)
    monkeypatch.setattr(dist.torch_dist, "init_process_group", lambda backend, **kw: calls.append((backend, kw)))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert dist.init(torch.device("cuda"), max_ctas) == torch.device("cuda", 1)
    ((backend, kwargs),) = calls
    assert backend == "nccl" and kwargs["device_id"] == torch.device("cuda", 1)
    options = kwargs["pg_options"]
    if max_ctas:
        assert (options.config.min_ctas, options.config.max_ctas) == (1, max_ctas)
    else:
        assert options is None


@pytest.mark.parametrize(("knobs", "unit_sizes", "param_dtype"), [
    ({}, [1, 1, 1], None),
    ({"fsdp_blocks_per_unit": 2, "fsdp_param_dtype": "bf16", "fsdp_reshard_after_forward": False}, [2, 1], torch.bfloat16),
    ({"fsdp_blocks_per_unit": 0}, [], None)])
def test_fsdp2_shards_block_units_then_the_root_on_one_mesh_with_its_precision(
        monkeypatch: pytest.MonkeyPatch, knobs: dict, unit_sizes: list, param_dtype: torch.dtype | None) -> None:
    from benchlab.run import apply_knobs
    from model.gpt import GPT, GPTConfig

    calls: list = []
    mesh, policies = object(), []

    class Policy:
        def __init__(self, **kwargs: object) -> None:
            policies.append(kwargs)

    monkeypatch.setattr("torch.distributed.device_mesh.init_device_mesh", lambda *a, **k: calls.append(("mesh", a, k))
                        or mesh)
    monkeypatch.setattr("torch.distributed.fsdp.MixedPrecisionPolicy", Policy)
    monkeypatch.setattr("torch.distributed.fsdp.fully_shard", lambda module, **k: calls.append(("shard", module, k)))
    monkeypatch.setattr("torch.distributed.fsdp.register_fsdp_forward_method",
                        lambda module, name: calls.append(("method", module, name)))
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    model = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    settings = RunSettings(parallel="fsdp2", nproc=2, **knobs)
    apply_knobs.shard(model, settings, torch.device("cuda", 1))
    assert calls[0] == ("mesh", ("cuda", (2,)), {})
    assert policies == [{"param_dtype": param_dtype, "reduce_dtype": torch.float32}]
    policy = calls[-2][2]["mp_policy"]  # the root's, the last shard
    assert isinstance(policy, Policy)
    units = [c for c in calls[1:] if c[0] == "shard" and c[1] is not model]
    blocks = list(model.blocks)
    expected, i = [], 0
    for size in unit_sizes:
        expected.append(blocks[i] if size == 1 else blocks[i : i + size])
        i += size
    assert [u[1] for u in units] == expected
    assert all(u[2] == {"mesh": mesh, "mp_policy": policy, "reshard_after_forward": settings.fsdp_reshard_after_forward}
               for u in units)
    assert calls[-2:] == [("shard", model, {"mesh": mesh, "mp_policy": policy, "reshard_after_forward": False}),
                          ("method", model, "features")]


def test_ddp_on_a_gpu_names_its_card_and_on_a_cpu_none(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchlab.run import apply_knobs

    seen: list = []
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", lambda module, **kw: seen.append(kw["device_ids"]))
    wrap = apply_knobs.ddp(RunSettings(parallel="ddp", nproc=2), torch.device("cuda", 1))
    wrap(torch.nn.Linear(2, 2))
    apply_knobs.ddp(RunSettings(parallel="ddp", nproc=2), torch.device("cpu"))(torch.nn.Linear(2, 2))
    assert seen == [[1], None]


def test_a_parallel_run_needs_a_process_group_and_fsdp2_shards_the_model_it_was_given(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from benchlab.run import apply_knobs
    from model.gpt import GPT, GPTConfig

    model, gpu = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32)), torch.device("cuda", 1)
    fsdp2 = RunSettings(parallel="fsdp2", nproc=2)
    with pytest.raises(LabError) as err:
        apply_knobs.parallelize(model, fsdp2, gpu)
    assert str(err.value) == ("parallel=fsdp2 runs under torchrun (the bench stage starts it); this process joined no "
                              "process group")
    sharded: list = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(apply_knobs, "shard", lambda *args: sharded.append(args))
    apply_knobs.parallelize(model, fsdp2, gpu)
    apply_knobs.parallelize(model, RunSettings(parallel="ddp", nproc=2), gpu)  # DDP wraps later, in the loss head
    assert sharded == [(model, fsdp2, gpu)]
