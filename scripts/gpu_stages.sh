#!/usr/bin/env bash
# The maintainers' helper for their own remote GPU machine when DVC's wheels do not fit what can be carried there
# (users never need it: the README's "On your GPU" commands are the whole user path). It sets params.yaml keys,
# then runs stages by the commands dvc.yaml, search/dvc.yaml and ttl/dvc.yaml give them, in the order given.
#
#   scripts/gpu_stages.sh OUT_DIR [key=value ...] -- STEP ...
#
# STEP: corpus (ttl's python_corpus stage, into .gpu-ws/), prepare, env, reference (parity_reference),
# search, screening-cost (scripts/screening_cost.py), bench (each of BENCH_VARIANTS), aggregate, or gpu-tests
# (pytest -m gpu). The parity reference and the
# search write into .gpu-ws/ (ignored by git: the machine keeps it between calls, so a stopped search resumes from
# its journal); logs go to OUT_DIR, and the search's outputs are copied there as each step ends. Wheels the machine
# lacks are taken from .whl/ when present. SEARCH_LIMIT_S stops the search with Ctrl-C's signal after so many
# seconds (it resumes at the next call).
set -euo pipefail
out=$(realpath "$1"); shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1
sets=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do sets+=("$1"); shift; done
[ $# -gt 0 ] && shift
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --find-links .whl optuna==5.1.0 torchao==0.18.0 liger-kernel==0.8.5 \
    cut-cross-entropy==25.1.1 nvidia-ml-py==13.615.71 2>&1 | grep -v "^WARNING" | tail -3 || true
fi
python3 - "${sets[@]}" <<'PY'
import sys
import yaml
with open("params.yaml", encoding="utf-8") as f:
    params = yaml.safe_load(f)
for item in sys.argv[1:]:
    key, value = item.split("=", 1)
    *parents, last = key.split(".")
    node = params
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = yaml.safe_load(value)
with open("params.yaml", "w", encoding="utf-8") as f:
    yaml.safe_dump(params, f, sort_keys=False)
PY
step_log() { echo "gpu_stages: $*" | tee -a "$out/times.txt"; }
for step in "$@"; do
  began=$SECONDS
  status=0
  case $step in
    corpus) python3 -m stages.python_corpus .gpu-ws/python_sources.jsonl .gpu-ws/python_corpus.json ;;
    prepare) python3 -m stages.prepare data/prepared ;;
    env) python3 -m stages.env metrics/env.json ;;
    reference) DVC_STAGE=parity_reference python3 -m stages.parity data/prepared .gpu-ws/parity .gpu-ws/plots ;;
    search) ${SEARCH_LIMIT_S:+timeout -s INT -k 20 "$SEARCH_LIMIT_S"} python3 -m stages.search data/prepared .gpu-ws/parity/reference-seeds.json .gpu-ws/search \
              .gpu-ws/search.json || status=$? ;;
    screening-cost) python3 scripts/screening_cost.py data/prepared "$out/screening-cost.json" || status=$? ;;
    bench) for v in ${BENCH_VARIANTS:-recipe}; do  # each as its bench@<variant> stage runs it
             DVC_STAGE="bench@$v" python3 -m stages.bench data/prepared .gpu-ws/variants .gpu-ws/steps || status=$?
           done ;;
    aggregate) python3 -m stages.aggregate .gpu-ws/variants .gpu-ws/steps .gpu-ws/parity .gpu-ws/profiles \
                 .gpu-ws/summary.json .gpu-ws/summary.md .gpu-ws/summary.csv .gpu-ws/summary .gpu-ws/report.md \
                 || status=$?
               tar czf "$out/bench.tar.gz" params.yaml metrics/env.json .gpu-ws/variants .gpu-ws/summary.json \
                 .gpu-ws/summary.md .gpu-ws/summary.csv .gpu-ws/report.md 2>/dev/null || true ;;
    gpu-tests) python3 -m pytest -q -o addopts= -p no:cacheprovider -m gpu tests > "$out/gpu-tests.txt" 2>&1 \
                 || status=$?; tail -n 5 "$out/gpu-tests.txt" ;;
    *) echo "gpu_stages: unknown step $step" >&2; exit 2 ;;
  esac > >(tee -a "$out/$step.log") 2>&1
  step_log "$step: $((SECONDS - began)) s, exit $status"
  if [ -d .gpu-ws/search ]; then
    tar czf "$out/search.tar.gz" params.yaml .gpu-ws/search .gpu-ws/search.json .gpu-ws/search.log metrics/env.json \
      .gpu-ws/parity/reference-seeds.json 2>/dev/null || true
  fi
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>/dev/null || true
