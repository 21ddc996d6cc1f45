"""The loss heads: each gives the model's own loss and gradients, in the dtypes and memory it promises."""

import sys
import types

import pytest
import torch

from benchlab.core.loss_heads import LOSS_HEADS
from benchlab.core.params import RunSettings
from benchlab.core.sections import OptimParams
from benchlab.run.apply_knobs import apply
from benchlab.run.heads import chunked
from benchlab.run.heads.choose import loss_fn
from benchlab.run.heads.chunked import CHUNK_TOKENS, add_weight_grad, chunk_loss_and_grads, chunked_cross_entropy
from benchlab.run.heads.shared import Features
from benchlab.run.heads.standard import BodyThenHead, LossOnly, OutputLoss
from model.gpt import GPT, GPTConfig

CPU = torch.device("cpu")


def test_chunked_loss_keeps_only_one_chunk_of_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each chunk's products see that chunk's rows only; the gradients are made in forward, one chunk at a time.
    seen: list[tuple[tuple[int, ...], bool]] = []
    real = chunked.chunk_loss_and_grads
    monkeypatch.setattr(chunked, "chunk_loss_and_grads",
                        lambda h, w, t, with_grads: (seen.append((tuple(h.shape), with_grads)), real(h, w, t, with_grads))[1])
    torch.manual_seed(0)
    hidden, weight = torch.randn(50, 8, requires_grad=True), torch.randn(30, 8, requires_grad=True)
    targets = torch.randint(0, 30, (50,))
    loss = chunked.chunked_cross_entropy(hidden, weight, targets, chunk=16)
    assert seen == [((16, 8), True), ((16, 8), True), ((16, 8), True), ((2, 8), True)]
    reference = torch.nn.functional.cross_entropy(hidden @ weight.t(), targets)
    assert loss.item() == pytest.approx(reference.item(), rel=1e-6)
    # Backward scales the stored gradients by the loss's own gradient (3 here, as a caller's loss scaling would).
    (3 * loss).backward()
    expected = torch.autograd.grad(3 * reference, (hidden, weight))
    torch.testing.assert_close(hidden.grad, expected[0], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(weight.grad, expected[1], rtol=1e-5, atol=1e-7)
    seen.clear()
    with torch.no_grad():  # evaluation: the loss alone, no gradient products
        assert float(chunked.chunked_cross_entropy(hidden, weight, targets, chunk=32)) == pytest.approx(float(loss), rel=1e-6)
    assert seen == [((32, 8), False), ((18, 8), False)]
    seen.clear()
    monkeypatch.setattr(chunked, "CHUNK_TOKENS", 24)  # the module's chunk size, read at each call
    chunked.chunked_cross_entropy(hidden, weight, targets)
    assert [shape for shape, _ in seen] == [(24, 8), (24, 8), (2, 8)]


def test_chunked_loss_multiplies_in_the_autocast_dtype() -> None:
    # Under bf16 autocast the products run in bf16 as the output layer's do, and the parameters' gradients come
    # back in fp32; the loss and gradients match the standard head's within bf16 rounding.
    torch.manual_seed(0)
    hidden, weight = torch.randn(64, 16, requires_grad=True), torch.randn(40, 16, requires_grad=True)
    targets = torch.randint(0, 40, (64,))
    dtypes: list[tuple[torch.dtype, torch.dtype]] = []

    def step(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, with_grads: bool):  # type: ignore[no-untyped-def]
        dtypes.append((h.dtype, w.dtype))
        return chunked.chunk_loss_and_grads(h, w, t, with_grads)

    saved: list[tuple[torch.dtype, tuple[int, ...]]] = []
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(
            lambda t: (saved.append((t.dtype, tuple(t.shape))), t)[1], lambda t: t):
        loss = chunked_cross_entropy(hidden, weight, targets, chunk=24, step=step)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = torch.nn.functional.cross_entropy(torch.nn.functional.linear(hidden, weight), targets)
    assert dtypes == [(torch.bfloat16, torch.bfloat16)] * 3  # both operands cast before the chunks, as Linear's
    # Kept for backward: the hidden states' gradient in their dtype, the weight's summed over the chunks in fp32.
    assert saved == [(torch.bfloat16, (64, 16)), (torch.float32, (40, 16))]
    loss.backward()
    expected = torch.autograd.grad(reference, (hidden, weight))
    assert loss.dtype == torch.float32 and hidden.grad.dtype == weight.grad.dtype == torch.float32
    assert loss.item() == pytest.approx(reference.item(), rel=1e-3)
    torch.testing.assert_close(hidden.grad, expected[0], rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(weight.grad, expected[1], rtol=2e-2, atol=2e-3)
    exact = torch.nn.functional.cross_entropy(hidden.detach() @ weight.detach().t(), targets)
    assert abs(loss.item() - exact.item()) > 1e-6  # bf16 products: not the fp32 loss


def test_chunk_gradients_are_made_in_the_operands_dtype() -> None:
    # Without autocast, bf16 operands give bf16 products: softmax minus one-hot is cast down before them.
    torch.manual_seed(0)
    hidden, weight = torch.randn(8, 16).bfloat16(), torch.randn(40, 16).bfloat16()
    targets = torch.randint(0, 40, (8,))
    loss_sum, grad_hidden, grad_logits = chunk_loss_and_grads(hidden, weight, targets, with_grads=True)
    assert grad_hidden is not None and grad_logits is not None
    assert grad_hidden.dtype == grad_logits.dtype == torch.bfloat16 and loss_sum.dtype == torch.float32
    probs = torch.softmax((hidden @ weight.t()).float(), dim=-1) - torch.nn.functional.one_hot(targets, 40)
    torch.testing.assert_close(grad_logits, probs.bfloat16())
    torch.testing.assert_close(grad_hidden, probs.bfloat16() @ weight)
    # On the CPU the weight's product is made in bf16 and then added to the fp32 sum.
    total = torch.full((40, 16), 0.5)
    add_weight_grad(total, grad_logits, hidden)
    assert total.dtype == torch.float32
    torch.testing.assert_close(total, 0.5 + (probs.bfloat16().t() @ hidden).float())


def test_chunk_step_makes_everything_on_its_operands_device() -> None:
    # On a GPU a CPU-made index column would fail the comparison; meta tensors stand in for any other device.
    hidden, weight = torch.empty(8, 16, device="meta"), torch.empty(40, 16, device="meta")
    targets = torch.empty(8, dtype=torch.long, device="meta")
    outputs = chunk_loss_and_grads(hidden, weight, targets, with_grads=True)
    assert [t.device.type for t in outputs if t is not None] == ["meta"] * 3
    assert outputs[1] is not None and outputs[1].shape == (8, 16) and outputs[2] is not None and outputs[2].shape == (8, 40)


def test_weight_gradient_is_summed_in_place_by_one_fp32_output_matmul(monkeypatch: pytest.MonkeyPatch) -> None:
    # Where the device has it (CUDA; meta checks the call), half-precision operands go to one addmm that adds
    # their product into the fp32 sum in place; fp32 operands and the CPU take the product, then the add.
    calls: list[tuple[tuple[int, ...], torch.dtype, bool]] = []
    real = torch.addmm

    def spy(total, a, b, **kwargs):  # type: ignore[no-untyped-def]
        calls.append((tuple(a.shape), kwargs.get("out_dtype"), kwargs.get("out") is total))
        return real(total, a, b, **kwargs)

    monkeypatch.setattr(torch, "addmm", spy)
    total = torch.empty(40, 16, device="meta")
    add_weight_grad(total, torch.empty(8, 40, device="meta", dtype=torch.bfloat16),
                    torch.empty(8, 16, device="meta", dtype=torch.bfloat16))
    assert calls == [((40, 8), torch.float32, True)] and total.dtype == torch.float32
    add_weight_grad(total, torch.empty(8, 40, device="meta"), torch.empty(8, 16, device="meta"))  # fp32 operands
    add_weight_grad(torch.zeros(40, 16), torch.zeros(8, 40, dtype=torch.bfloat16), torch.zeros(8, 16, dtype=torch.bfloat16))
    assert len(calls) == 1


@pytest.mark.gpu  # cuBLAS's fp32-output addmm needs a CUDA GPU
def test_weight_gradient_sum_on_cuda_matches_the_product_then_the_add() -> None:
    torch.manual_seed(0)
    grad_logits = torch.randn(2048, 512, device="cuda").bfloat16()
    hidden = torch.randn(2048, 64, device="cuda").bfloat16()
    total = torch.randn(512, 64, device="cuda")
    expected = total + grad_logits.float().t() @ hidden.float()
    add_weight_grad(total, grad_logits, hidden)
    torch.testing.assert_close(total, expected, rtol=1e-3, atol=1e-2)


def test_chunked_loss_hands_back_the_fp32_weight_gradient_unrounded_and_backs_up_once() -> None:
    # Under autocast the weight's gradient is summed in fp32 and handed back as it is (the standard head's rounds
    # to bf16 first); backward scales the stored gradients in place, so a second backward is refused.
    assert RunSettings().loss_chunk_tokens == CHUNK_TOKENS  # the knob's default is the module's
    torch.manual_seed(0)
    hidden, weight = torch.randn(64, 16, requires_grad=True), torch.randn(40, 16, requires_grad=True)
    targets = torch.randint(0, 40, (64,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = chunked_cross_entropy(hidden, weight, targets, chunk=24)
    loss.backward(retain_graph=True)
    assert weight.grad is not None and weight.grad.dtype == torch.float32
    assert not torch.equal(weight.grad, weight.grad.bfloat16().float())  # not rounded through bf16
    with pytest.raises(RuntimeError, match=r"^the chunked cross-entropy's backward ran twice \(retain_graph=True\); its "
                       r"stored gradients are scaled in place, so it supports one backward per forward$"):
        loss.backward()
    # A bf16 weight without autocast still has its gradient summed in fp32; without gradients the operands meet in
    # the hidden states' dtype.
    saved: list[torch.dtype] = []
    bf16_weight = weight.detach().bfloat16().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (saved.append(t.dtype), t)[1], lambda t: t):
        chunked_cross_entropy(hidden.detach().bfloat16(), bf16_weight, targets, chunk=24)
    assert saved == [torch.bfloat16, torch.float32]
    with torch.no_grad():
        mixed = chunked_cross_entropy(hidden.detach().bfloat16(), weight.detach(), targets, chunk=24)
        same = chunked_cross_entropy(hidden.detach().bfloat16(), weight.detach().bfloat16(), targets, chunk=24)
    assert float(mixed) == float(same)


def test_chunked_loss_scales_the_hidden_states_gradient_in_fp32() -> None:
    # Backward scales the stored bf16 gradient by grad_loss / n in fp32 and rounds once: 1 / (3 x 64) has no exact
    # bf16 value, so a bf16 scale would shift every element the same way.
    torch.manual_seed(0)
    hidden, weight = torch.randn(64, 16).bfloat16().requires_grad_(), torch.randn(40, 16).bfloat16()
    targets = torch.randint(0, 40, (64,))
    (chunked_cross_entropy(hidden, weight, targets, chunk=24) * 64).backward()  # scale 1: the stored sum itself
    assert hidden.grad is not None
    summed, hidden.grad = hidden.grad.clone(), None
    (chunked_cross_entropy(hidden, weight, targets, chunk=24) / 3).backward()
    assert torch.equal(hidden.grad, (summed.float() * (1 / 3 / 64)).bfloat16())


def test_chunked_loss_backward_casts_one_chunk_of_rows_to_fp32_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fp32 temporary of the scaling is one chunk's rows: the whole batch's (48 MiB at GPT-2 124M, 16 x 1024)
    # would sit on `lean`'s peak, which measured 9 MiB under its bar.
    torch.manual_seed(0)
    hidden, weight = torch.randn(64, 16).bfloat16().requires_grad_(), torch.randn(40, 16).bfloat16()
    loss = chunked_cross_entropy(hidden, weight, torch.randint(0, 40, (64,)), chunk=24)
    rows: list[int] = []
    real = torch.Tensor.float
    monkeypatch.setattr(torch.Tensor, "float", lambda self, *a, **k: (rows.append(self.size(0)), real(self, *a, **k))[1])
    (loss / 3).backward()
    assert rows == [24, 24, 16]


def test_chunked_loss_gives_a_gradient_when_only_the_hidden_states_want_one() -> None:
    torch.manual_seed(0)
    hidden, weight = torch.randn(20, 8, requires_grad=True), torch.randn(30, 8)  # a frozen output layer
    targets = torch.randint(0, 30, (20,))
    asked: list[bool] = []

    def step(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, with_grads: bool):  # type: ignore[no-untyped-def]
        asked.append(with_grads)
        return chunk_loss_and_grads(h, w, t, with_grads)

    chunked_cross_entropy(hidden, weight, targets, chunk=8, step=step).backward()
    assert asked == [True] * 3  # the gradients are made in forward, not left to autograd through the chunks
    expected = torch.autograd.grad(torch.nn.functional.cross_entropy(hidden @ weight.t(), targets), hidden)[0]
    torch.testing.assert_close(hidden.grad, expected, rtol=1e-5, atol=1e-7)


def model_with_its_gradients(n_layer: int) -> tuple[GPT, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """A seeded toy model, a batch, and the gradients its own forward gives (the model's grads cleared again)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=n_layer, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    x, y = torch.randint(0, 32, (2, 8)), torch.randint(0, 32, (2, 8))
    model(x, y)[1].backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    return model, x, y, expected


@pytest.mark.parametrize("compile_chunks", [False])  # True: tests/integration/test_losses.py
def test_chunked_head_runs_after_the_wrapped_body(compile_chunks: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the body goes to `wrap` (torch.compile, DDP); the head's per-chunk arithmetic is compiled apart when
    # asked, and the step sees the model's own loss and gradients.
    model, x, y, expected = model_with_its_gradients(n_layer=1)
    wrapped: list[torch.nn.Module] = []
    compiled: list[dict] = []
    calls = [0]
    real_compile = torch.compile

    def compile_and_count(fn, **kw):  # type: ignore[no-untyped-def]
        compiled.append(kw)
        step = real_compile(fn, **kw)
        return lambda *args: (calls.__setitem__(0, calls[0] + 1), step(*args))[1]

    monkeypatch.setattr(torch, "compile", compile_and_count)
    loss = loss_fn(model, "chunked", lambda module: (wrapped.append(module), module)[1], compile_chunks=compile_chunks)
    out = loss(x, y)
    assert [type(m) for m in wrapped] == [Features] and wrapped[0].dtype is None
    assert compiled == ([{"dynamic": False}] if compile_chunks else [])  # the chunk step, in the default mode
    assert calls[0] == (1 if compile_chunks else 0)  # 16 tokens: one chunk, through the compiled step
    assert out.dim() == 0 and out.item() == pytest.approx(model(x, y)[1].item(), rel=1e-5)
    out.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-4, atol=1e-6, msg=name)


def test_the_chunk_knob_and_autocast_dtype_reach_the_chunked_head(monkeypatch: pytest.MonkeyPatch) -> None:
    # Through apply: loss_chunk_tokens sets the chunks' rows, and under bf16 the body hands over bf16 hidden states.
    seen: list[tuple[tuple[int, ...], torch.dtype]] = []
    real, real_head = chunked.chunk_loss_and_grads, chunked.chunked_cross_entropy
    monkeypatch.setattr(chunked, "chunk_loss_and_grads",
                        lambda h, w, t, with_grads: (seen.append((tuple(h.shape), h.dtype)), real(h, w, t, with_grads))[1])
    monkeypatch.setattr(chunked, "chunked_cross_entropy",  # what the body hands over, before the head's own cast
                        lambda h, *args, **kw: (seen.append((tuple(h.shape), h.dtype)), real_head(h, *args, **kw))[1])
    model, x, y, _ = model_with_its_gradients(n_layer=1)
    run = apply(model, RunSettings(precision="bf16", loss="chunked", loss_chunk_tokens=6), CPU, OptimParams())
    with run.autocast():
        out = run.loss(x, y)
    assert seen == [((16, 16), torch.bfloat16)] + [((6, 16), torch.bfloat16)] * 2 + [((4, 16), torch.bfloat16)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert out.item() == pytest.approx(model(x, y)[1].item(), abs=2e-2)


def test_inline_loss_hands_only_the_loss_to_the_compiler() -> None:
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    wrapped: list[torch.nn.Module] = []
    loss = loss_fn(model, "inline", lambda module: (wrapped.append(module), module)[1], compile_chunks=True)
    x = torch.randint(0, 32, (2, 8))
    out = loss(x, x)
    assert [type(m) for m in wrapped] == [LossOnly] and wrapped[0].model is model
    assert out.dim() == 0 and out.item() == pytest.approx(model(x, x)[1].item(), rel=1e-6)


@pytest.mark.parametrize("kind, returns_logits", [("standard", True), ("inline", False)])
def test_body_then_head_wraps_only_the_output_layer_and_loss(kind: str, returns_logits: bool) -> None:
    # Under FSDP2 with compile: the body is called as it is, the head alone goes to the compiler, and the step
    # sees the model's own loss and gradients.
    model, x, y, expected = model_with_its_gradients(n_layer=2)
    wrapped: list[torch.nn.Module] = []
    loss = BodyThenHead(model, kind, lambda module: (wrapped.append(module), module)[1])  # type: ignore[arg-type]
    assert [type(m) for m in wrapped] == [OutputLoss] and wrapped[0].lm_head is model.lm_head
    assert isinstance(wrapped[0](model.features(x), y), tuple) is returns_logits
    out = loss(x, y)
    assert out.dim() == 0 and out.item() == pytest.approx(model(x, y)[1].item(), rel=1e-6)
    out.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-5, atol=1e-7, msg=name)
    with pytest.raises(ValueError, match="standard or inline head, not 'chunked'"):
        BodyThenHead(model, "chunked", lambda module: module)


@pytest.mark.parametrize("kind, module, attr", [
    ("cce", "cut_cross_entropy", "linear_cross_entropy"),
    ("fused", "liger_kernel.transformers", "LigerFusedLinearCrossEntropyLoss"),
])
def test_library_losses_get_hidden_states_weight_and_targets(kind: str, module: str, attr: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernels need CUDA; a stand-in library checks our wiring: which tensors, in which order and dtype,
    # and (cut-cross-entropy) that gradient filtering is off, so gradients are the exact ones.
    calls: list[tuple] = []

    def kernel(*args: torch.Tensor, **kwargs: object) -> torch.Tensor:
        calls.append((args, kwargs))
        weight, hidden, targets = args if kind == "fused" else (args[1], args[0], args[2])
        return torch.nn.functional.cross_entropy(hidden @ weight.t(), targets)

    fake = types.ModuleType(module)
    setattr(fake, attr, kernel if kind == "cce" else lambda: kernel)
    monkeypatch.setitem(sys.modules, module, fake)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    x = torch.randint(0, 32, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = loss_fn(model, kind, lambda m: m, compile_chunks=False)(x, x)
    (args, kwargs), = calls
    weight, hidden, targets = args if kind == "fused" else (args[1], args[0], args[2])
    assert hidden.shape == (16, 16) and hidden.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16
    assert weight.shape == (32, 16) and torch.equal(targets, x.flatten())
    assert kwargs == ({"filter_eps": None} if kind == "cce" else {})
    out.backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.dtype == torch.float32


@pytest.mark.parametrize(("kind", "module", "message"), [
    ("fused", "liger_kernel.transformers", "loss=fused needs liger-kernel: pip install -r requirements-gpu.txt"),
    ("cce", "cut_cross_entropy", "loss=cce needs cut-cross-entropy: pip install -r requirements-gpu.txt")])
def test_a_library_head_without_its_library_says_what_to_install(monkeypatch: pytest.MonkeyPatch, kind: str,
                                                                  module: str, message: str) -> None:
    from benchlab.run.heads.library import library_loss

    monkeypatch.setitem(sys.modules, module, None)  # a None entry makes the import fail
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    with pytest.raises(RuntimeError) as err:
        library_loss(model, model.features, kind)
    assert str(err.value) == message and isinstance(err.value.__cause__, ImportError)


@pytest.mark.parametrize("kind", [k for k, head in LOSS_HEADS.items() if head.runs_on_cpu])
def test_the_catalog_says_which_heads_call_the_model_s_output_layer(kind: str) -> None:
    # A head that owns the output matmul multiplies by the output weight itself: a float8 `lm_head` would be
    # bypassed (knobs.check_combination refuses fp8=head with it). The others call the model's `lm_head`.
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("tiny", vocab_size=64))
    calls: list[str] = []
    model.lm_head.register_forward_hook(lambda module, args, out: calls.append("lm_head"))
    loss = loss_fn(model, kind, lambda module: module, compile_chunks=False, chunk=16)  # type: ignore[arg-type]
    idx = torch.randint(0, 64, (2, 16))
    loss(idx, idx).backward()
    assert bool(calls) is not LOSS_HEADS[kind].owns_output_matmul
