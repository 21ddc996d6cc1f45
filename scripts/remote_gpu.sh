#!/usr/bin/env bash
# The maintainers' helper for their own remote GPU machine, which cannot reach the internet; users never need
# it (the README's "On your GPU" commands are the whole user path). On that machine it does what a user does:
# a fresh clone of this checkout's last commit, the README's GPU install (from wheels carried in .whl/), then
# the README's one DVC command, and it copies what that command made to OUT_DIR.
#
#   scripts/remote_gpu.sh OUT_DIR NAME [-S key=value ...]
#
# NAME names the experiment and the clone (.gpu-ws/NAME, or .gpu-ws/$WS where WS is set: several experiments
# then share one clone, its environment, its prepared data and the search's journal and compile cache). Run it
# again with the same arguments to go on after a stop: the clone, its environment and every finished stage
# stay, and DVC repeats none of them.
# Environment: TIME_LIMIT_S (stop DVC with Ctrl-C's signal after this many seconds; default none),
# CORPUS_MB (the text corpus, default 80: this machine's own Python sources, as a user's own text),
# GPU_TESTS=1 (also run the tests marked gpu, once per clone), WHEELS (the folder of carried wheels, default .whl),
# SKIP_PINS (space-separated packages whose pins the install leaves out, keeping the machine's own: wheels too
# large to carry there, e.g. "numpy pandas pyarrow").
set -euo pipefail
out=$(realpath "$1"); name=$2; shift 2
src=$(pwd); ws=$src/.gpu-ws/${WS:-$name}; corpus=/tmp/gpu-text/python-sources.txt; wheels=$(realpath "${WHEELS:-.whl}")
mkdir -p "$out" "$src/.gpu-ws"
export PYTHONUNBUFFERED=1
log() { echo "remote_gpu: $*" | tee -a "$out/times.txt"; }
if [ ! -d "$ws/.git" ]; then  # the tree's files (the copy's .git may lag them) as a fresh repository
  mkdir -p "$ws"
  tar -C "$src" --exclude=./.git --exclude=./.whl --exclude=./.gpu-ws --exclude=./.venv -cf - . | tar -C "$ws" -xf -
  git -C "$ws" init -q && git -C "$ws" add -A
  git -C "$ws" -c user.name=lab -c user.email=lab@localhost commit -qm "${BENCHLAB_GIT_COMMIT:-tree}"
  git -C "$ws" config user.name lab && git -C "$ws" config user.email lab@localhost  # for DVC's experiment commits
fi
export BENCHLAB_GIT_COMMIT=${BENCHLAB_GIT_COMMIT:-}  # the commit the tree came from, for every record
cd "$ws"
log "clone at $(git rev-parse --short HEAD)"
if [ ! -x .venv/bin/dvc ]; then  # the README's GPU install, on top of this machine's CUDA build of torch
  began=$SECONDS
  python3 -m venv .venv  # sees this machine's packages (its CUDA torch) through a .pth file: python3 may be a venv's
  base=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$base" > "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/machine.pth"
  reqs=requirements-gpu.txt
  if [ -n "${SKIP_PINS:-}" ]; then  # pins whose wheels are too large to carry there; the machine's own are kept
    reqs=$(mktemp); grep -hv -E "^-r|^($(tr ' ' '|' <<< "$SKIP_PINS"))==" requirements-base.txt requirements-gpu.txt > "$reqs"
    log "GPU install without the pins of: $SKIP_PINS"
  fi
  .venv/bin/python -m pip install -q --no-index --find-links "$wheels" -r "$reqs"
  log "GPU install: $((SECONDS - began)) s"
fi
. .venv/bin/activate
if [ ! -s "$corpus" ]; then  # a user's own text: this machine's Python sources, each file once (nothing cycled)
  mkdir -p "$(dirname "$corpus")"
  python - "$corpus" "${CORPUS_MB:-80}" <<'PY'
import sys, sysconfig
from pathlib import Path
out, limit = Path(sys.argv[1]), int(sys.argv[2]) * 10**6
roots = {Path(sysconfig.get_paths()["stdlib"])} | {Path(p) for p in sys.path if "-packages" in p and Path(p).is_dir()}
written = 0
with out.open("w", encoding="utf-8") as f:
    for path in sorted(p for root in roots for p in root.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="ignore")
        if written + len(text) > limit:
            break
        written += f.write(text)
print(f"corpus: {written / 1e6:.1f} MB of Python sources in {out}")
PY
fi
if [ "${GPU_TESTS:-0}" = 1 ] && [ ! -f .gpu-tests-done ]; then
  python -m pytest -q -o addopts= -p no:cacheprovider -m gpu tests 2>&1 | tee "$out/gpu-tests.txt" | tail -n 5 || true
  touch .gpu-tests-done
fi
began=$SECONDS
status=0
${TIME_LIMIT_S:+timeout -s INT -k 30 "$TIME_LIMIT_S"} dvc exp run -n "$name" -S preset=gpt2_124m -S "data.corpus=$corpus" "$@" \
  > "$out/dvc-log.txt" 2>&1 || status=$?
log "dvc exp run: $((SECONDS - began)) s, exit $status"
grep -E "^(bench|parity|profile)@|^parity@|^error|^ERROR|stopped|Ran experiment" "$out/dvc-log.txt" | grep -v "%|" || true
tar czf "$out/results.tar.gz" params.yaml dvc.lock search/dvc.lock metrics plots 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>/dev/null || true
