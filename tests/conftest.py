"""Shared fixtures: a small prepared corpus and micro params, all on CPU."""

import os
import shutil
from pathlib import Path

import pytest
import yaml

from benchlab.core import files, parent_watch
from benchlab.core.params import Params, parse_params
from benchlab.core.sections import DataParams
from benchlab.prep.corpus import prepare
from benchlab.run.data import load_tokens

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "data" / "corpus" / "python_docs.txt"

# Under mutmut's coverage pass ("stats"), a child process (a stage, a repeat) that inherits MUTANT_UNDER_TEST
# tries to record its calls, finds no mutmut configuration in its scratch folder and fails. Recording needs
# only this process's own copy of the setting, which mutmut keeps too, so the children run the code unmutated.
# For a mutant's own run the variable stays: the children then run the mutant as well.
if os.environ.get("MUTANT_UNDER_TEST") == "stats":
    del os.environ["MUTANT_UNDER_TEST"]


def copy_sources(repo: Path, names: list[str]) -> None:
    """The repository's files and folders named, copied into a scratch lab (no bytecode)."""
    for name in names:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, repo / name)


def micro_params(**overrides: object) -> dict:
    """params.yaml's content, shrunk so a run takes a second or two on CPU."""
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    data["data"]["vocab_size"] = 512
    data["shape"].update(batch_size=4, block_size=32)
    data["train"]["steps"] = 12
    data["harness"]["warmup_steps"] = 2
    data["bench"].update(steps=6, repeats=1)
    data["eval"]["batches"] = 2
    data["profile"]["steps"] = 1
    data["parity"].update(steps=8, tail_steps=2, variants=[])  # parity stages only where a test asks for them
    for dotted, value in overrides.items():
        node = data
        *parents, last = dotted.split("__")
        for key in parents:
            node = node[key]
        node[last] = value
    return data


# Collected first: these tests share one DVC lab that takes a minute or two to build. With `--dist loadfile`
# (.ci/run's integration selection) one worker takes the whole module and builds the lab once. Under `load`,
# pytest-xdist hands each worker a first batch of a quarter of the tests split in order, so in a selection of
# several hundred tests the first worker gets all of these; in the 84 integration tests alone the module splits
# over both workers and the lab is built twice. (xdist_group marks would say it directly, but under pytest 9 they
# no longer keep a group on one worker: xdist 3.8 renames `item._nodeid`, which pytest 9's `nodeid` ignores.)
FIRST = ("tests/integration/test_pipeline.py::",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not item.nodeid.startswith(FIRST))  # stable: the order within each part stays


@pytest.fixture(autouse=True, scope="session")
def no_lifeline_in_pytest() -> None:
    """A test that calls run_main in this process would arm the lifeline's process-wide parts here once: Linux's
    parent-death signal and the watcher thread. That thread then polls process_chain.orphaned every half second
    for the rest of the session, so a later test's stand-in saying "orphaned" made it SIGTERM and end the pytest
    worker (CI at fb6e08d: "worker 'gw1' crashed" in test_parent_watch). Marked armed already, this process never
    arms them; tests/unit/test_parent_watch.py's `arming` fixture clears the mark where it tests the arming."""
    parent_watch._state["started"] = True


@pytest.fixture(autouse=True)
def no_claimed_outputs() -> None:
    """A stage's main called directly (not through run_main) that failed leaves its claimed outputs registered in
    this process; the next test's stage must not commit them."""
    files.forget_outputs()


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 60 kB of the embedded corpus: real text, quick to tokenize."""
    path = tmp_path_factory.mktemp("corpus") / "small.txt"
    path.write_text(CORPUS.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def prepared(small_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prepared")
    prepare(DataParams(corpus=str(small_corpus), vocab_size=512), out)
    return out


@pytest.fixture()
def tokens(prepared: Path):
    return load_tokens(prepared)


@pytest.fixture()
def params() -> Params:
    return parse_params(micro_params())


@pytest.fixture()
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_corpus: Path) -> Path:
    """A scratch folder holding micro params.yaml, as the stages' working directory."""
    shutil.copy(small_corpus, tmp_path / "corpus.txt")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(micro_params(data__corpus="corpus.txt"), sort_keys=False))
    monkeypatch.chdir(tmp_path)
    return tmp_path
