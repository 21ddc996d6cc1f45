#!/usr/bin/env bash
# One and two GPUs, DDP and FSDP2, through DVC, on a machine with two GPUs; then the all-reduce bandwidth.
#
#   scripts/gpu_distributed.sh OUT_DIR [-S key=value ...]
#
# For each model in MODELS (default "gpt2_124m gpt2_350m") a scratch copy of this
# repository runs `dvc repro aggregate` over five variants of the public recipe
# (bf16 autocast, SDPA, TF32, fused AdamW, torch.compile), batch 16 x 1024 per GPU:
#   one_b16   one GPU, batch 16: the per-GPU reference of scaling efficiency
#   one_b32   one GPU, batch 32: the loss reference at the two-GPU runs' global batch
#   ddp_2     DDP on two GPUs, global batch 32 (16 per GPU)
#   fsdp2_2   FSDP2 on two GPUs, global batch 32, parameters gathered in bf16, gradients reduced in fp32
#   ddp_1     DDP on one GPU, batch 16: what the wrapper alone costs
# bench.repeats 3 (REPEATS), 20 steps of which 6 warm-up. Then scripts/allreduce_bw.py
# under torchrun measures the all-reduce bus bandwidth for the README's scaling model.
# Environment:
#   MODELS        models to run, in order (default: gpt2_124m gpt2_350m)
#   REPEATS       bench.repeats (default 3)
#   VARIANTS      space-separated subset of the five variants above and MORE_VARIANTS (default: all)
#   MORE_VARIANTS JSON object of more variants, each as knobs over the recipe
#   ALLREDUCE     0 skips the all-reduce bandwidth measurement (default 1)
#   TIME_LIMIT_S  per model: stop DVC after this many seconds and pack what finished (default 210)
#   PROFILE       models whose PROFILE_VARIANTS are also traced by the profile stage, for the share of
#                 the step in NCCL kernels (default gpt2_124m; after the bench stages, inside the limit)
#   PROFILE_VARIANTS  space-separated variants to trace (default: ddp_2 fsdp2_2)
#   RECIPE        JSON of the recipe's knobs (default the public recipe; a CPU check may pass
#                 '{"precision": "fp32", "attention": "sdpa"}' to skip compilation)
# OUT_DIR gets <model>.tar.gz (params, dvc.lock, metrics, plots), <model>_traces.tar (the profile traces), <model>_log.txt,
# allreduce_bw.json and a short table of the figures the README's scaling model needs.
set -euo pipefail
out=$(realpath "$1"); shift
src=$(pwd)
export BENCHLAB_GIT_COMMIT=${BENCHLAB_GIT_COMMIT:-$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)}
export PYTHONUNBUFFERED=1
mkdir -p "$out"
work=$(mktemp -d)
mkdir -p "$work/bin"
command -v python >/dev/null || { ln -s "$(command -v python3)" "$work/bin/python"; export PATH="$work/bin:$PATH"; }
nproc_gpus=$(python3 -c 'import torch; print(torch.cuda.device_count() or 2)')  # CPU check: 2 gloo ranks
for model in ${MODELS:-gpt2_124m gpt2_350m}; do
  repo="$work/$model"
  mkdir -p "$repo"
  tar -C "$src" --exclude=./.whl --exclude=./.git --exclude=./.venv -cf - . | tar -C "$repo" -xf -
  (
    cd "$repo"
    rm -rf metrics plots models data/prepared dvc.lock
    MODEL=$model python3 - "$@" <<'PY'
import json, os, sys, yaml
p = yaml.safe_load(open("params.yaml"))
recipe = json.loads(os.environ.get("RECIPE") or
                    '{"precision": "bf16", "attention": "sdpa", "compile": true, "fused_adamw": true}')
gpu = {"model": os.environ["MODEL"],
       "train": {"batch_size": 16, "block_size": 1024, "steps": 30, "lr": 0.0006, "min_lr": 0.00006},
       "bench": {"steps": 20, "warmup_steps": 6, "repeats": int(os.environ.get("REPEATS", "3"))},
       "eval": {"batches": 8}}
for key, value in gpu.items():
    p[key] = {**p[key], **value} if isinstance(value, dict) else value
p["variants"] = {
    "one_b16": {**recipe, "batch_size": 16},
    "one_b32": {**recipe, "batch_size": 32},
    "ddp_2": {**recipe, "batch_size": 32, "parallel": "ddp", "nproc": 2},
    "fsdp2_2": {**recipe, "batch_size": 32, "parallel": "fsdp2", "nproc": 2, "fsdp_param_dtype": "bf16"},
    "ddp_1": {**recipe, "batch_size": 16, "parallel": "ddp", "nproc": 1},
}
# MORE_VARIANTS: more variants as knobs over the recipe, e.g. '{"ddp_2_b100": {"batch_size": 32, ...}}'.
p["variants"].update({name: {**recipe, **spec} for name, spec in json.loads(os.environ.get("MORE_VARIANTS") or "{}").items()})
keep = os.environ.get("VARIANTS", "").split()
if keep:
    p["variants"] = {name: spec for name, spec in p["variants"].items() if name in keep}
p["aggregate"]["baseline"] = "one_b16"
profiled = os.environ.get("PROFILE", "gpt2_124m").split()
traced = os.environ.get("PROFILE_VARIANTS", "ddp_2 fsdp2_2").split()
p["profile"]["variants"] = [v for v in traced if v in p["variants"] and os.environ["MODEL"] in profiled]
p["profile"]["steps"] = 2
# -S key=value overrides, as DVC would apply them through params.yaml.
args = [a for a in sys.argv[1:] if a != "-S"]
for arg in args:
    key, value = arg.split("=", 1)
    *parents, last = key.split(".")
    node = p
    for part in parents:
        node = node[part]
    node[last] = yaml.safe_load(value)
yaml.safe_dump(p, open("params.yaml", "w"), sort_keys=False)
PY
    git init -q && git add -A && git -c user.name=gpu -c user.email=gpu@localhost commit -qm snapshot
    status=0
    # Into the log file, not through `| tee`: after the time limit's KILL, torchrun's ranks would keep a pipe's
    # write end open and the pipeline would wait for them (on 2026-11-30 a call overran its limit so, and its
    # results were never packed).
    BENCHLAB_DEADLINE=$(( $(date +%s) + ${TIME_LIMIT_S:-210} - 20 )) \
    timeout --signal=KILL "${TIME_LIMIT_S:-210}" python3 -m dvc repro --keep-going aggregate \
      $(grep -q "variants: \[\]" params.yaml || echo profile) > "$out/${model}_log.txt" 2>&1 || status=$?
    . "$src/scripts/stop_leftovers.sh" && stop_leftovers "$repo"
    grep -E "^(bench|profile)@[A-Za-z0-9_]+:|^\| |^ERROR|^error" "$out/${model}_log.txt" | grep -v "%|" || true
    # Traces apart: the device tool brings back files of 16 MiB at most.
    tar czf "$out/$model.tar.gz" --exclude='*_trace.json.gz' params.yaml dvc.lock metrics plots 2>/dev/null \
      || tar czf "$out/$model.tar.gz" --exclude='*_trace.json.gz' params.yaml metrics plots
    find plots -name '*_trace.json.gz' | tar cf "$out/${model}_traces.tar" -T - 2>/dev/null || true
    echo "$model: dvc exit $status; packed $out/$model.tar.gz"
  ) || true
done
# All-reduce bus bandwidth between the GPUs, for the scaling model (ALLREDUCE=0 skips it).
[ "${ALLREDUCE:-1}" = 0 ] || python3 -m torch.distributed.run --standalone --nproc_per_node="$nproc_gpus" "$src/scripts/allreduce_bw.py" \
  "$out/allreduce_bw.json" 2>&1 | tee "$out/allreduce_log.txt" || true
# The figures the README's scaling model reads, one line per variant.
python3 - "$out" "$work" ${MODELS:-gpt2_124m gpt2_350m} <<'PY' | tee "$out/table.txt"
import json, sys
from pathlib import Path
out, work, models = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
keys = ("status", "world_size", "tokens_per_sec", "tokens_per_sec_per_gpu", "step_ms_median", "peak_mem_allocated_mb",
        "val_loss")
for model in models:
    for f in sorted((work / model / "metrics" / "variants").glob("*.json")):
        r = json.loads(f.read_text())
        print(model, f.stem, " ".join(f"{k}={r.get(k):.6g}" if isinstance(r.get(k), float) else f"{k}={r.get(k)}"
                                      for k in keys), r.get("message", "")[:120])
    for md in sorted((work / model / "plots" / "profiles").glob("*_kernels.md")):
        print(md.read_text()[:1500])
    summary = work / model / "metrics" / "summary.md"
    if summary.is_file():
        print(summary.read_text())
PY
