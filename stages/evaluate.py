"""Stage evaluate: validation loss and perplexity of the trained checkpoint, in fp32.

The result names the model it measured (its preset, the checkpoint's sha256 and its data's tokenizer), a checkpoint
trained on data from another tokenizer is refused, and a loss that is not a finite number is never recorded.
"""

import benchlab.core.parent_watch  # noqa: F401  first: arms the lifeline before torch loads (benchlab/core/parent_watch.py)

import argparse
import math

from benchlab.run.checkpoint import load_checkpoint
from benchlab.core.params import load_params
from benchlab.run.data import load_tokens
from benchlab.core.stage_main import run_main
from benchlab.core.errors import LabError
from benchlab.core.files import claim_outputs, commit_outputs, write_json
from benchlab.run.hardware import resolve_device
from benchlab.run.runner import evaluate


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("data_dir")
    ap.add_argument("checkpoint")
    ap.add_argument("metrics")
    args = ap.parse_args(argv)
    claim_outputs(args.metrics)
    p = load_params()
    device = resolve_device(p.device)
    data = load_tokens(args.data_dir)
    model, which = load_checkpoint(args.checkpoint, data.vocab_size)
    if which["model"] != p.model:  # its loss would be recorded as model=p.model's
        raise LabError(f"{args.checkpoint} holds a model={which['model']} checkpoint, but params.yaml says "
                       f"model={p.model}; rerun `dvc repro train` (it trains model={p.model}), or set "
                       f"model={which['model']}")
    if which["tokenizer_sha256"] != data.meta.get("tokenizer_sha256", ""):  # the same ids would stand for other text
        raise LabError(f"{args.checkpoint} was trained on data from another tokenizer (sha256 "
                       f"{which['tokenizer_sha256'][:12]}) than {args.data_dir} holds "
                       f"({data.meta.get('tokenizer_sha256', '')[:12]}, vocabulary {data.vocab_size}); rerun `dvc repro train` "
                       "on this data, or prepare the data it was trained on (data.vocab_size, data.tokenizer)")
    if p.shape.block_size > model.cfg.block_size:
        raise LabError(f"shape.block_size={p.shape.block_size} is longer than the context of {args.checkpoint} "
                       f"({model.cfg.block_size} tokens, model={which['model']}); set shape.block_size to at most "
                       f"{model.cfg.block_size}, or rerun `dvc repro train` with these params")
    # fp32, eager: one yardstick whatever the run trained with.
    loss = evaluate(model.to(device), p, data, device)
    if not math.isfinite(loss):
        raise LabError(f"the validation loss of {args.checkpoint} is {loss}, so nothing was recorded; its weights "
                       "hold NaN or Inf: rerun `dvc repro train`, with a lower optim.lr if it diverged")
    n_tokens = p.eval.batches * p.shape.batch_size * p.shape.block_size
    # The numbers DVC compares, and which model they belong to; the environment is in metrics/env.json.
    write_json(args.metrics, {"val_loss": loss, "val_perplexity": math.exp(loss), "eval_tokens": n_tokens, **which})
    commit_outputs()
    print(f"evaluate: val loss {loss:.4f}, perplexity {math.exp(loss):.2f} over {n_tokens} tokens")


if __name__ == "__main__":
    run_main(main)
