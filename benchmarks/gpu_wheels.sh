#!/usr/bin/env bash
# Download the cp312 manylinux wheels that benchmarks/gpu_check.sh installs on a GPU machine
# without network access (it has torch, numpy, numba, tqdm, click and opencv, not these), at the
# versions this environment runs. Wheels only (--only-binary), no dependency resolution (the list
# is the closure of what that machine lacks). Keep the folder out of git.
#
#     benchmarks/gpu_wheels.sh [DEST]        # default shared/wheels
set -euo pipefail
DEST=${1:-shared/wheels}
PY=${PYTHON:-python3}
PYVER=${PYVER:-3.12}  # the GPU machine's Python; PYVER=3.11 fetches the same set for a local check
PIP=("$PY" -m pip)
# name==version of each package as installed here (the versions the test suite runs)
PKGS=(crc32c google-crc32c zarr numcodecs donfig pyyaml gymnasium farama-notifications ale-py
      stable-baselines3 cloudpickle)
SPECS=()
for p in "${PKGS[@]}"; do
  v=$("${PIP[@]}" show "$p" 2>/dev/null | awk '/^Version:/{print $2}')
  SPECS+=("$p${v:+==$v}")
done
mkdir -p "$DEST"
"${PIP[@]}" download --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp --abi "cp${PYVER/./}" \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform linux_x86_64 --abi none --abi abi3 -d "$DEST" "${SPECS[@]}"
ls -l "$DEST"
du -sh "$DEST"
