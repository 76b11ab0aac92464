#!/usr/bin/env bash
# scripts/run.sh: the main job, from nothing. Installs what is missing, builds
# gpt2d, writes a GPT-2-small-shaped checkpoint with random weights (the real
# weights cannot be downloaded here) in the Hugging Face layout and
# misaligned like the published file, and validates it with `gpt2d inspect`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
[ -f build/build.ninja ] || meson setup build --buildtype=debugoptimized
meson compile -C build
model=models/synth-gpt2
if [ ! -f "$model/model.safetensors" ]; then
    mkdir -p "$model"
    echo "run: writing a random-weight GPT-2 small checkpoint to $model (these are NOT the real weights)" >&2
    build/server/gpt2d synth "$model/model.safetensors" --misaligned --mask-buffers
fi
build/server/gpt2d inspect "$model/model.safetensors"
