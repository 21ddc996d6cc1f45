"""The chunked loss head with its per-chunk step compiled (torch.compile builds C++ kernels). The loss heads' other
tests are in tests/unit/test_losses.py."""

import pytest

from tests.unit import test_losses as unit


# The other case of the unit test of this name: the chunk step compiled.
@pytest.mark.integration
@pytest.mark.parametrize("compile_chunks", [True])
def test_chunked_head_runs_after_the_wrapped_body(compile_chunks: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    unit.test_chunked_head_runs_after_the_wrapped_body(compile_chunks, monkeypatch)
