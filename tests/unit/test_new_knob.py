"""Adding a knob, or a kernel to the attention knob, touches the places docs/architecture.md lists, and no others.

In a scratch copy of the sources a throwaway knob (`KNOB`), or a throwaway attention kernel (`KERNEL`), is added by
edits of the real files. Which definitions the edits landed in is read back from the edited files (a Python file's
top-level definitions, a YAML file's mappings), not from the edits: those places must be exactly the rows of the
doc's table for it, and each definition a row names must exist in the real code. Then, in that copy, the knob or
the kernel works everywhere it must, so the table's places are all it takes.
"""

import ast
import difflib
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from benchlab.core.attention_kernels import ATTENTION_KERNELS
from benchlab.run import apply_knobs
from tests.conftest import ROOT, copy_sources
from tests.unit.test_knobs import knob_comments, listed_choices

DOC = ROOT / "docs/architecture.md"
COPIED = ["benchlab", "model", "scripts/readme_tables.py", "params.yaml", "dvc.yaml"]

# An edit: (file, pattern, text inserted right after the pattern's match).
Edit = tuple[str, str, str]


# ---- the places: from the doc, and from the edited files ----------------------------------------------------------

def doc_places(heading: str, name: str) -> list[tuple[str, set[str]]]:
    """The rows of the table under `heading`: (file, the definitions it may be in), with `<name>` and `<Name>`
    filled in. A row's definition cell names one or several (`place`, `set_tf32`: the function of its step)."""
    section = DOC.read_text().split(f"\n{heading}\n", 1)[1]
    section = re.split(r"\n#{2,3} ", section, maxsplit=1)[0]
    rows = []
    for line in section.splitlines():
        if cells := re.match(r"^\| `([^`]+)` \| (.+?) \| ", line):
            names = re.findall(r"`([^`]+)`", cells[2])
            rows.append((cells[1], {n.replace("<name>", name).replace("<Name>", name.title()) for n in names}))
    assert rows, f"docs/architecture.md: no table of places under {heading!r}"
    return rows


def python_definitions(text: str) -> list[tuple[int, int, str]]:
    """A module's top-level definitions: (first line, last line, name), decorators included."""
    spans = []
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            name = node.name
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
        else:
            continue
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        spans.append((first, node.end_lineno or node.lineno, name))
    return spans


def yaml_mapping(lines: list[str], index: int) -> str:
    """The YAML mapping line `index` is in, as a dotted path of keys ("stages.train.params"); a top-level line's
    own key."""
    indent = len(lines[index]) - len(lines[index].lstrip())
    keys = []
    for line in reversed(lines[:index]):
        if line.strip() and not line.lstrip().startswith("#"):
            depth = len(line) - len(line.lstrip())
            if depth < indent:
                keys.insert(0, line.strip().split(":")[0])
                indent = depth
    return ".".join(keys) if keys else lines[index].split(":")[0]


def landed_in(name: str, original: str, edited: str) -> set[str]:
    """The definitions of file `name` in which its edited text differs from the original."""
    before, after = original.splitlines(), edited.splitlines()
    changed = [j for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes()
               if tag != "equal" for j in range(j1, j2) if after[j].strip()]
    if not name.endswith(".py"):
        return {yaml_mapping(after, j) for j in changed}
    spans = python_definitions("\n".join(after))
    return {next((n for first, last, n in spans if first <= j + 1 <= last), f"line {j + 1}, in no definition")
            for j in changed}


def exists(name: str, definition: str) -> bool:
    """Whether the real file `name` has this top-level definition, or this dotted YAML mapping."""
    text = (ROOT / name).read_text()
    if name.endswith(".py"):
        return definition in {n for _, _, n in python_definitions(text)}
    node = yaml.safe_load(text)
    for key in definition.split("."):
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def add(repo: Path, edits: list[Edit]) -> set[tuple[str, str]]:
    """Each edit made in the scratch copy; the places (file, definition) the edits landed in, read back."""
    originals = {name: (repo / name).read_text() for name, _, _ in edits}
    for name, where, text in edits:
        path = repo / name
        source = path.read_text()
        match = re.search(where, source, re.S | re.M)
        assert match, f"{name}: no {where!r} to add after"
        path.write_text(source[: match.end()] + text + source[match.end():])
    return {(name, definition) for name, original in originals.items()
            for definition in landed_in(name, original, (repo / name).read_text())}


def check_places(heading: str, name: str, touched: set[tuple[str, str]]) -> None:
    """The places touched are exactly the doc's rows: each in a row, each row touched, and what a row names exists
    in the real code (but a definition the edits make, named after the throwaway)."""
    rows = doc_places(heading, name)
    unlisted = {(file, d) for file, d in touched if not any(file == f and d in names for f, names in rows)}
    assert not unlisted, f"{heading}: docs/architecture.md does not list these places the edits touched: {unlisted}"
    untouched = [(f, names) for f, names in rows if not any(file == f and d in names for file, d in touched)]
    assert not untouched, f"{heading}: docs/architecture.md lists places that adding one does not touch: {untouched}"
    missing = [(f, d) for f, names in rows for d in names if name not in d.lower() and not exists(f, d)]
    assert not missing, f"{heading}: docs/architecture.md names definitions the code does not have: {missing}"


def run_checks(repo: Path, script: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(repo)}
    run = subprocess.run([sys.executable, "-c", script], cwd=repo, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout.splitlines()


def knob_row(repo: Path, knob: str) -> str:
    """The README knob table's row for `knob`, as scripts/readme_tables.py writes it in the scratch copy."""
    readme = repo / "README.md"  # the knob table alone (the real one's headline tables read results/)
    readme.write_text("<!-- generated:knobs -->\n<!-- /generated:knobs -->\n")
    env = {**os.environ, "PYTHONPATH": str(repo)}
    proc = subprocess.run([sys.executable, "scripts/readme_tables.py"], cwd=repo, env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 0 and "rewrote knobs" in proc.stdout, proc.stdout + proc.stderr
    return next(line for line in readme.read_text().splitlines() if line.startswith(f"| `{knob}`"))


# ---- a knob --------------------------------------------------------------------------------------------------------

KNOB: list[Edit] = [
    ("benchlab/core/knobs.py", r'^Float8 = Literal\[.*?\]\n', 'Throwaway = Literal["plain", "marked"]\n'),
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
    ("params.yaml", r"^grad_accum: .*?\n", "throwaway: plain     # plain | marked\n"),
    ("params.yaml", r"^variants:\n", "  throwaway_on: {throwaway: marked}\n"),
    ("dvc.yaml", r"compile_scope, grad_accum", ", throwaway"),
]

KNOB_CHECKS = r'''
import torch
import yaml

from benchlab.core.errors import LabError
from benchlab.core.knobs import RunSettings, knobs_in_group, searched
from benchlab.core.params import load_params, parse_params
from benchlab.core.sections import OptimParams
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
apply(GPT(GPTConfig.from_name("tiny", vocab_size=64)), p.variants["throwaway_on"], torch.device("cpu"), OptimParams())
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


def test_a_knob_added_through_the_documented_places_works_everywhere(tmp_path: Path) -> None:
    copy_sources(tmp_path, COPIED)
    check_places("## Adding a knob", "throwaway", add(tmp_path, KNOB))
    # The work's row names the function of each step that apply_knobs.py holds, as STEP_FUNCTIONS does.
    work = next(names for file, names in doc_places("## Adding a knob", "throwaway") if file.endswith("apply_knobs.py"))
    assert work == {f.__name__ for f in apply_knobs.STEP_FUNCTIONS.values() if f.__module__ == apply_knobs.__name__}
    assert run_checks(tmp_path, KNOB_CHECKS) == [
        "throwaway: the work ran",
        "variants.bad.throwaway='bogus' is not valid; expected one of: plain, marked",
        "variants.bad.throwaway='marked' is not valid; expected plain with precision=fp16",
        "throwaway=marked prints on a CPU only",
        "['throwaway=marked']",
    ]
    assert knob_row(tmp_path, "throwaway") == (
        "| `throwaway` | `plain` \\| `marked` | `plain` | a throwaway knob: marked prints a line where the model is "
        "placed | 1. prints a line | marked: on CUDA. |")


# ---- a kernel of the attention knob ------------------------------------------------------------------------------

# The throwaway kernel calls one op of a library's (`throwaway::causal_mix`, registered by KERNEL_CHECKS as a
# library would be on import), as a kernel from outside torch does (flash-attn's, a Triton kernel's).
KERNEL: list[Edit] = [
    ("benchlab/core/attention_kernels.py", r'^Attention = Literal\[[^]]*', ', "throwaway"'),
    ("benchlab/core/attention_kernels.py", r"^ATTENTION_KERNELS: .*?\n(?=\}\n)",
     '    "throwaway": AttentionKernel("a library\'s op", saved_ops=("throwaway.causal_mix.default",),\n'
     '                                 kernel_names=("causal_mix",)),\n'),
    ("model/gpt.py", r"^def sdpa_attention\(.*?\n\n\n",
     "def throwaway_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, future: torch.Tensor | None)"
     " -> torch.Tensor:\n"
     '    """A library\'s causal attention op."""\n'
     "    return torch.ops.throwaway.causal_mix(q, k, v)\n\n\n"),
    ("model/gpt.py", r'^ATTENTION: .*?"sdpa": Kernel\(sdpa_attention\)', ', "throwaway": Kernel(throwaway_attention)'),
    ("params.yaml", r"^attention: [^\n]*", " | throwaway (a library's op)"),
    ("params.yaml", r"^variants:\n", "  attn_throwaway: {attention: throwaway}\n"),
]

KERNEL_CHECKS = r'''
import torch
import torch.nn.functional as F
import yaml
from typing import get_args

ran = []  # each time the library's op runs


@torch.library.custom_op("throwaway::causal_mix", mutates_args=())
def causal_mix(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    ran.append(q.shape)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def backward(ctx, grad):
    q, k, v = (t.detach().requires_grad_() for t in ctx.saved_tensors)
    with torch.enable_grad():
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return torch.autograd.grad(y, (q, k, v), grad)


causal_mix.register_autograd(backward, setup_context=lambda ctx, inputs, output: ctx.save_for_backward(*inputs))

from benchlab.core.attention_kernels import Attention
from benchlab.core.errors import LabError
from benchlab.core.knobs import RunSettings
from benchlab.core.params import load_params, parse_params
from benchlab.core.profile_table import family
from benchlab.core.sections import OptimParams
from benchlab.run.apply_knobs import apply
from benchlab.search.moves import Candidate, moves
from model.gpt import ATTENTION, GPT, GPTConfig

print(" ".join(get_args(Attention)))  # the knob's choices
assert load_params().variants["attn_throwaway"].attention == "throwaway"
data = yaml.safe_load(open("params.yaml"))
data["variants"]["bad"] = {"attention": "flash"}
try:
    parse_params(data)
except LabError as err:
    print(err)


def model(attention):
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, attention=attention))


# The same function as every other kernel: loss and gradients.
x = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(1))
models = {name: model(name) for name in ATTENTION}
losses = {name: m(x, x)[1] for name, m in models.items()}
for name in ATTENTION:
    torch.testing.assert_close(losses["throwaway"], losses[name], rtol=1e-5, atol=1e-6)
    losses[name].backward()
for name in ATTENTION:
    for p, q in zip(models["throwaway"].parameters(), models[name].parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)

# Selective checkpointing keeps the op's output: backward runs it again (once per block) under full only.
again = {}
for mode in ("full", "selective"):
    run = apply(model("throwaway"), RunSettings(attention="throwaway", activation_checkpointing=mode),
                torch.device("cpu"), OptimParams())
    _, loss = run.model(x, x)
    ran.clear()
    loss.backward()
    again[mode] = len(ran)
print(again)

# The profile's families: what the profiler records of the kernel is in the attention family.
q = k = v = torch.randn(1, 2, 16, 8)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    ATTENTION["throwaway"].forward(q, k, v, None)
print(sorted({(e.name, family(e.name)) for e in prof.events() if e.cpu_parent is None}))

# The search tries it.
print([c.name for c in moves(Candidate(), RunSettings(), "fastest", 8) if "throwaway" in c.name])
'''


def test_an_attention_kernel_added_through_the_documented_places_works_everywhere(tmp_path: Path) -> None:
    copy_sources(tmp_path, COPIED)
    check_places("### An attention kernel", "throwaway", add(tmp_path, KERNEL))
    choices, *shown = run_checks(tmp_path, KERNEL_CHECKS)
    assert choices.split() == [*ATTENTION_KERNELS, "throwaway"]
    assert shown == [
        f"variants.bad.attention='flash' is not valid; expected one of: {', '.join(choices.split())}",
        "{'full': 2, 'selective': 0}",
        "[('throwaway::causal_mix', 'attention')]",
        "['attention=throwaway']",
    ]
    assert listed_choices(knob_comments((tmp_path / "params.yaml").read_text())["attention"]) == choices.split()
    values = " \\| ".join(f"`{choice}`" for choice in choices.split())
    row = knob_row(tmp_path, "attention")
    assert row.startswith(f"| `attention` | {values} | `manual` | ") and "; throwaway: a library's op |" in row, row
