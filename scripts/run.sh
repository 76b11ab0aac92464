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
# Where the server will listen and what it wants, from the options given
# here (the last of each wins, as in gpt2d), for the lines printed below.
host=127.0.0.1 port=8080 key= mname=gpt2 ui=true
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    a=${args[i]}
    if [[ $a == --*=* ]]; then
        v=${a#*=} a=${a%%=*}
    else
        v=${args[i + 1]:-}
    fi
    case $a in
    --host | --port | --api-key | --model-name | --ui) ;;
    *) continue ;;
    esac
    [ "$a" = "${args[i]}" ] && i=$((i + 1)) # the value was the next argument
    case $a in
    --host) host=$v ;;
    --port) port=$v ;;
    --api-key) key=$v ;;
    --model-name) mname=${v%%,*} ;; # the first of several names
    --ui) ui=$v ;;
    esac
done
case $host in
0.0.0.0 | "") chost=127.0.0.1 ;;  # every address: this machine's is one
:: | "[::]") chost='[::1]' ;;
*:*) chost="[$host]" ;;           # an IPv6 address
*) chost=$host ;;
esac
url="http://$chost:$port"
if [ "$port" = 0 ]; then
    echo "run: --port 0: the server picks a free port; its 'listening on' line below names it" >&2
    url="http://$chost:PORT"
fi
auth=
[ -n "$key" ] && auth=" -H 'Authorization: Bearer $key'"
[ "$ui" = false ] || echo "run: the playground: $url/ (open it in a browser)" >&2
cat >&2 <<TXT
run: try, in another terminal:
  curl -s $url/v1/completions -H 'Content-Type: application/json'$auth \\
       -d '{"model": "$mname", "prompt": "Hello, my name is", "max_tokens": 16}'
TXT
exec "$gpt2d" serve --model "$model" --host 127.0.0.1 --port 8080 "$@"
