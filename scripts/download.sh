#!/usr/bin/env bash
# scripts/download.sh (installed as gpt2d-download): fetches a published
# GPT-2 checkpoint (model.safetensors, vocab.json, merges.txt) from the
# Hugging Face hub into a model directory. See --help.
set -euo pipefail

usage() {
    cat <<'TXT'
usage: download.sh [--model NAME] [--dir DIR] [options]

Downloads model.safetensors, vocab.json and merges.txt of a published GPT-2
checkpoint into DIR. Each file is downloaded to DIR/.partial/, resumed after
an interruption, and checked against its published sha256 before it is moved
into place; a file with the wrong checksum is deleted and the script fails.
Files already in DIR with the right checksum are kept.

  --model NAME     gpt2 (124M, default), gpt2-medium (355M), gpt2-large
                   (774M), gpt2-xl (1.5B), or a hub repository OWNER/NAME
  --dir DIR        the model directory (default: models/NAME)
  --base-url URL   the hub (default: $GPT2D_HUB or https://huggingface.co)
  --revision REV   the repository revision (default: main)
  --sha256 FILE=HEX  expect this checksum for FILE (repeatable; overrides
                   the built-in published values)
  --retries N      attempts per file, each resuming the last (default: 5)
  --help           this text

Checksums: built in for gpt2 and for the tokenizer files (the same for every
GPT-2 size); for model.safetensors of the other sizes they are read from the
hub's published LFS metadata (its sha256), unless given with --sha256.
Exit status: 0 when every file is in place and verified, 1 otherwise, 2 on a
usage error.
TXT
}

# The published sha256 values.
declare -A known=(
    [gpt2/model.safetensors]=248dfc3911869ec493c76e65bf2fcf7f615828b0254c12b473182f0f81d3a707
    [vocab.json]=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
    [merges.txt]=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
)
files=(vocab.json merges.txt model.safetensors)

model=gpt2 dir= base=${GPT2D_HUB:-https://huggingface.co} revision=main retries=5
declare -A expect=()
while [ $# -gt 0 ]; do
    case "$1" in
    --model) model=${2:?--model needs a value}; shift 2 ;;
    --dir) dir=${2:?--dir needs a value}; shift 2 ;;
    --base-url) base=${2:?--base-url needs a value}; shift 2 ;;
    --revision) revision=${2:?--revision needs a value}; shift 2 ;;
    --retries) retries=${2:?--retries needs a value}; shift 2 ;;
    --sha256)
        v=${2:?--sha256 needs FILE=HEX}
        [[ $v =~ ^([a-z.]+)=([0-9a-f]{64})$ ]] || { echo "download: --sha256 wants FILE=64 hex digits, not '$v'" >&2; exit 2; }
        expect[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}
        shift 2 ;;
    --help|-h) usage; exit 0 ;;
    *) echo "download: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[[ $retries =~ ^[1-9][0-9]*$ ]] || { echo "download: --retries wants a positive number" >&2; exit 2; }
case "$model" in
gpt2|gpt2-medium|gpt2-large|gpt2-xl) repo=openai-community/$model ;;
*/*) repo=$model ;;
*) echo "download: unknown model '$model' (gpt2, gpt2-medium, gpt2-large, gpt2-xl or OWNER/NAME)" >&2; exit 2 ;;
esac
name=${model##*/}
dir=${dir:-models/$name}
base=${base%/}
command -v curl >/dev/null || { echo "download: needs curl" >&2; exit 1; }
command -v sha256sum >/dev/null || { echo "download: needs sha256sum (coreutils)" >&2; exit 1; }

# The expected checksum of each file: --sha256, else the built-in table,
# else the hub's LFS metadata (the API lists each LFS file's sha256).
tree_json=
hub_sha256() {
    if [ -z "$tree_json" ]; then
        tree_json=$(curl -fsSL --connect-timeout 15 --max-time 60 \
            "$base/api/models/$repo/tree/$revision") ||
            { echo "download: cannot read the file list of $repo from $base" >&2; return 1; }
    fi
    command -v python3 >/dev/null || { echo "download: needs python3 to read the hub's checksums (or pass --sha256)" >&2; return 1; }
    python3 -c '
import json, sys
for e in json.loads(sys.argv[1]):
    if e.get("path") == sys.argv[2] and isinstance(e.get("lfs"), dict):
        print(e["lfs"]["oid"]); break
' "$tree_json" "$1"
}
for f in "${files[@]}"; do
    [ -n "${expect[$f]:-}" ] && continue
    if [ -n "${known[$name/$f]:-}" ] && [ "$repo" = "openai-community/$name" ]; then
        expect[$f]=${known[$name/$f]}
    elif [ -n "${known[$f]:-}" ] && [[ $repo == openai-community/* ]]; then
        expect[$f]=${known[$f]}
    else
        sum=$(hub_sha256 "$f") || exit 1
        [[ $sum =~ ^[0-9a-f]{64}$ ]] ||
            { echo "download: $repo publishes no sha256 for $f; pass --sha256 $f=HEX" >&2; exit 1; }
        expect[$f]=$sum
    fi
done

mkdir -p "$dir/.partial"
why() { # curl's exit status, the HTTP status: what went wrong, in words
    case $1 in
    6) echo "cannot find the host ${base#*://} (no network, or no DNS)" ;;
    7) echo "cannot connect to ${base#*://} (no network, a firewall, or a proxy is needed)" ;;
    22) echo "the hub answered HTTP $2" ;;
    28) echo "the connection timed out" ;;
    35 | 60) echo "the secure connection to ${base#*://} failed (curl exit $1)" ;;
    18 | 52 | 56) echo "the connection broke off (curl exit $1)" ;;
    *) echo "curl exit $1" ;;
    esac
}
resuming() { # a part's size, in words, or nothing
    [ -s "$1" ] && echo ", resuming at $(stat -c %s "$1") bytes"
    return 0
}
# curl is silent (-s): what went wrong is said once per attempt in words
# (why), not in curl's. Its progress bar is shown on a terminal once the
# hub has answered in this run (the small tokenizer files come first), for
# the long download of the weights; a connection lost during it then adds
# curl's own line under the bar, before ours.
reached=0
fetch() { # file: download (resuming) into .partial, verify, move into place
    local f=$1 want=${expect[$1]} part="$dir/.partial/$1" url="$base/$repo/resolve/$revision/$1"
    if [ -f "$dir/$f" ] && [ "$(sha256sum < "$dir/$f" | cut -d' ' -f1)" = "$want" ]; then
        echo "download: $dir/$f is present and verified; kept"
        return 0
    fi
    echo "download: $url -> $dir/$f$(resuming "$part")"
    local attempt=1 rc code how
    while :; do
        how=(-s)
        [ -t 2 ] && [ $reached = 1 ] && how=(--progress-bar)
        rc=0
        code=$(curl "${how[@]}" -fL --connect-timeout 15 --speed-limit 1024 --speed-time 60 -C - \
            -w '%{http_code}' -o "$part" "$url") || rc=$?
        if [ $rc = 0 ]; then break; fi
        # 416, or curl's 33: the server cannot resume from here (the part is
        # complete, longer than the file, or ranges are not supported):
        # keep the part if it is the file, else start again from zero.
        if [ $rc = 33 ] || [ "$code" = 416 ]; then
            [ -s "$part" ] && [ "$(sha256sum < "$part" | cut -d' ' -f1)" = "$want" ] && break
            rm -f "$part"
        fi
        if [ "$attempt" -ge "$retries" ]; then
            local kept="nothing was downloaded"
            [ -s "$part" ] && kept="the $(stat -c %s "$part") bytes received are kept in $part; the same command continues from there"
            echo "download: $f: attempt $attempt of $retries failed: $(why "$rc" "$code"); giving up, $kept" >&2
            return 1
        fi
        echo "download: $f: attempt $attempt of $retries failed: $(why "$rc" "$code"); trying again$(resuming "$part")" >&2
        attempt=$((attempt + 1))
        sleep 1
    done
    reached=1
    local got
    got=$(sha256sum < "$part" | cut -d' ' -f1)
    if [ "$got" != "$want" ]; then
        rm -f "$part"
        echo "download: $f: sha256 mismatch (expected $want, got $got); deleted the download" >&2
        return 1
    fi
    mv -f "$part" "$dir/$f"
    echo "download: $dir/$f verified (sha256 $want)"
}
status=0
for f in "${files[@]}"; do
    fetch "$f" || { status=1; break; }
done
rmdir "$dir/.partial" 2>/dev/null || true
exit $status
