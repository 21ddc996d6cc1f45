"""compile_scope=blocks trained for a few steps: regional and whole-model compilation train the same, and one graph
is compiled for every block. How the blocks are compiled and what is refused: tests/unit/test_regional_compile.py."""

import pytest
import torch

from benchlab.core.knobs import RunSettings
from benchlab.core.sections import OptimParams
from benchlab.run.apply_knobs import apply
from benchlab.run.step import train_step
from tests.unit.test_regional_compile import _model


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g)


def _losses(settings: RunSettings, layers: int, steps: int = 3) -> tuple[list[float], int]:
    torch._dynamo.reset()
    graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    run = apply(_model(layers), settings, torch.device("cpu"), OptimParams(lr=0.01))
    losses = [float(train_step(run, *_batch(), grad_clip=1.0)) for _ in range(steps)]
    return losses, torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs_before


@pytest.mark.integration
def test_regional_and_whole_model_compilation_train_the_same_and_a_block_compiles_once() -> None:
    eager, _ = _losses(RunSettings(), 3)
    whole, _ = _losses(RunSettings(compile=True), 3)
    regional, graphs = _losses(RunSettings(compile=True, compile_scope="blocks"), 3)
    deeper, deeper_graphs = _losses(RunSettings(compile=True, compile_scope="blocks"), 5)
    torch.testing.assert_close(regional, whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(regional, eager, rtol=1e-5, atol=1e-5)
    assert deeper != regional  # a deeper model: other losses, the same graphs
    assert graphs == deeper_graphs  # a block's graph is compiled once, whatever the depth
