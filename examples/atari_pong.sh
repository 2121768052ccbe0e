#!/usr/bin/env bash
# The Atari path on Pong: collect single 84x84 frames with 2 workers, then train DQN with frame stacks of 4 rebuilt
# by the sampler, 3-step returns and prioritized replay (pip install 'mmreplay[atari]').
#
#   bash examples/atari_pong.sh [WORKDIR] [COLLECT_STEPS] [TRAIN_STEPS]   (defaults: /tmp/mmreplay-pong 20000 200000)
#
# On a CPU this shows the path end to end; learning Pong takes millions of steps and a GPU.
set -euo pipefail
DIR=${1:-/tmp/mmreplay-pong}
COLLECT=${2:-20000}
TRAIN=${3:-200000}
MM=$(command -v mmreplay || echo "$(dirname "$0")/../.venv/bin/mmreplay")
rm -rf "$DIR" && mkdir -p "$DIR"
"$MM" collect ALE/Pong-v5 --store "$DIR/store" --steps "$COLLECT" --workers 2 --envs-per-worker 4 --seed 0 \
    --capacity 1000000 --no-progress
"$MM" info "$DIR/store"
"$MM" train ALE/Pong-v5 --atari --store "$DIR/store" --run-dir "$DIR/run" --steps "$TRAIN" \
    --learning-starts "$COLLECT" --n-step 3 --prioritized --eval-every 0
"$MM" plot "$DIR/run"
