#!/usr/bin/env bash
# scripts/run.sh [gpt2d serve options]: the main job, from nothing. Installs
# what is missing, builds gpt2d, gets the model, converts it once to the
# aligned panel64 layout (it maps without copying, and decodes fastest:
# docs/api.md, "Layouts") and starts `gpt2d serve` in the foreground on
# 127.0.0.1:8080, or where --host and --port say: the playground's URL and
# a curl line printed first use them (and --api-key, --model-name).
#
# The model: the published GPT-2 small weights, downloaded and verified by
# scripts/download.sh into models/download/gpt2 and served from models/gpt2.
# Where the Hugging Face hub cannot be reached (the machines gpt2d is built
# on cannot), it says so and serves a `gpt2d synth` checkpoint of GPT-2
# small's shape with the real GPT-2 tokenizer instead: its weights are
# RANDOM and its text is nonsense, but everything else is real.
# GPT2D_MODEL=gpt2-medium (or -large, -xl) serves a larger published model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
[ -f build/build.ninja ] || meson setup build --buildtype=debugoptimized
meson compile -C build
gpt2d=build/server/gpt2d
name=${GPT2D_MODEL:-gpt2}
model=models/$name
random=0
if [ ! -f "$model/model.safetensors" ]; then
    if scripts/download.sh --model "$name" --dir "models/download/$name" --retries 3; then
        echo "run: converting the published $name weights to the aligned panel64 layout in $model" >&2
        mkdir -p "$model"
        "$gpt2d" convert "models/download/$name/model.safetensors" "$model/model.safetensors" \
            --layout panel64
        cp "models/download/$name/vocab.json" "models/download/$name/merges.txt" "$model/"
    else
        echo "run: could not download $name from the Hugging Face hub (unreachable from here?)" >&2
        model=models/synth-gpt2
        random=1
        if [ ! -f "$model/model.safetensors" ]; then
            mkdir -p "$model/raw"
            echo "run: WARNING: writing a random-weight GPT-2 small checkpoint to $model (NOT the real weights)" >&2
            # Misaligned like the published file, then converted like it.
            "$gpt2d" synth "$model/raw/model.safetensors" --misaligned --mask-buffers
            "$gpt2d" convert "$model/raw/model.safetensors" "$model/model.safetensors" --layout panel64
            cp "$model/raw/config.json" tokenizer/data/vocab.json tokenizer/data/merges.txt "$model/"
            rm -rf "$model/raw"
        fi
    fi
fi
"$gpt2d" inspect "$model/model.safetensors" | tail -1
[ "$random" = 1 ] &&
    echo "run: WARNING: serving RANDOM weights ($model); the answers are nonsense but the server is real." >&2
# The server's own start-up lines name the playground's URL and a curl line
# to try, from its effective configuration (these options, a --config file)
# and the port it bound.
exec "$gpt2d" serve --model "$model" --host 127.0.0.1 --port 8080 "$@"
