#!/usr/bin/env bash
# bench/soak.sh [MINUTES] [BUILD] [CLIENTS]: a soak of `gpt2d serve` in its
# default configuration on a GPT-2-small-shaped `gpt2d synth` checkpoint:
# CLIENTS (64) clients from one address send mixed traffic for MINUTES (10)
# (completions, chat, cancels, tokenize, stored-response chains, structured
# outputs on chat and /v1/responses, embeddings, forced tool calls, refusals) with every answer checked, a SIGHUP and a touch of the model file midway
# (bench/soak.py says what and how). Prints the requests, the unexpected
# errors (the aim is 0), and RSS, descriptors and KV blocks in use at the
# start, the peak and the end (the aim: back to the start once idle).
# Exits 1 on an unexpected error. TLS=1 serves and loads it over HTTPS
# (a certificate made here). KV_CACHE_MB (2048, the default) sizes the KV
# pool: the prefix cache keeps what it held and takes never-used blocks
# first, so resident memory climbs until the whole pool has been touched
# (weights + KV_CACHE_MB) and is flat from then on; a small pool (256)
# reaches that plateau within a minute, so that a leak shows as growth
# after it. Not run in CI (too long).
set -euo pipefail
minutes=${1:-10}
build=${2:-build}
clients=${3:-64}
cd "$(dirname "$0")/.."
. bench/lib.sh
bench_setup soak "$build"
# The default configuration: bench_serve's larger KV pool put back. TLS=1:
# HTTPS with a self-signed certificate made here (the SIGHUP midway reads
# it again).
tls=()
if [ "${TLS:-0}" = 1 ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
        -subj "/CN=gpt2d-soak" -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
        -keyout "$dir/tls.key" -out "$dir/tls.crt" 2> /dev/null
    tls=(--tls-cert-file "$dir/tls.crt" --tls-key-file "$dir/tls.key")
    export SOAK_CACERT="$dir/tls.crt"
fi
bench_serve "$build" "$dir" --kv-cache-mb "${KV_CACHE_MB:-2048}" "${tls[@]}"
echo "soak: kv_cache_mb ${KV_CACHE_MB:-2048}; $build/server/gpt2d ($(git describe --always --dirty)) on $(sed -n 's/^model name\t*: //p' /proc/cpuinfo | head -1), $(nproc) CPUs; $minutes min, $clients clients"
rc=0
python3 bench/soak.py "$base" "$srv" "$dir/model.safetensors" "$minutes" "$clients" || rc=$?
if grep -q "SIGHUP: configuration reloaded" "$dir/serve.log"; then
    echo "server log: SIGHUP reloaded; $(grep -c ' error ' "$dir/serve.log" || true) error lines"
else
    echo "server log: no reload line after SIGHUP" >&2
    rc=1
fi
grep -q "draining" "$dir/serve.log" && { echo "server log: the server drained (the touch was taken for a change)" >&2; rc=1; }
exit $rc
