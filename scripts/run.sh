#!/usr/bin/env bash
# scripts/run.sh: the main job, from nothing. Installs what is missing, builds
# gpt2d, prepares a model directory and starts `gpt2d serve` in the
# foreground on 127.0.0.1:8080.
#
# The published GPT-2 weights cannot be downloaded on the machines gpt2d is
# built on, so the model is a `gpt2d synth` checkpoint of GPT-2 small's shape
# with the real GPT-2 tokenizer: its weights are RANDOM and its text is
# nonsense. It is written misaligned like the published file, then converted
# once to the aligned layout, so that it maps without copying.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
[ -f build/build.ninja ] || meson setup build --buildtype=debugoptimized
meson compile -C build
model=models/synth-gpt2
if [ ! -f "$model/model.safetensors" ]; then
    mkdir -p "$model/raw"
    echo "run: WARNING: writing a random-weight GPT-2 small checkpoint to $model (NOT the real weights)" >&2
    build/server/gpt2d synth "$model/raw/model.safetensors" --misaligned --mask-buffers
    build/server/gpt2d convert "$model/raw/model.safetensors" "$model/model.safetensors"
    cp "$model/raw/config.json" tokenizer/data/vocab.json tokenizer/data/merges.txt "$model/"
    rm -rf "$model/raw"
fi
build/server/gpt2d inspect "$model/model.safetensors" | tail -1
cat >&2 <<TXT
run: WARNING: the weights are random; the answers are nonsense but the server is real.
run: try, in another terminal:
  curl -s http://127.0.0.1:8080/v1/completions -H 'Content-Type: application/json' \\
       -d '{"model": "gpt2", "prompt": "Hello, my name is", "max_tokens": 16}'
TXT
exec build/server/gpt2d serve --model "$model" --host 127.0.0.1 --port 8080 "$@"
