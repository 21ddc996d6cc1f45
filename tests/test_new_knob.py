"""Adding a knob touches the places docs/architecture.md lists, and no others.

In a scratch copy of the sources, a throwaway knob is added through exactly those places (its `knob(...)` field,
choices and rule in benchlab/core/knobs.py; its skip in benchlab/core/skips.py; its work in
benchlab/run/apply_knobs.py; a top-level line and a variant in params.yaml; its key in dvc.yaml's train params).
Then, in that copy: params load with it, a variant that sets it is applied (its work runs), a bad value and an
impossible combination are refused naming the key, its skip says why a device cannot, the search tries it, and the
README's knob table lists it.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, copy_sources

# Each place a knob is added: (file, where, what is inserted after `where`). docs/architecture.md lists these files.
PLACES: list[tuple[str, str, str]] = [
    ("benchlab/core/knobs.py", r'Float8 = Literal\[.*?\]\n', 'Throwaway = Literal["plain", "marked"]\n'),
    ("benchlab/core/knobs.py", r"\n    nccl_max_ctas: int = knob\(.*?\)\n(?=\n)",
     '    throwaway: Throwaway = knob(\n'
     '        "plain", "a throwaway knob: marked prints a line where the model is placed",\n'
     '        {"placement": "prints a line"}, skips.throwaway_skip, group="memory")\n'),
    ("benchlab/core/knobs.py", r"\n    _check_optimizer\(where, s\)\n",
     '    check(s.throwaway == "plain" or s.precision != "fp16", f"{where}throwaway", s.throwaway,\n'
     '          "plain with precision=fp16")\n'),
    ("benchlab/core/skips.py", r"\Z",
     '\n\ndef throwaway_skip(value: str, s: object, d: DeviceFacts) -> str | None:\n'
     '    """marked: on CUDA."""\n'
     '    return "throwaway=marked prints on a CPU only" if value == "marked" and d.kind == "cuda" else None\n'),
    ("benchlab/run/apply_knobs.py", r'\ndef place\(.*?""".*?"""\n',
     '    if settings.throwaway == "marked":\n        print("throwaway: the work ran")\n'),
    ("params.yaml", r"\ngrad_accum: .*\n", "throwaway: plain     # plain | marked\n"),
    ("params.yaml", r"\nvariants:\n", "  throwaway_on: {throwaway: marked}\n"),
    ("dvc.yaml", r"\n      - grad_accum\n", "      - throwaway\n"),
]

COPIED = ["benchlab", "model", "scripts/readme_tables.py", "params.yaml", "dvc.yaml"]

CHECKS = r'''
import torch
import yaml

from benchlab.core.errors import LabError
from benchlab.core.knobs import RunSettings, knobs_in_group, searched
from benchlab.core.params import load_params, parse_params
from benchlab.core.sections import TrainParams
from benchlab.core.skips import DeviceFacts
from benchlab.core.knobs import unsupported_reason
from benchlab.run.apply_knobs import apply
from benchlab.search.moves import Candidate, moves
from model.gpt import GPT, GPTConfig


def refusal(data):
    try:
        parse_params(data)
    except LabError as err:
        return str(err)
    raise AssertionError("accepted")


p = load_params()
assert p.run.throwaway == "plain" and p.variants["throwaway_on"].throwaway == "marked"
apply(GPT(GPTConfig.from_name("tiny", vocab_size=64)), p.variants["throwaway_on"], torch.device("cpu"), TrainParams())
data = yaml.safe_load(open("params.yaml"))
data["variants"]["bad"] = {"throwaway": "bogus"}
print(refusal(data))
data["variants"]["bad"] = {"throwaway": "marked", "precision": "fp16"}
print(refusal(data))
print(unsupported_reason(RunSettings(throwaway="marked"), DeviceFacts(kind="cuda", name="gpu", triton=True)))
assert unsupported_reason(RunSettings(throwaway="marked"), DeviceFacts(kind="cpu")) is None
assert "throwaway" in knobs_in_group("memory") and searched("throwaway")
print([c.name for c in moves(Candidate(), RunSettings(), "fastest", 8) if "throwaway" in c.name])
'''


def add_knob(repo: Path) -> set[str]:
    """The throwaway knob added at each of PLACES; the files edited."""
    for name, where, text in PLACES:
        path = repo / name
        source = path.read_text()
        match = re.search(where, source, re.S)
        assert match, f"{name}: no {where!r} to add the knob after"
        path.write_text(source[: match.end()] + text + source[match.end():])
    return {name for name, _, _ in PLACES}


def test_a_knob_added_through_the_documented_places_works_everywhere(tmp_path: Path) -> None:
    copy_sources(tmp_path, COPIED)
    edited = add_knob(tmp_path)
    assert edited == {"benchlab/core/knobs.py", "benchlab/core/skips.py", "benchlab/run/apply_knobs.py",
                      "params.yaml", "dvc.yaml"}
    assert all(f"`{name}`" in (ROOT / "docs/architecture.md").read_text() for name in edited)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", CHECKS], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines() == [
        "throwaway: the work ran",
        "variants.bad.throwaway='bogus' is not valid; expected one of: plain, marked",
        "variants.bad.throwaway='marked' is not valid; expected plain with precision=fp16",
        "throwaway=marked prints on a CPU only",
        "['throwaway=marked']",
    ]
    readme = tmp_path / "README.md"  # the knob table alone (the real one's headline tables read results/)
    readme.write_text("<!-- generated:knobs -->\n<!-- /generated:knobs -->\n")
    tables = [sys.executable, "scripts/readme_tables.py"]
    proc = subprocess.run(tables, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and "rewrote knobs" in proc.stdout, proc.stdout + proc.stderr
    row = next(line for line in readme.read_text().splitlines() if line.startswith("| `throwaway`"))
    assert row == ("| `throwaway` | `plain` \\| `marked` | `plain` | a throwaway knob: marked prints a line where the "
                   "model is placed | 1. prints a line | marked: on CUDA. |")
