"""The datasheet peak table behind MFU (benchlab/run/mfu.py): each card as torch names it, and no near-miss."""

import pytest

from benchlab.run.mfu import peak_tflops


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA GeForce RTX 3090", 71.0),
    ("NVIDIA GeForce RTX 4090", 165.2),
    ("NVIDIA GeForce RTX 5090", 209.5),
    ("NVIDIA L4", 121.0),
    ("NVIDIA L40S", 362.05),
    ("NVIDIA A10", 125.0),
    ("NVIDIA A100-SXM4-80GB", 312.0),
    ("NVIDIA A100-PCIE-40GB", 312.0),
    ("NVIDIA A100 80GB PCIe", 312.0),
    ("NVIDIA H100 80GB HBM3", 989.0),
    ("NVIDIA H100 PCIe", 756.0),
    ("NVIDIA H100 NVL", 835.5),
    ("NVIDIA H200", 989.0),
    ("NVIDIA H200 NVL", 835.5),
    ("NVIDIA B200", 2250.0),
    ("AMD Instinct MI300X", 1307.4),
])
def test_each_card_as_torch_names_it_gets_its_datasheet_peak(name: str, tflops: float) -> None:
    assert peak_tflops(name) == tflops


@pytest.mark.parametrize("name", [
    "NVIDIA GeForce RTX 4090 Laptop GPU",  # another chip under the same number
    "NVIDIA GeForce RTX 4090 D",
    "NVIDIA GeForce RTX 3090 Ti",
    "NVIDIA A10G",  # AWS's part: no public datasheet figure
    "NVIDIA GH200 480GB",  # "H200" inside another name
    "NVIDIA L40",  # not in the table: not L4's, not L40S's
    "NVIDIA GeForce RTX 3060 Laptop GPU",
    "Tesla V100-SXM2-16GB",
    "cpu",
    "",
    None,
])
def test_a_card_without_a_sourced_figure_gets_none(name: str | None) -> None:
    assert peak_tflops(name) is None


def test_substrings_of_longer_names_do_not_match() -> None:
    assert peak_tflops("NVIDIA L40S") != peak_tflops("NVIDIA L4")
    assert peak_tflops("NVIDIA A100-SXM4-80GB") != peak_tflops("NVIDIA A10")
    assert peak_tflops("NVIDIA H100 PCIe") != peak_tflops("NVIDIA H100 80GB HBM3")
