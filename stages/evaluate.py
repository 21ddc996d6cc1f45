"""Stage evaluate: validation loss and perplexity of the trained checkpoint, in fp32."""

import argparse
import math

from benchlab.checkpoint import load_checkpoint
from benchlab.config import load_params
from benchlab.data import load_tokens
from benchlab.errors import run_main
from benchlab.io import remove_outputs, write_json
from benchlab.optimize import resolve_device
from benchlab.runner import evaluate


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("data_dir")
    ap.add_argument("checkpoint")
    ap.add_argument("metrics")
    args = ap.parse_args(argv)
    remove_outputs(args.metrics)
    p = load_params()
    device = resolve_device(p.device)
    data = load_tokens(args.data_dir)
    model = load_checkpoint(args.checkpoint, data.vocab_size)
    # fp32, eager: one yardstick whatever the run trained with.
    loss = evaluate(model.to(device), p, data, device)
    n_tokens = p.eval.batches * p.train.batch_size * p.train.block_size
    # Numbers only: DVC compares this file; the environment is in metrics/env.json.
    write_json(args.metrics, {"val_loss": loss, "val_perplexity": math.exp(loss), "eval_tokens": n_tokens})
    print(f"evaluate: val loss {loss:.4f}, perplexity {math.exp(loss):.2f} over {n_tokens} tokens")


if __name__ == "__main__":
    run_main(main)
