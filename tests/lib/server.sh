# tests/lib/server.sh: the shell suites' way to start `gpt2d serve`, through
# tests/lib/gpt2d_server.py (the harness the Python tests import). Source it
# with $gpt2d (the binary) and $dir (the scratch directory) set.
#
#   srv_model DIR SHAPE             a synth checkpoint (gpt2d_server.SHAPES) in DIR
#   srv_start NAME MODEL [OPTS...]  `gpt2d serve --model MODEL --port 0 OPTS` with
#                                   its log in $dir/NAME.log; sets port, base and
#                                   last_pid (a child of this shell: kill, wait)
#   srv_stop_all                    SIGKILL every server this shell started
srv_lib=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
srv_pids=()

srv_model() { python3 "$srv_lib/gpt2d_server.py" model "$gpt2d" "$@"; }

srv_start() {
    local name=$1 model=$2 got
    shift 2
    : > "$dir/$name.log" # before the server: the wait below must not race its creation
    python3 "$srv_lib/gpt2d_server.py" exec "$dir/$name.log" "$gpt2d" "$model" "$@" &
    last_pid=$!
    srv_pids+=("$last_pid")
    if ! got=$(python3 "$srv_lib/gpt2d_server.py" wait-port "$dir/$name.log" "$last_pid" 30 2>&1); then
        echo "FAIL: server $name $got" >&2
        return 1
    fi
    port=$got
    base="http://127.0.0.1:$port"
}

srv_stop_all() {
    local p
    for p in "${srv_pids[@]}"; do
        { kill -9 "$p" && wait "$p"; } 2>/dev/null || true
    done
}
