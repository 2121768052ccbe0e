#!/usr/bin/env bash
# The GPU check: one command, at most ~6 minutes on a CUDA machine, JSON under $OUT.
#
#     OUT=/some/dir benchmarks/gpu_check.sh                 # on the GPU machine (DEVICE=cuda)
#     OUT=/tmp/gc DEVICE=cpu QUICK=1 benchmarks/gpu_check.sh # the same steps end to end on a CPU, tiny sizes
#
# What it runs, each part under its own time limit (a part that fails or runs out of time is
# recorded and the next one runs):
#   1. benchmarks/gpu_check.py: learner updates/s eager and graph-captured (--cuda-graphs) at
#      B=32 and B=256; the data path alone (synchronous, BatchLoader with 1 and $WORKERS workers);
#   2. benchmarks/loader_gpu.py end to end (synchronous, BatchLoader, BatchLoader + graphs);
#   3. benchmarks/atari_train.py --device $DEVICE: SB3's DQN and `mmreplay train --actors 4
#      --cuda-graphs` on the same card.
# Files under $OUT: env.json (machine, versions), gpu_check.json, loader_gpu.json,
# atari_train.json, parts.json (each part's exit status and seconds) and one log per part.
#
# Set-up: packages the machine lacks (crc32c, zarr and its dependencies, gymnasium, ale-py,
# stable-baselines3) are installed from the cp312 wheels in $WHEELS (benchmarks/gpu_wheels.sh
# downloads them) into $SITE, with no index and no network (FORCE_WHEELS=1: even where they are installed). `mmreplay.cli` is the top-level
# `cli/` package only through an install: from a plain checkout the script links
# mmreplay/cli -> ../cli for the run (and removes the link after).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check-out}
WHEELS=${WHEELS:-shared/wheels}
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
SITE=${SITE:-/tmp/mmreplay-site}
WORKERS=${WORKERS:-4}
QUICK=${QUICK:-0}
mkdir -p "$OUT"
START=$(date +%s)

# -- set-up --------------------------------------------------------------------------------------
if [ "${FORCE_WHEELS:-0}" = 1 ] || ! "$PY" -c "import crc32c, zarr, gymnasium, ale_py, stable_baselines3" 2>/dev/null; then
  if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    echo "gpu_check: missing packages and no wheels in $WHEELS (run benchmarks/gpu_wheels.sh)" >&2
    exit 2
  fi
  "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl || exit 2
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
LINKED=0
if [ ! -e mmreplay/cli ]; then
  ln -s ../cli mmreplay/cli && LINKED=1
fi
cleanup() { if [ "$LINKED" = 1 ]; then rm -f mmreplay/cli; fi; }
trap cleanup EXIT
"$PY" - "$OUT/env.json" <<'PY' || exit 2
import json, os, subprocess, sys
import crc32c, numpy, torch
import mmreplay, mmreplay.cli.main
out = {"python": sys.version.split()[0], "torch": torch.__version__, "numpy": numpy.__version__,
       "cuda": torch.cuda.is_available(), "cpus": os.cpu_count(), "mmreplay": mmreplay.__file__,
       "cli": mmreplay.cli.main.__file__, "crc32c": crc32c.__file__}
if torch.cuda.is_available():
    out["gpu"] = torch.cuda.get_device_name(0)
try:
    out["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
except OSError:
    pass
json.dump(out, open(sys.argv[1], "w"), indent=2)
print(json.dumps(out))
PY

# -- the parts -----------------------------------------------------------------------------------
if [ "$QUICK" = 1 ]; then
  GC=(--rows 3000 --seconds 0.5 --rounds 1 --batch-sizes 8 32)
  LG=(--rows 3000 --seconds 0.5)
  AT=(--steps 2500 --learning-starts 1000)
  T1=300 T2=300 T3=600
else
  GC=(--rows 100000 --seconds 4 --rounds 2 --batch-sizes 32 256)
  LG=(--rows 100000 --seconds 5)
  AT=(--steps 20000 --learning-starts 5000)
  T1=120 T2=80 T3=150  # with set-up, at most ~6 minutes
fi
PARTS=()
part() {  # part NAME LIMIT_S CMD...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  echo "== $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" > >(tee "$OUT/$name.log") 2>&1
  local rc=$?
  PARTS+=("{\"part\": \"$name\", \"rc\": $rc, \"seconds\": $(( $(date +%s) - t0 ))}")
  echo "== $name: exit $rc after $(( $(date +%s) - t0 )) s"
}
part gpu_check "$T1" "$PY" benchmarks/gpu_check.py --device "$DEVICE" --workers "$WORKERS" "${GC[@]}" \
  --out "$OUT/gpu_check.json"
part loader_gpu "$T2" "$PY" benchmarks/loader_gpu.py --device "$DEVICE" --workers "$WORKERS" --cuda-graphs "${LG[@]}" \
  --out "$OUT/loader_gpu.json"
part atari_train "$T3" "$PY" benchmarks/atari_train.py --device "$DEVICE" --actors 4 --cuda-graphs "${AT[@]}" \
  --out "$OUT/atari_train.json"
( IFS=,; echo "{\"device\": \"$DEVICE\", \"quick\": $QUICK, \"total_s\": $(( $(date +%s) - START )), \"parts\": [${PARTS[*]}]}" ) \
  > "$OUT/parts.json"
cat "$OUT/parts.json"
