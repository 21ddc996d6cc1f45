"""Saving and loading the trained model safely: tensors and plain values only, never pickled code, and a
checksum of the weights checked on every load.

A bit flipped or a run of bytes overwritten inside the weights leaves torch's zip container intact and
loads without complaint: the evaluation then records NaN, or a loss only slightly off. The checkpoint
therefore carries the sha256 of what it holds (the preset, the config and every tensor's name, dtype, shape
and bytes), and a load that computes another is refused.

It also carries the sha256 of the tokenizer its training data was made with (meta.json's tokenizer_sha256): token
ids mean nothing under another tokenizer, so evaluate refuses data prepared with any other.
"""

import hashlib
import json
import pickle
import zipfile
from dataclasses import asdict
from pathlib import Path

import torch

from benchlab.core.errors import LabError
from benchlab.core.files import atomic_path, disk_full
from model.gpt import GPT, GPTConfig

FORMAT = "benchlab-gpt-v3"  # v2: with the preset and the sha256 of the weights; v3: with the tokenizer's sha256
RETRAIN = "rerun `dvc repro train`"


def weights_sha256(preset: str, tokenizer_sha256: str, config: dict, state: dict[str, torch.Tensor]) -> str:
    """sha256 over the preset, the tokenizer's sha256, the config and each tensor's name, dtype, shape and bytes, in
    name order."""
    digest = hashlib.sha256(json.dumps([preset, tokenizer_sha256, config], sort_keys=True).encode())
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"\0{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())  # the raw bytes, whatever the dtype
    return digest.hexdigest()


def save_checkpoint(model: GPT, preset: str, tokenizer_sha256: str, path: str | Path) -> str:
    """Write the model atomically with the tokenizer of its data and its checksum; returns the checksum."""
    config, state = asdict(model.cfg), model.state_dict()
    sha256 = weights_sha256(preset, tokenizer_sha256, config, state)
    with atomic_path(path) as tmp:
        try:
            torch.save({"format": FORMAT, "preset": preset, "tokenizer_sha256": tokenizer_sha256, "config": config,
                        "model": state, "sha256": sha256}, tmp)
        except RuntimeError as err:  # torch's zip writer says only "unexpected pos" or "file write failed"
            raise disk_full(path, err) from None
    return sha256


def load_checkpoint(path: str | Path, data_vocab: int) -> tuple[GPT, dict]:
    """The GPT saved by the train stage, and what identifies it (preset, checksum, its data's tokenizer); refuses
    missing, foreign, corrupt or unsafe files."""
    path = Path(path)
    if not path.is_file():
        raise LabError(f"checkpoint {path} not found; {RETRAIN}")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; anything else is not ours
        raise LabError(f"checkpoint {path} is not a checkpoint this lab wrote (damaged or replaced); {RETRAIN}")
    try:
        # weights_only: a checkpoint carrying a malicious pickle cannot run code here.
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # torch's own message suggests weights_only=False, which would run whatever the file carries.
        raise LabError(f"checkpoint {path} holds objects other than tensors and plain values, so it was not "
                       f"loaded; {RETRAIN}") from None
    except (RuntimeError, zipfile.BadZipFile, EOFError, ValueError, KeyError):
        raise LabError(f"checkpoint {path} is not a checkpoint this lab wrote (damaged or replaced); {RETRAIN}") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise LabError(f"checkpoint {path} is not a {FORMAT} checkpoint from this lab's train stage; {RETRAIN}")
    try:
        sha256 = weights_sha256(ckpt["preset"], ckpt["tokenizer_sha256"], ckpt["config"], ckpt["model"])
    except (TypeError, KeyError, AttributeError, RuntimeError, ValueError):
        raise LabError(f"checkpoint {path} is not a checkpoint this lab wrote (damaged or replaced); {RETRAIN}") from None
    if sha256 != ckpt.get("sha256"):
        raise LabError(f"checkpoint {path} does not match the sha256 it carries: its weights are damaged; {RETRAIN}")
    try:
        model = GPT(GPTConfig(**ckpt["config"]))
        model.load_state_dict(ckpt["model"])
    except (TypeError, KeyError, RuntimeError, ValueError) as err:
        raise LabError(f"checkpoint {path} does not match the model ({mismatch(err)}); {RETRAIN}") from None
    if data_vocab > model.cfg.vocab_size:  # type: ignore[operator]
        raise LabError(f"checkpoint {path} knows {model.cfg.vocab_size} tokens but the data has {data_vocab}; {RETRAIN}")
    return model, {"model": ckpt["preset"], "checkpoint_sha256": sha256, "tokenizer_sha256": ckpt["tokenizer_sha256"]}


def mismatch(err: Exception) -> str:
    """The first line that says what does not fit: torch's load_state_dict opens with a header ("Error(s) in loading
    state_dict for GPT:") and names each mismatch on a line of its own below it."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith("Error(s) in loading state_dict"):
        lines = lines[1:]
    return (lines[0] if lines else type(err).__name__)[:200]
