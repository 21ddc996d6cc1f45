"""prepare: a real tokenizer, deterministic output, and files checked before use."""

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from benchlab.core.errors import LabError
from benchlab.core.files import file_sha256
from benchlab.core.sections import DataParams
from benchlab.prep.corpus import prepare
from benchlab.run.data import RERUN, BatchStream, eval_batches, load_tokens


def test_tokenizer_round_trips_any_text(prepared: Path) -> None:
    tok = Tokenizer.from_file(str(prepared / "tokenizer.json"))
    for text in ["def f(x):\n    return x ** 2\n", "naïve café — ünïcödé ✓ 数字", "  spaces\t\ttabs\r\n"]:
        assert tok.decode(tok.encode(text).ids) == text


def test_prepare_is_deterministic(small_corpus: Path, prepared: Path, tmp_path: Path) -> None:
    prepare(DataParams(corpus=str(small_corpus), vocab_size=512), tmp_path)
    for name in ("train.bin", "val.bin", "meta.json", "tokenizer.json"):
        assert (tmp_path / name).read_bytes() == (prepared / name).read_bytes(), name


def test_split_sizes_and_meta(prepared: Path, small_corpus: Path) -> None:
    meta = json.loads((prepared / "meta.json").read_text())
    total = meta["train_tokens"] + meta["val_tokens"]
    assert meta["val_tokens"] == int(total * 0.1)
    assert (prepared / "train.bin").stat().st_size == 2 * meta["train_tokens"]
    assert meta["corpus_bytes"] == small_corpus.stat().st_size
    assert meta["tokenizer_vocab_size"] == 512 and meta["dtype"] == "uint16"
    data = load_tokens(prepared)
    assert len(data.train) == meta["train_tokens"] and int(data.train.max()) < 512


def test_folder_corpus_reads_txt_files_in_sorted_order(tmp_path: Path, small_corpus: Path) -> None:
    folder = tmp_path / "texts"
    folder.mkdir()
    text = small_corpus.read_text()
    (folder / "b.txt").write_text(text[20_000:40_000])
    (folder / "a.txt").write_text(text[:20_000])
    (folder / "ignored.bin").write_bytes(b"\x00\x01")
    meta = prepare(DataParams(corpus=str(folder), vocab_size=300), tmp_path / "out")
    assert meta["corpus_bytes"] == len(text[:40_000].encode())


def test_batches_follow_the_seed_and_shift_targets(tokens) -> None:
    a = BatchStream(tokens.train, 4, 16, seed=7)
    b = BatchStream(tokens.train, 4, 16, seed=7)
    xa, ya = a.next()
    xb, yb = b.next()
    assert xa.shape == (4, 16) and xa.dtype.is_floating_point is False
    assert xa.equal(xb) and ya.equal(yb)
    assert xa[:, 1:].equal(ya[:, :-1])  # targets are the inputs shifted by one
    val = eval_batches(tokens.val, 2, 4, 16)
    assert len(val) == 2 and val[0][0].shape == (4, 16)


def _copy(prepared: Path, tmp_path: Path) -> Path:
    out = tmp_path / "p"
    out.mkdir()
    for f in prepared.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    return out


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "train.bin").write_bytes((d / "train.bin").read_bytes()[:-10]), "truncated or replaced"),
    (lambda d: (d / "val.bin").write_bytes(b"\x01\x00" + (d / "val.bin").read_bytes()[2:]), "corrupted or edited"),
    (lambda d: (d / "meta.json").write_text("{not json"), "not a valid meta file"),
    (lambda d: (d / "meta.json").unlink(), "meta.json is missing"),
    (lambda d: (d / "train.bin").unlink(), "train.bin is missing"),
])
def test_damaged_token_files_say_to_rerun_prepare(prepared: Path, tmp_path: Path, damage, message: str) -> None:
    folder = _copy(prepared, tmp_path)
    damage(folder)
    with pytest.raises(LabError, match=message) as err:
        load_tokens(folder)
    assert "dvc repro prepare" in str(err.value)


def test_token_ids_beyond_the_vocabulary_are_caught(prepared: Path, tmp_path: Path) -> None:
    folder = _copy(prepared, tmp_path)
    meta = json.loads((folder / "meta.json").read_text())
    arr = np.fromfile(folder / "val.bin", dtype=np.uint16)
    arr[0] = 60000
    arr.tofile(folder / "val.bin")
    meta["val_sha256"] = file_sha256(folder / "val.bin")
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(LabError, match="token ids >= the vocabulary size 512"):
        load_tokens(folder)


def test_validation_windows_span_the_split_from_its_first_token_to_its_last() -> None:
    tokens = np.arange(50, dtype=np.uint16)
    batches = eval_batches(tokens, batches=2, batch_size=3, block_size=8)
    assert len(batches) == 2 and all(x.shape == (3, 8) and y.shape == (3, 8) for x, y in batches)
    assert batches[0][0][0].tolist() == list(range(8)) and batches[0][1][0].tolist() == list(range(1, 9))
    assert batches[-1][1][-1].tolist() == list(range(42, 50))  # the last target is the split's last token
    assert eval_batches(np.arange(9, dtype=np.uint16), 1, 1, 8)[0][1].tolist() == [list(range(1, 9))]  # just fits


def test_a_split_one_token_short_of_a_window_names_the_split_and_the_fix() -> None:
    with pytest.raises(LabError) as err:
        eval_batches(np.arange(8, dtype=np.uint16), 1, 1, 8)
    assert str(err.value) == ("shape.block_size=8 is longer than the validation split (8 tokens); lower "
                              "shape.block_size below 8 or bring a larger data.corpus")


def _prepared_by_hand(folder: Path, train: np.ndarray, val: np.ndarray, vocab: int, **meta_changes: object) -> Path:
    """A prepared folder written directly: token files and the meta prepare would write for them."""
    folder.mkdir(exist_ok=True)
    train.tofile(folder / "train.bin")
    val.tofile(folder / "val.bin")
    meta = {"tokenizer_vocab_size": vocab, "dtype": train.dtype.name, "train_tokens": len(train),
            "val_tokens": len(val), "train_sha256": file_sha256(folder / "train.bin"),
            "val_sha256": file_sha256(folder / "val.bin"), **meta_changes}
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def test_a_prepared_folder_loads_at_the_edges_of_its_vocabulary(tmp_path: Path) -> None:
    ids = np.array([0, 1, 65535, 7], dtype=np.uint16)  # the largest id a 65,536-token vocabulary has
    data = load_tokens(_prepared_by_hand(tmp_path / "a", ids, ids[:2], 65536))
    assert data.train.tolist() == ids.tolist() and data.val.tolist() == [0, 1] and data.vocab_size == 65536
    assert data.meta["train_tokens"] == 4 and data.meta["val_tokens"] == 2  # the meta rides along
    with pytest.raises(LabError, match="a vocabulary of 65537 is stored as uint32"):
        load_tokens(_prepared_by_hand(tmp_path / "c", ids, ids, 65537))
    wide = np.array([70_000, 3], dtype=np.uint32)
    assert load_tokens(_prepared_by_hand(tmp_path / "b", wide, wide, 70_001)).train.dtype == np.uint32


@pytest.mark.parametrize("case, message", [
    ("no train.bin", "{f}/train.bin is missing; {rerun}"),
    ("odd bytes", "{f}/train.bin has 7 bytes, not a whole number of uint16 tokens (2 bytes each): truncated or "
                  "replaced; {rerun}"),
    ("count as text", "{f}/meta.json gives train_tokens='3', not a count of tokens; {rerun}"),
    ("count as bool", "{f}/meta.json gives val_tokens=True, not a count of tokens; {rerun}"),
    ("negative count", "{f}/meta.json gives train_tokens=-1, not a count of tokens; {rerun}"),
    ("short of meta", "{f}/train.bin has 6 bytes but meta.json says 8: truncated or replaced; {rerun}"),
    ("empty", "{f}/val.bin holds no tokens: the corpus was too small or the file was emptied; {rerun} from a "
              "larger data.corpus"),
    ("edited", "{f}/train.bin does not match the sha256 in meta.json: corrupted or edited; {rerun}"),
    ("id past vocabulary", "{f}/train.bin holds token ids >= the vocabulary size 9; {rerun}"),
    ("no meta", "{f}/meta.json is missing; {rerun}"),
    ("meta without a key", "{f}/meta.json is not a valid meta file ('val_sha256'); {rerun}"),
    ("dtype too narrow", "{f}/meta.json says dtype uint16 but a vocabulary of 70000 is stored as uint32; {rerun}"),
])
def test_each_damaged_prepared_file_gets_its_own_message(tmp_path: Path, case: str, message: str) -> None:
    ids = np.array([1, 2, 3], dtype=np.uint16)
    f = _prepared_by_hand(tmp_path / "p", ids, ids, 10)
    meta = json.loads((f / "meta.json").read_text())
    if case == "no train.bin":
        (f / "train.bin").unlink()
    elif case == "odd bytes":
        (f / "train.bin").write_bytes(b"\x01" * 7)
    elif case == "count as text":
        meta["train_tokens"] = "3"
    elif case == "count as bool":
        meta["val_tokens"] = True
    elif case == "negative count":
        meta["train_tokens"] = -1
    elif case == "short of meta":
        meta["train_tokens"] = 4
    elif case == "empty":
        f = _prepared_by_hand(tmp_path / "e", ids, ids[:0], 10)
    elif case == "edited":
        (f / "train.bin").write_bytes(np.array([3, 2, 1], dtype=np.uint16).tobytes())
    elif case == "id past vocabulary":
        f = _prepared_by_hand(tmp_path / "v", np.array([1, 9], dtype=np.uint16), ids, 9)
    elif case == "no meta":
        (f / "meta.json").unlink()
    elif case == "meta without a key":
        del meta["val_sha256"]
    elif case == "dtype too narrow":
        meta["tokenizer_vocab_size"] = 70_000
    if case in ("count as text", "count as bool", "negative count", "short of meta", "meta without a key",
                "dtype too narrow"):
        (f / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(LabError) as err:
        load_tokens(f)
    assert str(err.value) == message.format(f=f, rerun=RERUN)


def test_training_windows_reach_the_split_s_last_token_and_no_further() -> None:
    tokens = np.arange(10, dtype=np.uint16)  # windows of 8 + 1 tokens can start at 0 or 1
    stream = BatchStream(tokens, 4, 8, seed=0)
    firsts = {int(x[i, 0]) for x, _ in (stream.next() for _ in range(20)) for i in range(4)}
    assert firsts == {0, 1}
    x, y = BatchStream(tokens[:9], 2, 8, seed=3).next()  # exactly one window fits
    with pytest.raises(LabError) as err:
        BatchStream(tokens[:8], 2, 8, seed=3)
    assert str(err.value) == ("shape.block_size=8 is longer than the train split (8 tokens); lower shape.block_size "
                              "below 8 or bring a larger data.corpus")
    assert x.tolist() == [list(range(8))] * 2 and y.tolist() == [list(range(1, 9))] * 2
