"""harness.memory_cap_gib: a big GPU answers for a smaller card; bad caps get one-line errors; an OOM says where."""

import pytest
import torch

from benchlab.core.errors import LabError
from benchlab.core.params import RunSettings, parse_params
from benchlab.run import harness, runner
from benchlab.run.records import base_record, measured_record
from benchlab.run.runner import Measurement, oom_message, train_once
from model.gpt import GPTConfig
from tests.conftest import micro_params

GIB = 2**30
CUDA = torch.device("cuda", 0)


class FakeProps:
    total_memory = 141 * GIB


@pytest.fixture()
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> list:
    """torch.cuda's calls the cap makes, recorded instead of made (no GPU here)."""
    calls: list = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: FakeProps())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, device: calls.append((f, device)))
    return calls


def test_the_cap_becomes_the_fraction_of_the_card(fake_gpu: list) -> None:
    harness.cap_memory(CUDA, 24)
    assert fake_gpu == [(pytest.approx(24 / 141), 0)]


def test_no_cap_gives_the_whole_card_back(fake_gpu: list) -> None:
    harness.cap_memory(CUDA, 24)
    harness.cap_memory(CUDA, 0)  # a later run in the same process is not held to the earlier cap
    harness.cap_memory(torch.device("cpu"), 0)
    assert fake_gpu == [(pytest.approx(24 / 141), 0), (1.0, 0)]


def test_a_cap_above_the_card_is_refused(fake_gpu: list) -> None:
    with pytest.raises(LabError, match=r"harness.memory_cap_gib=160 is more than NVIDIA H200's 141.0 GiB; set at most 141.0"):
        harness.cap_memory(CUDA, 160)
    assert fake_gpu == []


def test_a_cap_on_a_cpu_is_refused(tokens) -> None:
    with pytest.raises(LabError, match=r"harness.memory_cap_gib=16 caps a GPU's memory, but this run is on the cpu; "
                                       r"set harness.memory_cap_gib=0"):
        harness.cap_memory(torch.device("cpu"), 16)
    p = parse_params(micro_params(harness__memory_cap_gib=16))
    with pytest.raises(LabError, match="harness.memory_cap_gib=16"):  # every stage's run applies it
        train_once(p, p.variants["fp32_baseline"], tokens, torch.device("cpu"), 4, 1)
    rec = train_once(p, p.variants["fp32_baseline"], tokens, torch.device("cpu"), 4, 1, memory_cap_gib=0.0)
    assert rec.status == "ok"  # parity's runs take no cap


def test_a_negative_cap_is_a_load_error() -> None:
    with pytest.raises(LabError, match=r"harness.memory_cap_gib=-1.0 is not valid; expected 0 \(no cap\)"):
        parse_params(micro_params(harness__memory_cap_gib=-1))


# torch's text for an allocation past the cap, as torch 2.11 gave it on an H200 under a 24 GiB cap (issue 43).
TORCH_OOM = ("CUDA out of memory. Tried to allocate 3.07 GiB. GPU 0 has a total capacity of 139.80 GiB of which "
             "117.17 GiB is free. Including non-PyTorch memory, this process has 22.62 GiB memory in use. 24.00 GiB "
             "allowed; Of the allocated memory 21.67 GiB is allocated by PyTorch, and 294.00 MiB is reserved by "
             "PyTorch but unallocated.\nIf reserved but unallocated memory is large try setting "
             "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
HELD = {"peak_mem_allocated_mb": 22_194.2, "peak_mem_reserved_mb": 22_488.0, "peak_rss_mb": None}


def test_an_oom_says_in_one_line_the_batch_the_cap_the_memory_held_and_what_was_asked() -> None:
    err = torch.OutOfMemoryError(TORCH_OOM)
    assert oom_message(16, 24, HELD, err) == (
        "out of memory at batch size 16 under a 24 GiB cap: 22,194 MiB allocated when 3.07 GiB more was asked for")
    assert oom_message(16, 0, HELD, err) == (  # no cap
        "out of memory at batch size 16: 22,194 MiB allocated when 3.07 GiB more was asked for")
    assert oom_message(8, 0.25, HELD, torch.OutOfMemoryError("Tried to allocate 20.00 MiB.")) == (
        "out of memory at batch size 8 under a 0.25 GiB cap: 22,194 MiB allocated when 20.00 MiB more was asked for")
    assert oom_message(8, 0.5, HELD, RuntimeError("out of memory\nsecond line")) == (
        "out of memory at batch size 8 under a 0.5 GiB cap: 22,194 MiB allocated")  # torch named no allocation
    assert oom_message(8, 24, {"peak_mem_allocated_mb": None}, err) == (
        "out of memory at batch size 8 under a 24 GiB cap: 3.07 GiB more was asked for")  # no reading of the memory
    assert oom_message(8, 0, {}, RuntimeError("x")) == "out of memory at batch size 8"


def test_an_oom_in_a_run_is_one_line_in_the_record_and_torchs_whole_text_in_the_log(
        params, tokens, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def out_of_memory(*args: object) -> None:
        raise torch.OutOfMemoryError(TORCH_OOM)

    monkeypatch.setattr(runner, "train_step", out_of_memory)
    rec = train_once(params, RunSettings(), tokens, torch.device("cpu"), 4, 1, memory_cap_gib=0.0)
    # On a CPU the reading is the process's RSS, not allocated memory: that part is left out.
    assert (rec.status, rec.message) == ("oom", "out of memory at batch size 4: 3.07 GiB more was asked for")
    assert capsys.readouterr().err == f"out of memory: {TORCH_OOM}\n"


def test_the_cap_is_in_every_record_and_an_oom_keeps_its_memory() -> None:
    p = parse_params(micro_params(harness__memory_cap_gib=24))
    base = base_record("fp32_baseline", p, RunSettings(), "cuda", {}, {})
    assert base["memory_cap_gib"] == 24 and base["params.harness.memory_cap_gib"] == 24
    oom = Measurement(status="oom", message="out of memory ...", memory={"peak_mem_allocated_mb": 23_900.0,
                                                                        "peak_mem_reserved_mb": 24_300.0})
    rec = measured_record(base, [oom], GPTConfig.from_name("tiny", vocab_size=512), 1000, 0.05)
    assert (rec["status"], rec["peak_mem_allocated_mb"], rec["peak_mem_reserved_mb"]) == ("oom", 23_900.0, 24_300.0)
    errored = measured_record(base, [Measurement(status="error", message="x", memory={"peak_mem_allocated_mb": 5.0})],
                              GPTConfig.from_name("tiny", vocab_size=512), 1000, 0.05)
    assert "peak_mem_allocated_mb" not in errored


@pytest.mark.gpu
def test_on_a_gpu_a_run_past_the_cap_ends_oom_with_its_memory(tokens) -> None:
    # The cap holds the micro model (0.14M parameters: 2 MiB with its gradients and AdamW's moments) and the batch
    # (2 MiB), but not the step: one (batch, block, 64) fp32 activation is 64 MiB, and the fp32 logits alone are
    # batch * block * vocab * 4 bytes = 2048 * 128 * 512 * 4 = 512 MiB > 256 MiB. A cap that the first allocation
    # already breaks (0.05 GiB did on an H200) ends with nothing held to report.
    p = parse_params(micro_params(harness__memory_cap_gib=0.25, shape__batch_size=2048, shape__block_size=128))
    device = torch.device("cuda")
    try:
        rec = train_once(p, p.variants["fp32_baseline"], tokens, device, 4, 1)
    finally:
        harness.cap_memory(device, 0)  # the rest of the session gets the whole card back
    why = f"message {rec.message!r}, memory {rec.memory}"
    assert rec.status == "oom", why
    assert rec.message.startswith("out of memory at batch size 2048 under a 0.25 GiB cap: "), why
    assert rec.message.endswith(" more was asked for") and "\n" not in rec.message, why
    assert 0 < rec.memory["peak_mem_allocated_mb"] <= 0.25 * 1024, why


def test_caps_below_one_gib_and_up_to_the_whole_card_are_taken_on_the_card_meant(
        fake_gpu: list, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: asked.append(device) or FakeProps())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    harness.cap_memory(CUDA, 0.5)
    harness.cap_memory(CUDA, 141)  # exactly the card: allowed
    harness.cap_memory(torch.device("cuda"), 70.5)  # `cuda` alone: the current card
    assert fake_gpu == [(pytest.approx(0.5 / 141), 0), (1.0, 0), (0.5, 3)]
    assert asked == [CUDA, CUDA, torch.device("cuda")]
    names: list = []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: names.append(device) or "NVIDIA H200")
    with pytest.raises(LabError, match="more than NVIDIA H200's"):
        harness.cap_memory(CUDA, 141.5)
    assert names == [CUDA]
