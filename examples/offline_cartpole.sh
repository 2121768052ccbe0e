#!/usr/bin/env bash
# Offline RL on CartPole from an archive: collect with a random policy, export to zarr, train CQL from the archive.
#
#   bash examples/offline_cartpole.sh [WORKDIR] [STEPS] [UPDATES]      (defaults: /tmp/mmreplay-offline 50000 10000)
#
# Uses the `mmreplay` on PATH, or .venv/bin/mmreplay when run from the repository.
set -euo pipefail
DIR=${1:-/tmp/mmreplay-offline}
STEPS=${2:-50000}
UPDATES=${3:-10000}
MM=$(command -v mmreplay || echo "$(dirname "$0")/../.venv/bin/mmreplay")
rm -rf "$DIR" && mkdir -p "$DIR"
"$MM" collect CartPole-v1 --store "$DIR/random" --steps "$STEPS" --workers 2 --envs-per-worker 4 --seed 0 --no-progress
"$MM" export "$DIR/random" --to zarr "$DIR/random.zarr" --no-progress
"$MM" train --offline --archive "$DIR/random.zarr" --algo cql --eval-env CartPole-v1 --steps "$UPDATES" \
    --run-dir "$DIR/cql" --seed 1
"$MM" plot "$DIR/cql"
echo "CQL from the archive: $DIR/cql (metrics.csv, learning_curve.png)"
