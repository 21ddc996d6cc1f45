"""What the knob tests share (test_skips, test_knobs, test_old_names, test_params, test_sections): the devices the
skip rules are checked on, and params.yaml with a set of knobs, refused with an exact message."""

import pytest

from benchlab.core.errors import LabError
from benchlab.core.knobs import TOP_LEVEL_KNOBS
from benchlab.core.loss_heads import LOSS_HEADS
from benchlab.core.params import parse_params
from benchlab.core.skips import DeviceFacts
from tests.conftest import micro_params

LIGER_VERSION = LOSS_HEADS["onepass"].pinned

CPU = DeviceFacts(kind="cpu", name="cpu", cxx=True)
V100 = DeviceFacts(kind="cuda", name="Tesla V100-SXM2-16GB", capability=(7, 0), bf16=False, triton=True)
A100 = DeviceFacts(kind="cuda", name="NVIDIA A100", capability=(8, 0), bf16=True, triton=True, torchao=True, liger=True,
                  liger_version=LIGER_VERSION)
H200 = DeviceFacts(kind="cuda", name="NVIDIA H200", capability=(9, 0), bf16=True, triton=True, torchao=True, liger=True,
                  liger_version=LIGER_VERSION, cce=True)


def refused(message: str, **knobs: object) -> None:
    """params.yaml with these knobs (`with_knobs`) is refused when it loads, with exactly this message after the
    variant's prefix."""
    with pytest.raises(LabError) as err:
        parse_params(with_knobs(**knobs))
    assert str(err.value).removeprefix("variants.mine.") == message


def with_knobs(**knobs: object) -> dict:
    """params.yaml with these knobs at the top level where the train stage honours them all, else in a variant
    (`variants.mine`: the knobs of a run over several processes are a variant's alone)."""
    if set(knobs) <= set(TOP_LEVEL_KNOBS):
        return micro_params(**knobs)
    data = micro_params()
    data["variants"]["mine"] = knobs
    return data
