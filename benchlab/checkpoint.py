"""Loading a checkpoint safely: tensors and plain values only, never pickled code."""

import pickle
import zipfile
from pathlib import Path

import torch

from benchlab.errors import LabError
from model.gpt import GPT, GPTConfig

FORMAT = "benchlab-gpt-v1"
RETRAIN = "rerun `dvc repro train`"


def load_checkpoint(path: str | Path, data_vocab: int) -> GPT:
    """The GPT saved by the train stage; refuses missing, foreign, corrupt or unsafe files."""
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
        model = GPT(GPTConfig(**ckpt["config"]))
        model.load_state_dict(ckpt["model"])
    except (TypeError, KeyError, RuntimeError, ValueError) as err:
        raise LabError(f"checkpoint {path} does not match the model ({str(err).splitlines()[0]}); {RETRAIN}") from None
    if data_vocab > model.cfg.vocab_size:  # type: ignore[operator]
        raise LabError(f"checkpoint {path} knows {model.cfg.vocab_size} tokens but the data has {data_vocab}; {RETRAIN}")
    return model
