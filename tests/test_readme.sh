#!/usr/bin/env bash
# tests/test_readme.sh SRCDIR: the README's first two commands work as
# written, in order, in a fresh clone. The commands are read from README.md
# (the indented lines of its "Three commands" section, the first two), so
# that the README stays the truth:
#   1. the serve command (scripts/run.sh), with `--port N` added (a free
#      port: the README says its options go through) and GPT2D_HUB pointing
#      at a closed local port, so that the download fails at once as on a
#      machine without the hub: it must build, say in one line per attempt
#      that the download failed (no raw curl lines), fall back to the
#      embedded gpt2d-tiny, and answer a completion; then SIGTERM, exit 0;
#   2. the test command (scripts/test.sh --fast), as written: it must
#      configure its own build directory and pass.
# The clone is of SRCDIR's committed tree (HEAD), as a new user gets it.
# Prints each command's wall time. Without git it skips (77).
set -euo pipefail
src=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d /tmp/gpt2d-readme-XXXXXX)
pid=
cleanup() {
    if [ -n "$pid" ]; then kill -9 "$pid" 2> /dev/null || true; fi
    rm -rf "$dir"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*" >&2
    for f in "$dir"/*.log; do [ -f "$f" ] && { echo "== $f"; tail -30 "$f"; }; done >&2
    exit 1
}
command -v git > /dev/null && git -C "$src" rev-parse HEAD > /dev/null 2>&1 ||
    { echo "SKIP: $src is not a git checkout (this test clones it)"; exit 77; }

mapfile -t cmds < <(python3 - "$src/README.md" << 'PY'
import sys
text = open(sys.argv[1], encoding="utf-8").read()
section = text.split("\n## Three commands\n", 1)[1].split("\n## ", 1)[0]
for line in section.splitlines():
    if line.startswith("    ") and line.strip():
        print(line.strip())
PY
)
[ ${#cmds[@]} -ge 2 ] || fail "README.md's \"Three commands\" has fewer than two commands: ${cmds[*]}"
serve=${cmds[0]} test=${cmds[1]}
[[ $serve == scripts/run.sh* ]] || fail "the README's first command is not scripts/run.sh: $serve"
echo "readme: 1. $serve"
echo "readme: 2. $test"

# cpu_now: CPU seconds of this shell's waited-for children so far into
# $cpu (bash's `times`, its second line; run in this shell, not in a $(...)
# subshell, whose children are its own).
cpu_now() {
    times > "$dir/times"
    cpu=$(tail -1 "$dir/times" | python3 -c 'import re, sys
print(round(sum(int(m) * 60 + float(x) for m, x in re.findall(r"(\d+)m([\d.]+)s", sys.stdin.read()))))')
}
git clone -q "$src" "$dir/gpt2d"
port=$(python3 "$here/lib/gpt2d_server.py" free-port)
t0=$EPOCHREALTIME
(cd "$dir/gpt2d" && GPT2D_HUB=http://127.0.0.1:9 exec bash -c "exec $serve --port $port") > "$dir/serve.log" 2>&1 &
pid=$!
until curl -s -o /dev/null "http://127.0.0.1:$port/health"; do
    kill -0 "$pid" 2> /dev/null || fail "the serve command exited before it served"
    sleep 0.2
done
code=$(curl -s -m 60 -o "$dir/answer.json" -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" \
    -H 'Content-Type: application/json' -d '{"prompt": "Hello, my name is", "max_tokens": 8}')
t1=$EPOCHREALTIME
[ "$code" = 200 ] || fail "the served model's answer: $code $(cat "$dir/answer.json")"
grep -q '"model": *"gpt2d-tiny"' "$dir/answer.json" || fail "not the embedded gpt2d-tiny: $(cat "$dir/answer.json")"
# Its first screen in words: one line per failed attempt, the fallback, no
# raw curl output.
grep -q '^download: vocab.json: attempt 3 of 3 failed: cannot connect to 127.0.0.1:9' "$dir/serve.log" ||
    fail "no line per attempt in words"
grep -q '^run: serving the embedded gpt2d-tiny instead' "$dir/serve.log" || fail "the fallback is not said"
! grep -q '^curl' "$dir/serve.log" || fail "raw curl output: $(grep '^curl' "$dir/serve.log")"
kill "$pid"
rc=0
wait "$pid" || rc=$?
pid=
[ "$rc" = 0 ] || fail "the serve command's exit status after SIGTERM: $rc"
cpu_now
c0=$cpu
echo "readme: 1. served its first answer $(((${t1/./} - ${t0/./}) / 1000000)) s after the clone ($c0 CPU s in all)"

t0=$EPOCHREALTIME
(cd "$dir/gpt2d" && bash -c "$test") > "$dir/test.log" 2>&1 || fail "the test command failed"
t1=$EPOCHREALTIME
grep -Eq '^Ok: +[1-9]' "$dir/test.log" && grep -Eq '^Fail: +0' "$dir/test.log" ||
    fail "the test command ran no test, or a test failed"
cpu_now
echo "readme: 2. passed in $(((${t1/./} - ${t0/./}) / 1000000)) s ($((cpu - c0)) CPU s; $(grep -E '^Ok:' "$dir/test.log" | tr -s ' '))"
echo "readme: both commands work as written"
