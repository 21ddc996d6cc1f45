"""Where a stage's process keeps its compiled graphs: the project's compile cache (benchlab/core/stage_main.py)."""

import os
import subprocess
import sys

from benchlab.core import stage_main
from benchlab.core.stage_main import COMPILE_CACHE, compile_cache
from tests.conftest import ROOT

CACHE_VARS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
# A stage's process in miniature: run_main, then, as a compilation would, inductor asks where its cache is.
STAGE = """
import os
from benchlab.core.stage_main import run_main

def main(argv):
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    print(cache_dir())
    print(os.environ["TRITON_CACHE_DIR"])

run_main(main)
"""


def cache_of_a_stage(**env: str) -> list[str]:
    """Where inductor and Triton cache in a fresh stage process, with `env` on top of this one's less CACHE_VARS."""
    base = {k: v for k, v in os.environ.items() if k not in CACHE_VARS}
    out = subprocess.run([sys.executable, "-c", STAGE], cwd=ROOT, env={**base, **env}, capture_output=True, text=True,
                         check=True, timeout=120).stdout
    return out.splitlines()[-2:]


def test_the_compile_cache_is_in_the_project_and_ignored_by_git() -> None:
    assert COMPILE_CACHE == ROOT / ".cache" / "inductor"
    assert "/.cache/" in (ROOT / ".gitignore").read_text().splitlines()
    assert "/.cache/" in (ROOT / ".dvcignore").read_text().split()  # and by DVC (issue 53: a mutant moved it out)


def test_a_stage_compiles_into_the_project_cache_and_a_folder_the_user_named_is_kept(tmp_path) -> None:
    assert cache_of_a_stage() == [str(compile_cache()), str(compile_cache() / "triton")]
    assert compile_cache().parent == COMPILE_CACHE
    mine = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "mine"), "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    assert cache_of_a_stage(**mine) == [mine["TORCHINDUCTOR_CACHE_DIR"], mine["TRITON_CACHE_DIR"]]


def test_the_cache_has_a_folder_per_torch_triton_and_gpu(monkeypatch, tmp_path) -> None:
    import torch

    assert stage_main.machine_key().startswith(f"torch-{torch.__version__}_triton-")
    info = tmp_path / "0000:3b:00.0" / "information"
    info.parent.mkdir()
    info.write_text("Model: \t\t NVIDIA H200\nIRQ: 1\n")
    real_glob = stage_main.glob.glob
    monkeypatch.setattr(stage_main.glob, "glob", lambda pattern: [str(info)] if "nvidia" in pattern else real_glob(pattern))
    assert stage_main.machine_key().endswith("_NVIDIA-H200")
    monkeypatch.setattr(stage_main.glob, "glob", lambda pattern: [])
    assert "_cpu-" in stage_main.machine_key()
