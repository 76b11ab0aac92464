#!/usr/bin/env bash
# scripts/run.sh [gpt2d serve options]: the main job, from nothing. Installs
# what building and serving need (scripts/setup.sh; the test tools stay
# with scripts/test.sh), builds the gpt2d binary alone (build-run/, a
# release build without the tests), gets the model and starts `gpt2d
# serve` in the foreground on 127.0.0.1:8080, or where --host and --port
# say: its start-up lines name the playground's URL and a curl line to try
# with the host and port it bound (and --api-key, --model-name, a --config
# file).
#
# The model, GPT2D_MODEL:
#   unset      the published GPT-2 small weights, downloaded and verified by
#              scripts/download.sh into models/download/gpt2 and converted
#              once to the aligned panel64 layout in models/gpt2 (it maps
#              without copying and decodes fastest: docs/api.md, "Layouts");
#              where the Hugging Face hub cannot be reached (the machines
#              gpt2d is built on cannot), the embedded gpt2d-tiny instead.
#   gpt2d-tiny the embedded model in models/gpt2d-tiny, on purpose: a small
#              GPT-2-architecture model trained by the gpt2d project (its
#              card: models/gpt2d-tiny/README.md); not OpenAI's GPT-2.
#   gpt2-medium, gpt2-large, gpt2-xl (or gpt2)
#              that published model; no fallback when it cannot be had.
#   random     a `gpt2d synth` checkpoint of GPT-2 small's shape with the
#              real tokenizer: RANDOM weights, its text is nonsense (for
#              benchmarks); the server says so in its log, /v1/models,
#              /version and the playground.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Only the binary: the tests and fuzzers are scripts/test.sh's. Quiet, but
# a failure shows meson's or the compiler's words.
quietly() {
    local out
    out=$("$@" 2>&1) || { printf '%s\n' "$out" >&2; echo "run: failed: $*" >&2; exit 1; }
}
echo "run: building gpt2d in build-run/ (the first time takes a minute or two)" >&2
[ -f build-run/build.ninja ] || quietly meson setup build-run --buildtype=release -Dtests=false
quietly meson compile -C build-run gpt2d
gpt2d=build-run/server/gpt2d
name=${GPT2D_MODEL:-}

# What the converted published checkpoints say about themselves
# (docs/api.md, "What the server says it serves").
published_about() { # name -> --meta options
    local size
    case "$1" in
    gpt2) size="small, 124M parameters" ;;
    gpt2-medium) size="medium, 355M parameters" ;;
    gpt2-large) size="large, 774M parameters" ;;
    gpt2-xl) size="XL, 1.5B parameters" ;;
    *) size="$1" ;;
    esac
    printf '%s\0' --meta "gpt2d.model_name=$1" --meta gpt2d.owned_by=openai-community \
        --meta "gpt2d.description=GPT-2 $size: OpenAI's published weights" \
        --meta gpt2d.weights=trained
}

published() { # name: models/NAME from the hub, converted once; 1 when it cannot be had
    local n=$1 model=models/$1
    [ -f "$model/model.safetensors" ] && return 0
    scripts/download.sh --model "$n" --dir "models/download/$n" --retries 3 || return 1
    echo "run: converting the published $n weights to the aligned panel64 layout in $model" >&2
    mkdir -p "$model"
    local about=()
    mapfile -d '' about < <(published_about "$n")
    "$gpt2d" convert "models/download/$n/model.safetensors" "$model/model.safetensors" \
        --layout panel64 "${about[@]}"
    cp "models/download/$n/vocab.json" "models/download/$n/merges.txt" "$model/"
}

# gpt2d-tiny's two LoRA adapters (models/gpt2d-tiny-pirate, -formal), served
# beside it: "model": "pirate" (or "gpt2d-tiny:pirate") picks one.
tiny_adapters=pirate=models/gpt2d-tiny-pirate,formal=models/gpt2d-tiny-formal
adapters=()
tiny() { # models/gpt2d-tiny, with GPT-2's tokenizer files beside it
    local model=models/gpt2d-tiny
    if [ ! -f "$model/model.safetensors" ]; then
        echo "run: $model/model.safetensors is missing (a checkout without the embedded model?);" \
            "GPT2D_MODEL=random serves random weights instead" >&2
        exit 1
    fi
    # The tokenizer is GPT-2's exact one, vendored once in tokenizer/data.
    for f in vocab.json merges.txt; do
        [ -f "$model/$f" ] || cp "tokenizer/data/$f" "$model/"
    done
}

case "$name" in
"")
    if published gpt2; then
        model=models/gpt2
    else
        echo "run: could not download gpt2 from the Hugging Face hub (unreachable from here?)" >&2
        tiny
        echo "run: serving the embedded gpt2d-tiny instead: a small model trained by the gpt2d" \
            "project, not OpenAI's GPT-2" >&2
        model=models/gpt2d-tiny
        adapters=(--lora-modules "$tiny_adapters")
    fi
    ;;
gpt2d-tiny)
    tiny
    model=models/gpt2d-tiny
    adapters=(--lora-modules "$tiny_adapters")
    ;;
random)
    model=models/synth-gpt2
    if [ ! -f "$model/model.safetensors" ]; then
        mkdir -p "$model/raw"
        echo "run: writing a random-weight GPT-2 small checkpoint to $model (NOT real weights)" >&2
        # Misaligned like the published file, then converted like it.
        "$gpt2d" synth "$model/raw/model.safetensors" --misaligned --mask-buffers
        "$gpt2d" convert "$model/raw/model.safetensors" "$model/model.safetensors" --layout panel64
        cp "$model/raw/config.json" tokenizer/data/vocab.json tokenizer/data/merges.txt "$model/"
        rm -rf "$model/raw"
    fi
    ;;
*)
    if ! published "$name"; then
        echo "run: could not download $name; GPT2D_MODEL=gpt2d-tiny serves the embedded model" >&2
        exit 1
    fi
    model=models/$name
    ;;
esac
# The server's own start-up lines say what it serves (the checkpoint's
# name and description, a warning for random weights), the playground's
# URL and a curl line to try, from its effective configuration and the
# port it bound.
exec "$gpt2d" serve --model "$model" --host 127.0.0.1 --port 8080 ${adapters[@]+"${adapters[@]}"} "$@"
