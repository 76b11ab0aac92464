# bench/lib.sh: sourced by the server benchmarks (serve.sh, compare.sh,
# step_budget.sh). Not a command.

# bench_setup NAME BUILD: a scratch directory (sets dir) holding the
# bench_model checkpoint written by BUILD; on exit the server bench_serve
# started is stopped and the directory removed.
bench_setup() {
    dir=$(mktemp -d "/tmp/gpt2d-bench-$1-XXXXXX")
    srv=
    trap 'bench_stop; rm -rf "$dir"' EXIT
    bench_model "$2" "$dir"
}

# bench_model BUILD DIR: a GPT-2-small-shaped synth checkpoint (aligned) with
# the real tokenizer in DIR.
bench_model() {
    "$1/server/gpt2d" synth "$2/model.safetensors" >/dev/null
    cp tokenizer/data/vocab.json tokenizer/data/merges.txt "$2/"
}

# bench_serve BUILD DIR [OPTION...]: starts `gpt2d serve` on the model in DIR
# on a free loopback port (log: DIR/serve.log); sets srv (its pid) and base
# (its URL: https:// when OPTIONs give it a certificate). Fails if it does
# not come up within 10 s.
bench_serve() {
    local build=$1 dir=$2 port=
    shift 2
    : > "$dir/serve.log"
    "$build/server/gpt2d" serve --model "$dir" --port 0 --kv-cache-mb 4096 "$@" \
        > "$dir/serve.log" 2>&1 &
    srv=$!
    for _ in $(seq 100); do
        port=$(sed -n 's|.* on https\{0,1\}://127.0.0.1:\([0-9]*\)$|\1|p' "$dir/serve.log")
        [ -n "$port" ] && break
        sleep 0.1
    done
    [ -n "$port" ] || { echo "$build: gpt2d serve did not start: $(tail -n 3 "$dir/serve.log")" >&2; return 1; }
    base="http://127.0.0.1:$port"
    grep -q " on https://127.0.0.1:$port\$" "$dir/serve.log" && base="https://127.0.0.1:$port"
    return 0
}

# bench_stop: stops the server bench_serve started.
bench_stop() {
    kill "$srv" 2>/dev/null || true
    wait "$srv" 2>/dev/null || true
    srv=
}
