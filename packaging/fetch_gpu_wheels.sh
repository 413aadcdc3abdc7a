#!/bin/sh
# Fetches, into .whl/, the wheels a CUDA machine without internet needs to run
# `python -m engine.bench.gpu_check` (its image has torch, transformers, pytest and
# triton, but not these). Versions come from constraints.txt; the platform flags
# match a manylinux x86-64 machine with Python 3.12 (PYTHON_VERSION overrides).
set -eu
cd "$(dirname "$0")/.."
python_version="${PYTHON_VERSION:-3.12}"
for name in bitsandbytes platformdirs gguf; do
    pin=$(grep -i "^$name==" constraints.txt)
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$python_version" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
        -d .whl "$pin"
done
ls .whl
