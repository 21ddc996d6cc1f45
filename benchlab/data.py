"""Corpus to tokens, and tokens back to training batches.

`prepare` trains a byte-level BPE tokenizer (the `tokenizers` library) on the
corpus, encodes it, splits it into train and validation, and writes flat
uint16 token files plus a meta JSON. `load_tokens` memory-maps those files
and checks them against the meta (size, sha256, token range) so a truncated
or edited file is caught before any training.
"""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchlab.errors import LabError
from benchlab.io import atomic_path, write_json

TOKEN_DTYPE = np.uint16
EOT = "<|endoftext|>"
RERUN = "rerun `dvc repro prepare` (or `python -m stages.prepare`) to rebuild it"


def corpus_files(path: str | Path) -> list[Path]:
    """The corpus's files: the file itself, or a folder's *.txt files in sorted order."""
    path = Path(path)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise LabError(f"data.corpus={str(path)!r} is a folder with no *.txt files; put UTF-8 text files in it")
        return files
    raise LabError(f"data.corpus={str(path)!r} does not exist; point it at a UTF-8 text file or a folder of *.txt files")


def read_corpus(path: str | Path) -> tuple[list[str], str, int]:
    """Each file's text, and sha256 and size over the files' bytes in read order.

    Refuses empty, binary and non-UTF-8 input.
    """
    texts, digest, size = [], hashlib.sha256(), 0
    for file in corpus_files(path):
        raw = file.read_bytes()
        if b"\x00" in raw:
            raise LabError(f"{file} holds NUL bytes: it is binary, not text; data.corpus needs UTF-8 text")
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            raise LabError(f"{file} is not UTF-8 text ({err.reason} at byte {err.start}); convert it or pick another data.corpus") from None
        digest.update(raw)
        size += len(raw)
    if not any(t.strip() for t in texts):
        raise LabError(f"data.corpus={str(path)!r} is empty; it needs text to train on")
    return texts, digest.hexdigest(), size


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer trained on `texts`: every byte string round-trips."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def encode(tok, texts: list[str]) -> np.ndarray:
    """All texts as one token stream, each followed by the end-of-text token."""
    eot = tok.token_to_id(EOT)
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eot)
    return np.asarray(ids, dtype=TOKEN_DTYPE)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def prepare(corpus: str | Path, vocab_size: int, val_fraction: float, out_dir: str | Path) -> dict:
    """Tokenize the corpus into out_dir/{train.bin,val.bin,tokenizer.json,meta.json}; returns the meta."""
    out = Path(out_dir)
    texts, sha, size = read_corpus(corpus)
    tok = train_tokenizer(texts, vocab_size)
    tokens = encode(tok, texts)
    n_val = int(len(tokens) * val_fraction)
    if n_val < 2 or len(tokens) - n_val < 2:
        raise LabError(f"data.corpus gives only {len(tokens)} tokens; too few to split, bring more text")
    out.mkdir(parents=True, exist_ok=True)
    splits = {"train": tokens[: len(tokens) - n_val], "val": tokens[len(tokens) - n_val :]}
    meta: dict = {
        "corpus": str(corpus), "corpus_sha256": sha, "corpus_bytes": size,
        "tokenizer": "byte-level BPE (tokenizers)", "tokenizer_vocab_size": tok.get_vocab_size(),
        "eot_id": tok.token_to_id(EOT), "dtype": np.dtype(TOKEN_DTYPE).name,
    }
    for name, arr in splits.items():
        with atomic_path(out / f"{name}.bin") as tmp:
            arr.tofile(tmp)
        meta[f"{name}_tokens"] = int(len(arr))
        meta[f"{name}_sha256"] = file_sha256(out / f"{name}.bin")
    with atomic_path(out / "tokenizer.json") as tmp:
        tok.save(str(tmp))
    write_json(out / "meta.json", meta)  # last: its presence marks a complete prepare
    return meta


@dataclass(frozen=True)
class TokenData:
    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    meta: dict


def _load_split(folder: Path, name: str, meta: dict, vocab: int) -> np.ndarray:
    path = folder / f"{name}.bin"
    if not path.is_file():
        raise LabError(f"{path} is missing; {RERUN}")
    itemsize = np.dtype(meta["dtype"]).itemsize
    expected = meta[f"{name}_tokens"] * itemsize
    if path.stat().st_size != expected:
        raise LabError(f"{path} has {path.stat().st_size} bytes but meta.json says {expected}: truncated or replaced; {RERUN}")
    if file_sha256(path) != meta[f"{name}_sha256"]:
        raise LabError(f"{path} does not match the sha256 in meta.json: corrupted or edited; {RERUN}")
    arr = np.memmap(path, dtype=meta["dtype"], mode="r")
    if len(arr) and int(arr.max()) >= vocab:
        raise LabError(f"{path} holds token ids >= the vocabulary size {vocab}; {RERUN}")
    return arr


def load_tokens(folder: str | Path) -> TokenData:
    """Memory-map the prepared splits after checking them against meta.json."""
    folder = Path(folder)
    meta_path = folder / "meta.json"
    if not meta_path.is_file():
        raise LabError(f"{meta_path} is missing; {RERUN}")
    try:
        meta = json.loads(meta_path.read_text())
        vocab = int(meta["tokenizer_vocab_size"])
        np.dtype(meta["dtype"])
        meta["train_tokens"], meta["val_tokens"], meta["train_sha256"], meta["val_sha256"]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise LabError(f"{meta_path} is not a valid meta file ({err}); {RERUN}") from None
    return TokenData(_load_split(folder, "train", meta, vocab), _load_split(folder, "val", meta, vocab), vocab, meta)


def check_fits(tokens: np.ndarray, block_size: int, split: str) -> None:
    """A window needs block_size + 1 tokens (inputs plus the shifted targets)."""
    if len(tokens) < block_size + 1:
        raise LabError(
            f"train.block_size={block_size} is longer than the {split} split ({len(tokens)} tokens); "
            f"lower train.block_size below {len(tokens)} or bring a larger data.corpus"
        )


def batch_at(tokens: np.ndarray, starts: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets for windows starting at `starts`: two (B, T) int64 tensors."""
    rows = [torch.from_numpy(tokens[s : s + block_size + 1].astype(np.int64)) for s in starts.tolist()]
    window = torch.stack(rows)  # (B, T+1)
    return window[:, :-1].contiguous(), window[:, 1:].contiguous()


class BatchStream:
    """Random training windows in an order fixed by the seed, the same on every device."""

    def __init__(self, tokens: np.ndarray, batch_size: int, block_size: int, seed: int) -> None:
        check_fits(tokens, block_size, "train")
        self.tokens, self.batch_size, self.block_size = tokens, batch_size, block_size
        self.gen = torch.Generator().manual_seed(seed)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        high = len(self.tokens) - self.block_size
        starts = torch.randint(0, high, (self.batch_size,), generator=self.gen)
        return batch_at(self.tokens, starts, self.block_size)


def eval_batches(tokens: np.ndarray, batches: int, batch_size: int, block_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed set of validation windows, evenly spaced over the split."""
    check_fits(tokens, block_size, "validation")
    n = batches * batch_size
    starts = torch.linspace(0, len(tokens) - block_size - 1, n).long()
    return [batch_at(tokens, starts[i : i + batch_size], block_size) for i in range(0, n, batch_size)]
