#!/usr/bin/env bash
# Run the pipeline at GPT-2 124M scale on a CUDA machine, through DVC, in a
# scratch copy of this repository, and pack what it measured.
#
#   scripts/gpu_matrix.sh OUT_DIR [-S key=value ...]
#
# Environment:
#   VARIANTS       comma-separated variants to keep, in this order (default: all of params.yaml)
#   MORE_VARIANTS  JSON object of variants to add, e.g. '{"batch_512": {"batch_size": 512}}'
#   TIME_LIMIT_S   kill DVC after this many seconds and pack what finished (default: none)
#   TARGETS        stages to reproduce, space-separated (default: the whole pipeline)
#   FIRST          stages to reproduce before TARGETS, in a DVC run of their own (e.g. the profile stages, which
#                  a time limit would otherwise cut: DVC runs one invocation's targets in its own order)
# A VARIANTS name that exists nowhere, or a FIRST or TARGETS stage that dvc.yaml and the resolved params.yaml have no
# stage for (a misspelt stage, a MORE_VARIANTS name left out of VARIANTS, a profile of a variant not in
# profile.variants), stops the script before anything runs.
# The -S overrides go to `dvc repro` after the GPT-2 124M defaults below
# (batch 16 x 1024 tokens, as in shared reference runs), so they win.
# OUT_DIR gets results.tar.gz (params, dvc.lock, metrics, plots), gpu.txt (nvidia-smi's GPU names) and the log,
# also when the time limit cut the run short (then aggregate it on any machine
# with `python -m stages.aggregate ...` from the variant files).
set -euo pipefail
out=$(realpath "$1"); shift
src=$(pwd)
# The scratch copy gets a throwaway commit; record the one the run came from. A copy of a working tree whose .git
# lags its files (the device tool's copy did on 2026-12-02) names its HEAD with "+uncommitted".
head=$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)
[ -z "$(git -C "$src" status --porcelain -- benchlab model stages scripts params.yaml dvc.yaml 2>/dev/null)" ] || head="$head+uncommitted"
export BENCHLAB_GIT_COMMIT=${BENCHLAB_GIT_COMMIT:-$head}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT  # until the run starts (then `pack` takes over and the scratch copy stays)
mkdir -p "$out" "$work/repo" "$work/bin"
tar -C "$src" --exclude=./.whl --exclude=./.git --exclude=./.venv -cf - . | tar -C "$work/repo" -xf -
# dvc.yaml calls `python`; some images only have python3.
command -v python >/dev/null || { ln -s "$(command -v python3)" "$work/bin/python"; export PATH="$work/bin:$PATH"; }
cd "$work/repo"
# Start from no outputs: every file packed below was made by this run.
rm -rf metrics plots models data/prepared dvc.lock
python3 - "$@" <<'PY'
import json, os, sys, yaml
p = yaml.safe_load(open("params.yaml"))
gpu = {"model": "gpt2_124m", "train": {"batch_size": 16, "block_size": 1024, "steps": 30, "lr": 0.0006,
                                       "min_lr": 0.00006},
       "bench": {"steps": 20, "warmup_steps": 6, "repeats": 3}, "eval": {"batches": 8}, "profile": {"steps": 2}}
for key, value in gpu.items():
    p[key] = {**p[key], **value} if isinstance(value, dict) else value
p["variants"].update(json.loads(os.environ.get("MORE_VARIANTS") or "{}"))
keep = [v for v in os.environ.get("VARIANTS", "").split(",") if v]
if keep:
    if unknown := [v for v in keep if v not in p["variants"]]:
        sys.exit(f"gpu_matrix.sh: VARIANTS names {', '.join(unknown)}, in neither params.yaml nor MORE_VARIANTS")
    p["variants"] = {name: p["variants"][name] for name in keep}
    p["profile"]["variants"] = [v for v in p["profile"]["variants"] if v in keep]
yaml.safe_dump(p, open("params.yaml", "w"), sort_keys=False)
PY
# Overrides as DVC would apply them, through params.yaml (-S key=value).
for arg in "$@"; do case "$arg" in -S) ;; *) python3 -c 'import sys, yaml
k, v = sys.argv[1].split("=", 1); p = yaml.safe_load(open("params.yaml")); node = p
*parents, last = k.split(".")
for part in parents: node = node[part]
node[last] = yaml.safe_load(v); yaml.safe_dump(p, open("params.yaml", "w"), sort_keys=False)' "$arg";; esac; done
# Every stage asked for must exist, or DVC refuses the whole repro after the FIRST run has spent its time.
python3 - <<'PY'
import os, sys, yaml
p, stages = yaml.safe_load(open("params.yaml")), yaml.safe_load(open("dvc.yaml"))["stages"]
known = {"bench": list(p["variants"]), "profile": p["profile"]["variants"]}
for stage in (os.environ.get("FIRST", "") + " " + os.environ.get("TARGETS", "")).split():
    kind, _, name = stage.removeprefix("dvc.yaml:").partition("@")
    if kind not in stages:
        sys.exit(f"gpu_matrix.sh: there is no stage {stage}; dvc.yaml's stages are: {', '.join(stages)}")
    if name and name not in known.get(kind, []):
        sys.exit(f"gpu_matrix.sh: there is no stage {stage}; the {kind} stages are: {', '.join(known.get(kind, [])) or 'none'}")
PY
# The pipeline's own check of the resolved params (an aggregate.baseline that VARIANTS left out, a bad value), before
# a stage starts: DVC would find it only in the first stage, after the machine's time for the call began to run.
python3 - <<'PY'
import sys
from benchlab.config import load_params
from benchlab.errors import LabError
try:
    load_params("params.yaml")
except LabError as e:
    sys.exit(f"gpu_matrix.sh: params.yaml as VARIANTS and the -S overrides leave it: {e}")
PY
git init -q && git add -A && git -c user.name=gpu -c user.email=gpu@localhost commit -qm snapshot
export PYTHONUNBUFFERED=1
# The machine's GPUs by name and driver, beside the pack (merge_runs.py keeps it with the part).
if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu.txt" || true; fi
status=0
pack() {
  tar czf "$out/results.tar.gz" params.yaml $(ls -d dvc.lock metrics plots 2>/dev/null)
  echo "dvc exit $status; packed $(du -h "$out/results.tar.gz" | cut -f1) into $out/results.tar.gz"
}
trap pack EXIT
read -r -a targets <<< "${TARGETS:-}"
read -r -a first <<< "${FIRST:-}"
repro() {  # FIRST's stages in a DVC run of their own before the rest: DVC orders one run's targets itself
  local rc=0
  if [ ${#first[@]} -gt 0 ]; then python3 -m dvc repro --keep-going "${first[@]}" || rc=$?; fi
  python3 -m dvc repro --keep-going "${targets[@]}" || rc=$?
  return $rc
}
if [ -n "${TIME_LIMIT_S:-}" ]; then
  # A variant starts no repeat that would end past the limit (20 s kept for writing its record): it records the
  # repeats it has instead of losing them all to the KILL below (stages/bench.py).
  export BENCHLAB_DEADLINE=$(( $(date +%s) + TIME_LIMIT_S - 20 ))
  # KILL, not INT: DVC's --keep-going would treat an interrupted stage as one failure and go on.
  export -f repro; export first_list="${FIRST:-}" targets_list="${TARGETS:-}"
  timeout --signal=KILL "$TIME_LIMIT_S" bash -c 'read -r -a first <<< "$first_list"; read -r -a targets <<< "$targets_list"; repro' \
    > "$out/dvc_log.txt" 2>&1 || status=$?
  . "$src/scripts/stop_leftovers.sh" && stop_leftovers .
else
  repro > "$out/dvc_log.txt" 2>&1 || status=$?
fi
grep -E "^(bench|profile)@[A-Za-z0-9_]+:|^error|stopped" "$out/dvc_log.txt" | grep -v "%|" || true
