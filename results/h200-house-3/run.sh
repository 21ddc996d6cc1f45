#!/usr/bin/env bash
# Issue 52 on the GPU: the code before the house's third step (commit 3971d58, unpacked into .old/) and after it
# (this tree), side by side on one H200. Each tree prepares the embedded corpus with preset gpt2_124m and times
# each of VARIANTS (default: recipe fastest lean) with bench's own fresh-process repeats (3), old then new per
# variant; with GPU_TESTS=1 the tests marked gpu run first, from this tree. Everything lands in
# $OUT/old-vs-new.tar.gz. The maintainers' device tool runs it (wheels in .whl/); a user has no use for it.
set -uo pipefail
export PYTHONUNBUFFERED=1
root=$(pwd); work=/tmp/ovn; mkdir -p "$work"
log() { echo "ovn: $*" | tee -a "$work/times.txt"; }
python3 -m pip install -q --no-index --find-links .whl torchao==0.18.0 liger-kernel==0.8.5 cut-cross-entropy==25.1.1 \
  nvidia-ml-py==13.615.71 2>&1 | grep -v "^WARNING" | tail -2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$work/gpu.txt"
python3 -c "import torch, torchao; print('torch', torch.__version__, 'torchao', torchao.__version__)" | tee -a "$work/gpu.txt"
if [ "${GPU_TESTS:-0}" = 1 ]; then
  began=$SECONDS
  python3 -m pytest -q -o addopts= -p no:cacheprovider -m gpu tests > "$work/gpu-tests.txt" 2>&1
  log "gpu tests: exit $?, $((SECONDS - began)) s"; tail -n 3 "$work/gpu-tests.txt"
fi
for tree in old new; do  # each tree prepares its own data with its own code
  dir=$root; [ "$tree" = old ] && dir=$root/.old
  python3 - "$dir/params.yaml" <<'PY'
import sys, yaml
path = sys.argv[1]
p = yaml.safe_load(open(path))
p["preset"] = "gpt2_124m"
p["presets"]["gpt2_124m"]["bench"]["repeats"] = 3
yaml.safe_dump(p, open(path, "w"), sort_keys=False)
PY
  [ -d "$work/$tree/data" ] && continue  # prepared by an earlier call to this machine
  began=$SECONDS
  (cd "$dir" && python3 -m stages.prepare "$work/$tree/data" > "$work/$tree-prepare.txt" 2>&1)
  log "$tree prepare: exit $?, $((SECONDS - began)) s"
done
for v in ${VARIANTS:-recipe fastest lean}; do
  for tree in old new; do
    dir=$root; [ "$tree" = old ] && dir=$root/.old
    began=$SECONDS
    (cd "$dir" && python3 -m stages.bench --variant "$v" "$work/$tree/data" "$work/$tree/variants" "$work/$tree/steps") \
      > "$work/$tree-$v.txt" 2>&1
    log "$tree $v: exit $?, $((SECONDS - began)) s"; grep "^bench@" "$work/$tree-$v.txt" | grep -v "%|" | tail -n 4
  done
done
python3 - "$work" <<'PY'
import json, sys
from pathlib import Path
work = Path(sys.argv[1])
keys = ["status", "repeats", "tokens_per_sec", "tokens_per_sec_ci95_low", "tokens_per_sec_ci95_high", "step_ms_median",
        "peak_mem_allocated_mb", "val_loss", "final_train_loss"]
for v in ["recipe", "fastest", "lean"]:
    for tree in ["old", "new"]:
        f = work / tree / "variants" / f"{v}.json"
        r = json.loads(f.read_text()) if f.exists() else {}
        print(v, tree, {k: r.get(k) for k in keys})
PY
tar -C "$work" --exclude='*/data' -czf "$OUT/old-vs-new.tar.gz" . && cp "$work/times.txt" "$OUT/"
