"""The model: causal, kernel-independent (every attention kernel of `model.gpt.ATTENTION`), and GPT-2 sized."""

import pytest
import torch

from model.gpt import ATTENTION, GPT, PRESETS, GPTConfig, padded_vocab


def tiny(attention: str = "manual", **kw: object) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, attention=attention, **kw))


@pytest.mark.parametrize("attention", ATTENTION)
def test_future_tokens_never_change_earlier_logits(attention: str) -> None:
    model = tiny(attention).eval()
    x = torch.randint(0, 64, (2, 16))
    changed = x.clone()
    changed[:, 10:] = (changed[:, 10:] + 7) % 64
    with torch.no_grad():
        a, _ = model(x)
        b, _ = model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


@pytest.mark.parametrize("attention", [name for name in ATTENTION if name != "manual"])
def test_every_attention_kernel_agrees_with_manual_forward_and_backward(attention: str) -> None:
    manual, other = tiny("manual"), tiny(attention)
    other.load_state_dict(manual.state_dict())
    x = torch.randint(0, 64, (3, 16))
    _, loss_m = manual(x, x)
    _, loss_o = other(x, x)
    loss_m.backward()
    loss_o.backward()
    torch.testing.assert_close(loss_m, loss_o, rtol=1e-5, atol=1e-6)
    for (name, pm), po in zip(manual.named_parameters(), other.parameters()):
        torch.testing.assert_close(pm.grad, po.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_gpt2_124m_matches_gpt2_small_parameter_count() -> None:
    # GPT-2 small as released: 124,439,808 parameters with biases and a 50257
    # vocabulary. Ours has no biases and pads the vocabulary to 50304.
    cfg = GPTConfig.from_name("gpt2_124m", vocab_size=50257)
    with torch.device("meta"):
        total = GPT(cfg).num_params(non_embedding=False)
    d, L = cfg.n_embd, cfg.n_layer
    biases = L * (3 * d + d + 4 * d + d) + (2 * L + 1) * d  # linear biases + LayerNorm biases
    assert total + biases == 124_439_808
    with torch.device("meta"):
        assert GPT(GPTConfig.from_name("gpt2_124m")).num_params(non_embedding=False) == total + (50304 - 50257) * d


def test_output_layer_is_tied_to_the_token_embedding() -> None:
    model = tiny()
    assert model.lm_head.weight.data_ptr() == model.wte.weight.data_ptr()


def test_presets_and_padding() -> None:
    assert set(PRESETS) == {"tiny", "gpt_small", "gpt2_124m", "gpt2_350m", "gpt2_774m", "gpt2_1558m"}
    shapes = {name: (c.n_layer, c.n_head, c.n_embd, c.block_size, c.vocab_size) for name, c in PRESETS.items()}
    assert shapes["gpt2_774m"] == (36, 20, 1280, 1024, 50304) and shapes["gpt2_1558m"] == (48, 25, 1600, 1024, 50304)
    assert PRESETS["gpt2_124m"].vocab_size == 50304 and PRESETS["gpt2_124m"].vocab_size % 64 == 0
    assert padded_vocab(4096) == 4096 and padded_vocab(4097) == 4160 and padded_vocab(50257) == 50304


@pytest.mark.parametrize("kwargs, message", [
    ({"n_head": 3}, "not divisible by n_head=3"),
    ({"n_layer": 0}, "n_layer must be positive"),
    ({"attention": "flash"}, f"valid: {', '.join(ATTENTION)}"),
])
def test_bad_configs_say_what_to_fix(kwargs: dict, message: str) -> None:
    base = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "vocab_size": 64} | kwargs
    with pytest.raises(ValueError, match=message):
        GPTConfig(**base)


def test_sequence_longer_than_context_is_refused() -> None:
    with pytest.raises(ValueError, match="exceeds block_size=16"):
        tiny()(torch.zeros(1, 17, dtype=torch.long))


def reference_logits(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """GPT-2's forward written out from the weights: a second implementation to hold the model to."""
    F = torch.nn.functional
    cfg = model.cfg
    T, hs = idx.size(1), cfg.n_embd // cfg.n_head
    x = model.wte.weight[idx] + model.wpe.weight[:T]
    for b in model.blocks:
        h = F.layer_norm(x, (cfg.n_embd,), b.ln_1.weight)
        q, k, v = (h @ b.attn.qkv.weight.T).split(cfg.n_embd, dim=2)
        q, k, v = (t.view(*idx.shape, cfg.n_head, hs).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(2, 3) / hs**0.5
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(*idx.shape, cfg.n_embd)
        x = x + y @ b.attn.proj.weight.T
        h = F.layer_norm(x, (cfg.n_embd,), b.ln_2.weight)
        u = h @ b.mlp.fc.weight.T
        gelu = 0.5 * u * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (u + 0.044715 * u**3)))
        x = x + gelu @ b.mlp.proj.weight.T
    return F.layer_norm(x, (cfg.n_embd,), model.ln_f.weight) @ model.wte.weight.T


@pytest.mark.parametrize("attention", ATTENTION)
def test_the_model_computes_gpt2_s_forward_as_written_out(attention: str) -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, attention=attention))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)  # large enough that tanh-GELU and exact GELU, or a flipped sign, differ plainly
    idx = torch.randint(0, 64, (2, 5))  # 5 positions, head size 16: a scale by the wrong one shows
    logits, _ = model(idx)
    torch.testing.assert_close(logits, reference_logits(model, idx), rtol=1e-5, atol=1e-5)


def test_parameter_counts_leave_out_position_embeddings_by_default() -> None:
    model = tiny()
    total = sum(p.numel() for p in model.parameters())
    assert model.num_params(non_embedding=False) == total
    assert model.num_params() == total - model.cfg.block_size * model.cfg.n_embd


def test_an_unknown_preset_names_the_valid_ones() -> None:
    with pytest.raises(ValueError) as err:
        GPTConfig.from_name("gpt5")
    assert str(err.value) == f"unknown model preset 'gpt5'; valid: {', '.join(PRESETS)}"



def test_bad_configs_and_a_missing_vocabulary_are_refused_in_full() -> None:
    with pytest.raises(ValueError) as err:
        GPTConfig(n_layer=2, n_head=3, n_embd=32, block_size=16, vocab_size=64)
    assert str(err.value) == "n_embd=32 is not divisible by n_head=3; choose a head count that divides the width"
    with pytest.raises(ValueError) as err:
        GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16))
    assert str(err.value) == "GPTConfig.vocab_size is unset; fill it from the data before building the model"


def test_weights_start_as_gpt2_s_normal_with_the_residual_projections_scaled_down() -> None:
    torch.manual_seed(0)
    layers = 3
    model = GPT(GPTConfig(n_layer=layers, n_head=4, n_embd=256, block_size=256, vocab_size=512))
    scaled = 0.02 / (2 * layers) ** 0.5
    for name, p in model.named_parameters():
        if p.dim() < 2:
            continue  # LayerNorm weights start at 1
        want = scaled if name.endswith(".proj.weight") else 0.02
        assert abs(p.float().mean().item()) < 0.1 * want, name
        assert p.float().std().item() == pytest.approx(want, rel=0.05), name
