"""Streaming prepare: the tokens of whole-file encoding, bounded memory, clean failures (readers: test_formats.py)."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from benchlab.core.errors import LabError
from benchlab.core.sections import DataParams
from benchlab.prep.corpus import new_tokenizer, prepare
from benchlab.run.data import load_tokens
from tests.conftest import CORPUS, ROOT

EOT = "<|endoftext|>"


def all_tokens(folder: Path) -> np.ndarray:
    data = load_tokens(folder)
    return np.concatenate([data.train, data.val])


def documents(n: int = 40) -> list[str]:
    """Slices of the embedded corpus, cut at line ends, as separate documents."""
    lines = CORPUS.read_text(encoding="utf-8")[:80_000].splitlines(keepends=True)
    return ["".join(lines[i :: n]) for i in range(n)]


def test_streaming_gives_the_tokens_of_whole_file_encoding(tmp_path: Path) -> None:
    texts = [CORPUS.read_text(encoding="utf-8")[:50_000], "second file\n\n  indented\n" * 300]
    for i, text in enumerate(texts):
        (tmp_path / f"{i}.txt").write_text(text, encoding="utf-8")
    # The whole-file way (the code before streaming): train on whole texts, encode each, end-of-text after each.
    tok, trainer = new_tokenizer(512, EOT)
    tok.train_from_iterator(texts, trainer=trainer)
    expected = [t for text in texts for t in tok.encode(text).ids + [tok.token_to_id(EOT)]]

    meta = prepare(DataParams(corpus=str(tmp_path), vocab_size=512, tokenizer_sample_bytes=0), tmp_path / "out",
                   piece_bytes=2048, batch_bytes=8192)  # hundreds of pieces and batches
    assert all_tokens(tmp_path / "out").tolist() == expected
    assert Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json")).to_str() == tok.to_str()
    assert meta["tokenizer_sample"] == "whole corpus" and meta["corpus_documents"] == 2


def test_a_literal_end_of_text_in_the_text_round_trips(tmp_path: Path) -> None:
    text = f"first part {EOT} still the same document\nsecond line <|endoftext|>\n"
    (tmp_path / "c.txt").write_text(text * 20)
    prepare(DataParams(corpus=str(tmp_path / "c.txt"), vocab_size=300, val_fraction=0.1), tmp_path / "out")
    tokens = all_tokens(tmp_path / "out").tolist()
    tok = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    eot = tok.token_to_id(EOT)
    assert tokens.count(eot) == 1 and tokens[-1] == eot  # one document, one boundary
    assert tok.decode(tokens[:-1]) == text * 20


def big_vocab_tokenizer(path: Path, size: int) -> None:
    """A byte-level tokenizer whose end-of-text id is size - 1, past what uint16 holds."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)} | {f"unused{i}": i for i in range(len(alphabet), size - 1)}
    tok = Tokenizer(models.BPE(vocab | {EOT: size - 1}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.add_special_tokens([EOT])
    tok.save(str(path))


def test_token_dtype_follows_the_vocabulary(tmp_path: Path, prepared: Path) -> None:
    big_vocab_tokenizer(tmp_path / "big.json", 70_000)
    for doc in range(3):
        (tmp_path / "docs").mkdir(exist_ok=True)
        (tmp_path / "docs" / f"{doc}.txt").write_text(documents(3)[doc])
    meta = prepare(DataParams(corpus=str(tmp_path / "docs"), tokenizer=str(tmp_path / "big.json")), tmp_path / "out")
    data = load_tokens(tmp_path / "out")
    assert meta["dtype"] == "uint32" and data.train.dtype == np.uint32 and data.vocab_size == 70_000
    assert int(np.concatenate([data.train, data.val]).max()) == 69_999  # the end-of-text ids survive
    assert json.loads((prepared / "meta.json").read_text())["dtype"] == "uint16"
    meta_path = tmp_path / "out" / "meta.json"
    meta_path.write_text(json.dumps(json.loads(meta_path.read_text()) | {"dtype": "uint16"}))
    with pytest.raises(LabError, match="says dtype uint16 but a vocabulary of 70000 is stored as uint32"):
        load_tokens(tmp_path / "out")


def generated_corpus(path: Path, size: int, seed: int = 0) -> Path:
    """Lines of the embedded corpus in a seeded random order, `size` bytes of them."""
    lines = CORPUS.read_bytes().splitlines(keepends=True)
    rng, written = random.Random(seed), 0
    with path.open("wb") as f:
        while written < size:
            rng.shuffle(lines)
            chunk = b"".join(lines)[: size - written]
            chunk = chunk[: chunk.rfind(b"\n") + 1]
            f.write(chunk)
            written += len(chunk)
    return path


def test_a_bad_byte_late_in_a_large_file_stops_before_any_output(tmp_path: Path) -> None:
    corpus = generated_corpus(tmp_path / "big.txt", 8_000_000)
    offset = corpus.stat().st_size - 1000
    with corpus.open("r+b") as f:
        f.seek(offset)
        f.write(b"\xff")
    start = time.perf_counter()
    with pytest.raises(LabError, match=rf"big.txt is not UTF-8 text \(invalid start byte at byte {offset}\)"):
        prepare(DataParams(corpus=str(corpus), vocab_size=300, tokenizer_sample_bytes=200_000), tmp_path / "out")
    assert time.perf_counter() - start < 20  # found while scanning, not after encoding
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []  # not even a temporary file


PREPARE_CHILD = """
import resource, sys
from benchlab.core.sections import DataParams
from benchlab.prep.corpus import prepare
prepare(DataParams(corpus=sys.argv[1], vocab_size=512, tokenizer_sample_bytes=500_000), sys.argv[2], batch_bytes=1 << 20)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def child(corpus: Path, out: Path) -> subprocess.Popen:
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", PREPARE_CHILD, str(corpus), str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_killing_prepare_half_way_leaves_nothing_load_tokens_accepts(tmp_path: Path, prepared: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for f in prepared.iterdir():  # a complete earlier prepare is being redone
        (out / f.name).write_bytes(f.read_bytes())
    proc = child(generated_corpus(tmp_path / "c.txt", 6_000_000), out)
    deadline = time.monotonic() + 60
    while not any(p.name.startswith(".train.bin.tmp") and p.stat().st_size > 0 for p in out.iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with pytest.raises(LabError, match="meta.json is missing"):
        load_tokens(out)


# ---------------------------------------------------------------- issue 34: exhausted machines


# The prepare stage in a child process, under a limit set after its imports (so that they always fit).
LIMITED_PREPARE = """
import resource, signal, sys
from benchlab.core.stage_main import run_main
from stages import prepare
kind, extra = sys.argv[1], int(sys.argv[2])
if kind == "memory":  # extra: bytes of address space beyond what the imports took
    vm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmSize:")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + extra, vm + extra))
else:  # a file-size limit stands for a full disk: SIGXFSZ ignored, a write past it fails with EFBIG
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (extra, extra))
run_main(prepare.main, ["prep"])
"""


def prepare_limited(kind: str, extra: int, cwd: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-c", LIMITED_PREPARE, kind, str(extra)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_full_disk_during_prepare_is_one_line_and_leaves_nothing(workdir: Path) -> None:
    proc = prepare_limited("disk", 10_000, workdir)  # train.bin is ~40 kB
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: writing prep/train.bin failed: the write stopped short") and "ulimit -f" in last
    assert not (workdir / "prep").exists()


@pytest.mark.parametrize("headroom_mb", [16, 64])
def test_prepare_out_of_memory_leaves_no_temporary_file(workdir: Path, headroom_mb: int) -> None:
    """Where Python gets control (a thread it cannot start, a MemoryError) one line says so; where the
    tokenizer's Rust allocator aborts the process, nothing is left behind either."""
    proc = prepare_limited("memory", headroom_mb << 20, workdir)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    if proc.returncode == 2:
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("error: ") and "ulimit -v" in last and last.endswith("nothing recorded"), last
    else:
        assert proc.returncode == -signal.SIGABRT, proc.stderr
    assert not (workdir / "prep").exists() or not list((workdir / "prep").iterdir())


def test_a_memory_error_in_prepare_is_one_line(workdir: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from benchlab.core.stage_main import run_main
    from stages import prepare as stage

    def no_memory(*args: object) -> None:
        raise MemoryError

    monkeypatch.setattr("benchlab.prep.corpus.split_tail", no_memory)  # after train.bin is written
    with pytest.raises(SystemExit) as stop:
        run_main(stage.main, ["prep"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: out of memory: raise the memory limit (ulimit -v) or free memory; nothing recorded")
    assert not (workdir / "prep").exists()


def test_a_second_prepare_into_the_same_folder_leaves_the_first_alone(workdir: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Before, the second deleted the first's folder half way and the first died with a traceback."""
    from benchlab.core.stage_main import run_main
    from stages import prepare as stage

    monkeypatch.setenv("BENCHLAB_LOCK_DIR", str(workdir))
    generated_corpus(workdir / "corpus.txt", 3_000_000)
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    first = subprocess.Popen([sys.executable, "-m", "stages.prepare", "prep"], cwd=workdir, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not any("(prepare, since" in p.read_text() for p in workdir.glob("benchlab-out-*.lock")):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.05)
        with pytest.raises(SystemExit) as stop:
            run_main(stage.main, ["prep"])
        assert stop.value.code == 2
        assert f"error: prep is being written by pid {first.pid} (prepare, since " in capsys.readouterr().err
        _, err = first.communicate(timeout=300)
    finally:
        first.kill()
        first.wait()
    assert first.returncode == 0, err
    assert len(load_tokens(workdir / "prep").train) > 0
