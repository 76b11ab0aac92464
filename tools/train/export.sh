#!/usr/bin/env bash
# tools/train/export.sh RUN_DIR GPT2D [OUT_DIR]: the served files of
# gpt2d-tiny from a training run: RUN_DIR/model.safetensors (F32, Hugging
# Face layout) converted to BF16 in the panel64 layout (the format and layout
# gpt2d decodes fastest, and half the bytes), labelled in its __metadata__
# (name, owner, description, trained weights: what the server reports), with
# config.json and SHA256SUMS beside it. OUT_DIR defaults to models/gpt2d-tiny.
set -euo pipefail
run=$1 gpt2d=$2
out=${3:-$(dirname "$0")/../../models/gpt2d-tiny}
mkdir -p "$out"
"$gpt2d" convert "$run/model.safetensors" "$out/model.safetensors" --dtype bf16 --layout panel64 \
    --meta gpt2d.model_name=gpt2d-tiny --meta gpt2d.owned_by=gpt2d --meta gpt2d.weights=trained \
    --meta "gpt2d.description=a small model with GPT-2's architecture and tokenizer, trained by the gpt2d project on English text and question-and-answer dialogues from Debian packages (models/gpt2d-tiny/README.md); not OpenAI's GPT-2"
cp "$run/config.json" "$out/config.json"
# the held-out tokens the card's perplexities are measured on and the chat
# prompts its reply rate is, when they are there
(cd "$out" && sha256sum model.safetensors config.json \
    $(for f in heldout.u16 other_heldout.u16 chat_prompts.txt; do [ -f "$f" ] && echo "$f"; done) > SHA256SUMS)
cat "$out/SHA256SUMS"
