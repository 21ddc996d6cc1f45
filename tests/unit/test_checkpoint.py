"""The trained model on disk: saved with the checksum of its weights, refused when damaged, named by evaluate.

The damaged, NaN and too-short-context cases, each with its message, are in tests/unit/test_bad_inputs.py.
"""

import json
import shutil
import zipfile
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from benchlab.core.errors import LabError
from benchlab.core.stage_main import run_main
from benchlab.run.checkpoint import load_checkpoint, save_checkpoint, weights_sha256
from model.gpt import GPT, GPTConfig
from stages import evaluate, train

TOK = "a" * 64  # a tokenizer's sha256
TRAIN_ARGS = ["prep", "checkpoints/model.pt", "metrics/train.json", "metrics/records/train.json", "plots/train.csv"]


def test_a_checkpoint_loads_back_with_its_preset_and_checksum(tmp_path: Path) -> None:
    model = GPT(GPTConfig.from_name("tiny", vocab_size=512))
    sha256 = save_checkpoint(model, "tiny", TOK, tmp_path / "model.pt")
    loaded, which = load_checkpoint(tmp_path / "model.pt", data_vocab=512)
    assert which == {"model": "tiny", "checkpoint_sha256": sha256, "tokenizer_sha256": TOK} and len(sha256) == 64
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]  # no temporary file left


def test_evaluate_records_which_model_it_measured(workdir: Path, prepared: Path) -> None:
    shutil.copytree(prepared, workdir / "prep")
    tokenizer = json.loads((workdir / "prep" / "meta.json").read_text())["tokenizer_sha256"]
    sha256 = save_checkpoint(GPT(GPTConfig.from_name("tiny", vocab_size=512)), "tiny", tokenizer,
                             workdir / "checkpoints" / "model.pt")
    run_main(evaluate.main, ["prep", "checkpoints/model.pt", "metrics/eval.json"])
    record = json.loads((workdir / "metrics" / "eval.json").read_text())
    assert record["model"] == "tiny" and record["checkpoint_sha256"] == sha256 and record["tokenizer_sha256"] == tokenizer
    assert record["val_loss"] > 0 and record["eval_tokens"] == 2 * 4 * 32


def test_a_validation_loss_that_is_not_finite_is_never_recorded(workdir: Path, prepared: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Training ends with finite losses, but the last update broke the weights: no result, no checkpoint."""
    shutil.copytree(prepared, workdir / "prep")
    monkeypatch.setenv("GIT_OPTIONAL_LOCKS", "0")  # in this process the stage's git status reads the checkout
    monkeypatch.setattr("benchlab.run.runner.evaluate", lambda *args, **kwargs: float("nan"))
    with pytest.raises(SystemExit) as stop:
        run_main(train.main, TRAIN_ARGS)
    assert stop.value.code == 2
    assert "training stopped: loss became nan at step 12" in capsys.readouterr().err
    assert not any(Path(p).exists() for p in TRAIN_ARGS[1:])


# ---------------------------------------------------------------- the checksum, here and not only through evaluate

def tiny_state() -> tuple[dict, dict[str, torch.Tensor]]:
    model = GPT(GPTConfig.from_name("tiny", vocab_size=512))
    return asdict(model.cfg), model.state_dict()


def test_the_checksum_covers_the_preset_the_config_and_each_tensor_s_name_dtype_shape_and_bytes() -> None:
    config, state = tiny_state()
    first = next(iter(state))
    base = weights_sha256("tiny", TOK, config, state)
    assert weights_sha256("tiny", TOK, dict(config), dict(state)) == base  # a value, not an identity
    assert weights_sha256("tiny", TOK, config, dict(reversed(list(state.items())))) == base  # in name order
    assert weights_sha256("tiny", TOK, dict(reversed(list(config.items()))), state) == base  # a loaded config's order
    flipped = state[first].clone()
    flipped.view(-1)[7] += 1e-3
    changed = {
        "preset": weights_sha256("gpt_small", TOK, config, state),
        "tokenizer": weights_sha256("tiny", "f" * 64, config, state),
        "config": weights_sha256("tiny", TOK, {**config, "n_layer": 3}, state),
        "name": weights_sha256("tiny", TOK, config, {**{k: v for k, v in state.items() if k != first}, first + "_": state[first]}),
        "dtype": weights_sha256("tiny", TOK, config, {**state, first: state[first].to(torch.float64)}),
        "shape": weights_sha256("tiny", TOK, config, {**state, first: state[first].reshape(-1)}),
        "bytes": weights_sha256("tiny", TOK, config, {**state, first: flipped}),
        "one tensor fewer": weights_sha256("tiny", TOK, config, {k: v for k, v in state.items() if k != first}),
    }
    assert all(len(digest) == 64 for digest in changed.values())
    assert len({base, *changed.values()}) == len(changed) + 1, changed


def test_a_name_and_its_shape_cannot_trade_places() -> None:
    """Fields are separated, so a name ending in a digit next to a shape cannot hash as another pair."""
    t = torch.zeros(2)
    assert weights_sha256("tiny", TOK, {}, {"a1": t}) != weights_sha256("tiny", TOK, {}, {"a": t})
    assert weights_sha256("tiny", TOK, {}, {"a": torch.zeros(1, 2)}) != weights_sha256("tiny", TOK, {}, {"a": torch.zeros(2, 1)})


def resaved(path: Path, change) -> None:
    """The checkpoint at `path` rewritten through torch.save after `change(ckpt)`: an intact zip."""
    ckpt = torch.load(path, weights_only=True)
    change(ckpt)
    torch.save(ckpt, path)


def bump_weight(ckpt: dict) -> None:
    name = next(iter(ckpt["model"]))
    ckpt["model"][name].view(-1)[0] += 0.01  # a plausible weight, one value off


@pytest.mark.parametrize("change, message", [
    (bump_weight, "does not match the sha256 it carries: its weights are damaged; rerun `dvc repro train`"),
    (lambda ckpt: ckpt.pop("sha256"), "does not match the sha256 it carries: its weights are damaged"),
    (lambda ckpt: ckpt.update(preset="gpt_small"), "does not match the sha256 it carries"),
    (lambda ckpt: ckpt.update(format="benchlab-gpt-v2"), "is not a benchlab-gpt-v3 checkpoint from this lab's train stage"),
    (lambda ckpt: ckpt.pop("config"), "is not a checkpoint this lab wrote (damaged or replaced)"),
    (lambda ckpt: ckpt.update(model=[1, 2]), "is not a checkpoint this lab wrote (damaged or replaced)"),
], ids=["a weight changed", "no checksum", "another preset", "another format", "no config", "no tensors"])
def test_a_checkpoint_edited_after_saving_is_refused(tmp_path: Path, change, message: str) -> None:
    path = tmp_path / "model.pt"
    save_checkpoint(GPT(GPTConfig.from_name("tiny", vocab_size=512)), "tiny", TOK, path)
    resaved(path, change)
    with pytest.raises(LabError) as err:
        load_checkpoint(path, data_vocab=512)
    assert str(err.value).startswith(f"checkpoint {path} ") and message in str(err.value)


def test_a_checkpoint_whose_config_and_weights_disagree_is_refused_with_its_first_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    save_checkpoint(GPT(GPTConfig.from_name("tiny", vocab_size=512)), "tiny", TOK, path)

    def wider(ckpt: dict) -> None:  # a consistent checksum over a config the weights do not fit
        ckpt["config"]["n_embd"] *= 2
        ckpt["sha256"] = weights_sha256(ckpt["preset"], ckpt["tokenizer_sha256"], ckpt["config"], ckpt["model"])

    resaved(path, wider)
    with pytest.raises(LabError) as err:
        load_checkpoint(path, data_vocab=512)
    text = str(err.value)
    assert text.startswith(f"checkpoint {path} does not match the model (size mismatch for wte.weight: copying a param "
                           "with shape torch.Size([512, 64]) from checkpoint")
    assert text.endswith("; rerun `dvc repro train`") and "\n" not in text


def a_zip_but_not_torch_s(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("notes.txt", "hello")


@pytest.mark.parametrize("write, message", [
    (None, "not found; rerun `dvc repro train`"),
    (lambda path: path.write_bytes(b"not a zip"),
     "is not a checkpoint this lab wrote (damaged or replaced); rerun `dvc repro train`"),
    (a_zip_but_not_torch_s, "is not a checkpoint this lab wrote (damaged or replaced); rerun `dvc repro train`"),
], ids=["missing", "not a zip", "a zip not torch's"])
def test_a_missing_or_foreign_file_is_refused(tmp_path: Path, write, message: str) -> None:
    path = tmp_path / "model.pt"
    if write is not None:
        write(path)
    with pytest.raises(LabError) as err:
        load_checkpoint(path, data_vocab=512)
    assert str(err.value) == f"checkpoint {path} {message}"


def test_a_checkpoint_carrying_code_is_never_unpickled(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.save({"format": "benchlab-gpt-v3", "payload": Path("x")}, path)  # a class torch's safe loader refuses
    with pytest.raises(LabError) as err:
        load_checkpoint(path, data_vocab=512)
    assert str(err.value) == (f"checkpoint {path} holds objects other than tensors and plain values, so it was not "
                              "loaded; rerun `dvc repro train`")


def test_data_with_more_tokens_than_the_checkpoint_knows_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    save_checkpoint(GPT(GPTConfig.from_name("tiny", vocab_size=512)), "tiny", TOK, path)
    load_checkpoint(path, data_vocab=512)  # as many: fine
    with pytest.raises(LabError) as err:
        load_checkpoint(path, data_vocab=513)
    assert str(err.value) == f"checkpoint {path} knows 512 tokens but the data has 513; rerun `dvc repro train`"


def test_a_write_torch_cannot_finish_names_the_checkpoint_and_the_limit(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's zip writer says only "unexpected pos"; the stage's line names the file and what to do."""
    def short_write(obj: object, f: object) -> None:
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 448 vs 342")

    monkeypatch.setattr("benchlab.run.checkpoint.torch.save", short_write)
    path = tmp_path / "checkpoints" / "model.pt"
    with pytest.raises(LabError) as err:
        save_checkpoint(GPT(GPTConfig.from_name("tiny", vocab_size=512)), "tiny", TOK, path)
    assert str(err.value).startswith(f"writing {path} failed: the write stopped short ([enforce fail at "
                                     "inline_container.cc:603] . unexpected pos 448 vs 342)")
    assert not path.exists() and list(path.parent.iterdir()) == []
