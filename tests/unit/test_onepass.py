"""loss=onepass: one custom op makes the logits, the loss and both gradients in forward; backward only scales."""

import pytest
import torch
import torch.nn.functional as F

from benchlab.run.heads.onepass import OnePassLoss, onepass_head, rows_in_torch
from model.gpt import GPT, GPTConfig

CUDA = pytest.mark.gpu  # liger-kernel's Triton kernel needs a CUDA GPU


def test_rows_give_each_rows_loss_and_write_softmax_minus_one_hot_over_the_logits() -> None:
    torch.manual_seed(0)
    logits, targets = torch.randn(6, 11), torch.randint(0, 11, (6,))
    expected_grad = F.softmax(logits, dim=-1) - F.one_hot(targets, 11)
    expected_rows = F.cross_entropy(logits, targets, reduction="none")
    rows = rows_in_torch(logits, targets)
    assert rows.dtype == torch.float32
    torch.testing.assert_close(rows, expected_rows)
    torch.testing.assert_close(logits, expected_grad)  # overwritten in place


def test_head_gives_the_summed_loss_and_its_exact_gradients_scaled_by_the_loss_gradient() -> None:
    torch.manual_seed(0)
    hidden, weight = torch.randn(24, 8, requires_grad=True), torch.randn(13, 8, requires_grad=True)
    targets = torch.randint(0, 13, (24,))
    loss = onepass_head(hidden, weight, targets)[0]
    (3.0 * loss).backward()
    h, w = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
    expected = F.cross_entropy(h @ w.t(), targets, reduction="sum")
    (3.0 * expected).backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    torch.testing.assert_close(hidden.grad, h.grad)
    torch.testing.assert_close(weight.grad, w.grad)


def test_head_multiplies_in_the_hidden_states_dtype_and_hands_back_unrounded_fp32_weight_gradients() -> None:
    # As the output layer under autocast: the fp32 weight meets bf16 hidden states in bf16. Its gradient is made
    # in fp32 and handed back unrounded; the hidden states' gradient is scaled in fp32 and rounded once, to bf16.
    torch.manual_seed(0)
    hidden = torch.randn(32, 8).bfloat16().requires_grad_()
    weight = torch.randn(20, 8, requires_grad=True)
    targets = torch.randint(0, 20, (32,))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the op turns autocast off inside
        loss, grad_hidden, grad_weight = onepass_head(hidden, weight, targets)
    assert loss.dtype == grad_hidden.dtype == grad_weight.dtype == torch.float32
    logits = (hidden.detach() @ weight.detach().bfloat16().t()).float()
    assert loss.item() == pytest.approx(F.cross_entropy(logits, targets, reduction="sum").item(), rel=1e-6)
    (loss / 3).backward()
    assert hidden.grad is not None and hidden.grad.dtype == torch.bfloat16
    assert torch.equal(hidden.grad, (grad_hidden / 3).bfloat16())
    assert weight.grad is not None and weight.grad.dtype == torch.float32
    assert not torch.equal(weight.grad, weight.grad.bfloat16().float())  # not rounded through bf16


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_compiled_onepass_loss_keeps_the_op_in_one_graph_and_gives_the_models_gradients(dtype) -> None:
    # fullgraph: no graph break around the op; the loss and gradients are the model's own (bf16: within rounding).
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    x, y = torch.randint(0, 32, (2, 8)), torch.randint(0, 32, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is not None):
        expected_loss = model(x, y)[1]
    expected_loss.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    compiled = torch.compile(OnePassLoss(model, dtype), fullgraph=True, backend="aot_eager")
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is not None):
        loss = compiled(x, y)
    loss.backward()
    tol = {"rtol": 1e-5, "atol": 1e-7} if dtype is None else {"rtol": 0.05, "atol": 2e-3}
    assert loss.item() == pytest.approx(expected_loss.item(), rel=tol["rtol"])
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], **tol, msg=name)


def test_loss_fn_wraps_the_whole_onepass_loss() -> None:
    from benchlab.run.heads.choose import loss_fn

    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    wrapped: list[torch.nn.Module] = []
    loss = loss_fn(model, "onepass", lambda m: (wrapped.append(m), m)[1], compile_chunks=True,
                   hidden_dtype=torch.bfloat16)
    assert [type(m) for m in wrapped] == [OnePassLoss]
    assert wrapped[0].model is model and wrapped[0].dtype == torch.bfloat16
    x = torch.randint(0, 32, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert loss(x, x).item() == pytest.approx(model(x, x)[1].item(), abs=2e-2)


@CUDA
def test_liger_kernel_gives_the_torch_rows_on_cuda_without_reading_back_to_the_host() -> None:
    from benchlab.run.heads.onepass import rows_in_triton

    torch.manual_seed(0)
    logits = (3 * torch.randn(64, 50304, device="cuda")).bfloat16()  # GPT-2's padded vocabulary: 2 blocks per row
    targets = torch.randint(0, 50304, (64,), device="cuda")
    ours, theirs = logits.clone(), logits.clone()
    torch.cuda.set_sync_debug_mode("error")  # a host read-back (liger's wrapper's .item()) would raise
    try:
        rows = rows_in_triton(theirs, targets)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(rows, rows_in_torch(ours, targets), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(theirs.float(), ours.float(), rtol=2e-2, atol=1e-5)


@CUDA
def test_compiled_onepass_step_matches_the_inline_head_on_cuda() -> None:
    from benchlab.run.heads.standard import LossOnly

    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=4, n_embd=128, block_size=64, vocab_size=50304, attention="sdpa")
    model = GPT(cfg).cuda()
    x, y = (torch.randint(0, 50304, (4, 64), device="cuda") for _ in range(2))
    results = []
    for head in (LossOnly(model), OnePassLoss(model, torch.bfloat16)):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.compile(head, fullgraph=True)(x, y)
        loss.backward()
        results.append((float(loss), {n: p.grad.clone() for n, p in model.named_parameters()}))
        model.zero_grad()
    (inline_loss, inline_grads), (loss, grads) = results
    assert loss == pytest.approx(inline_loss, rel=1e-3)
    for name, grad in grads.items():  # bf16 products either way; the onepass weight gradient is not rounded to bf16
        torch.testing.assert_close(grad, inline_grads[name], rtol=0.05, atol=1e-4, msg=name)


def test_grad_check_script_refuses_an_unknown_head_and_prints_a_row_per_head_and_parameter(monkeypatch, capsys) -> None:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "head_grad_check.py"
    spec = importlib.util.spec_from_file_location("head_grad_check", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(script, "CFG", GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=512))
    monkeypatch.setattr("sys.argv", ["head_grad_check.py", "--heads", "inline,bogus"])
    with pytest.raises(SystemExit, match="^head_grad_check.py: unknown head bogus; expected: inline, onepass$"):
        script.main()
    monkeypatch.setattr("sys.argv", ["head_grad_check.py", "--steps", "1"])
    script.main()
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith(("| inline", "| onepass"))]
    assert len(rows) == 2 * len(list(GPT(script.CFG).parameters()))
    for row in rows:  # bf16's rounding only: a few parts in a thousand off fp32's gradient, unscaled
        assert float(row[2]) < 0.05 and abs(float(row[3].rstrip(" |")) - 1) < 0.02, row
