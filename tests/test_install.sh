#!/usr/bin/env bash
# tests/test_install.sh BUILD: `meson install` into a scratch DESTDIR puts the
# binary, the download script, the unit files (gpt2d@.service too), the
# embedded model and /etc/gpt2d/gpt2d.conf in place; the config file holds
# every key with its default, and the installed configuration, run as the
# units run it, serves the installed gpt2d-tiny with no GPT-2 downloaded
# (saying so, and naming gpt2d-download), while without that fallback the
# missing model's error names gpt2d-download; an operator's edits survive a
# second install.
set -euo pipefail
build=$(realpath "$1")
dest=$(mktemp -d /tmp/gpt2d-install-XXXXXX)
trap 'rm -rf "$dest"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
meson install -C "$build" --destdir "$dest" --no-rebuild --quiet > /dev/null
prefix=$(meson introspect "$build" --buildoptions | python3 -c \
    'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"][0])')
tiny=$prefix/share/gpt2d/models/gpt2d-tiny
for f in "$prefix/bin/gpt2d" "$prefix/bin/gpt2d-download" "$prefix/lib/systemd/system/gpt2d.service" \
         "$prefix/lib/systemd/system/gpt2d@.service" "$prefix/lib/systemd/system/gpt2d.socket" \
         "$prefix/share/doc/gpt2d/operations.md" "$tiny/model.safetensors" "$tiny/config.json" \
         "$tiny/vocab.json" "$tiny/merges.txt" "$tiny/README.md"; do
    [ -e "$dest$f" ] || fail "$f not installed"
done
[ -x "$dest$prefix/bin/gpt2d-download" ] || fail "gpt2d-download is not executable"
case "$prefix" in /usr|/usr/local) conf=/etc/gpt2d ;; *) conf=$prefix/etc/gpt2d ;; esac
[ -f "$dest$conf/gpt2d.conf" ] || fail "$conf/gpt2d.conf not installed"
grep -q "^ExecStart=$prefix/bin/gpt2d serve --config $conf/gpt2d.conf$" \
    "$dest$prefix/lib/systemd/system/gpt2d.service" || fail "ExecStart does not name the installed paths"
# Every key of `gpt2d serve --help` is in the file, with its default (a key
# whose unset value means more than its default, model_name: the
# checkpoint's own name, is there commented out).
"$build/server/gpt2d" serve --help | sed -n 's/^  --\([a-z-]*\) .*default: \(.*\))$/\1 \2/p' |
    while read -r opt def; do
        key=${opt//-/_}
        [ "$def" = none ] && continue
        # literally: a default may hold a pattern's characters (tls_priorities' +)
        grep -Fxq -e "$key = $def" -e "# $key = $def" "$dest$conf/gpt2d.conf" ||
            fail "$key = $def missing from gpt2d.conf"
    done
grep -q "^ExecStart=$prefix/bin/gpt2d serve --config $conf/gpt2d.conf --port %i$" \
    "$dest$prefix/lib/systemd/system/gpt2d@.service" || fail "gpt2d@.service's ExecStart does not name the instance's port"
grep -q '^model = /var/lib/gpt2d/models/gpt2$' "$dest$conf/gpt2d.conf" || fail "no model line"
grep -qx "fallback_model = $tiny" "$dest$conf/gpt2d.conf" || fail "no fallback_model line naming $tiny"
cmp -s "$dest$tiny/model.safetensors" "$(dirname "$0")/../models/gpt2d-tiny/model.safetensors" ||
    fail "the installed gpt2d-tiny is not models/gpt2d-tiny"

# The installed configuration as gpt2d@PORT runs it (its ExecStart, %i the
# port), offline, with nothing in /var/lib/gpt2d/models/gpt2: it serves the
# installed gpt2d-tiny and says why and what to do. The installed paths are
# read from DESTDIR (the one change to the file).
port=$(python3 "$(dirname "$0")/lib/gpt2d_server.py" free-port)
sed "s|^fallback_model = $tiny\$|fallback_model = $dest$tiny|" "$dest$conf/gpt2d.conf" > "$dest/instance.conf"
exec_start=$(sed -n 's/^ExecStart=//p' "$dest$prefix/lib/systemd/system/gpt2d@.service")
exec_start=${exec_start//%i/$port}
exec_start=${exec_start/#$prefix\/bin\/gpt2d/$build/server/gpt2d}
exec_start=${exec_start/ $conf\/gpt2d.conf / $dest/instance.conf }
[ -d /var/lib/gpt2d/models/gpt2 ] && fail "this machine has /var/lib/gpt2d/models/gpt2: the fallback cannot be tested here"
# shellcheck disable=SC2086 # the unit's command line, split as systemd splits it (no quotes in it)
$exec_start > "$dest/instance.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$dest"' EXIT
for _ in $(seq 300); do
    curl -s -o /dev/null "http://127.0.0.1:$port/health" && break
    kill -0 "$pid" 2>/dev/null || fail "the installed configuration did not start: $(tail -3 "$dest/instance.log")"
    sleep 0.1
done
out=$(curl -s -m 30 "http://127.0.0.1:$port/v1/models")
grep -q '"id": *"gpt2d-tiny"' <<< "$out" || fail "the installed configuration does not serve gpt2d-tiny: $out"
curl -s -m 30 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "Hello", "max_tokens": 4}' | grep -qx 200 || fail "no completion from the installed configuration"
grep -q "warn no model in /var/lib/gpt2d/models/gpt2 yet: serving fallback_model $dest$tiny .*gpt2d-download" "$dest/instance.log" ||
    fail "the log does not say it serves the fallback and how to get GPT-2: $(head -3 "$dest/instance.log")"
kill "$pid"
wait "$pid" || fail "the instance's exit status after SIGTERM: $?"
# Without the fallback, the missing model's error names gpt2d-download.
set +e
out=$("$build/server/gpt2d" serve --config "$dest/instance.conf" --fallback-model '' --port 0 2>&1)
set -e
grep -q 'gpt2d serve: .*/var/lib/gpt2d/models/gpt2 has no model yet: gpt2d-download' <<< "$out" ||
    fail "a missing model's error does not name gpt2d-download: $out"

# The file parses: serve reads it and fails only on the missing model.
set +e
out=$("$build/server/gpt2d" serve --config "$dest$conf/gpt2d.conf" --model /nonexistent 2>&1)
set -e
grep -q 'nonexistent' <<< "$out" || fail "the installed config does not parse: $out"
# An edited gpt2d.conf survives the next install.
echo "port = 9999" >> "$dest$conf/gpt2d.conf"
meson install -C "$build" --destdir "$dest" --no-rebuild --quiet > /dev/null
grep -q '^port = 9999$' "$dest$conf/gpt2d.conf" || fail "an install overwrote the edited gpt2d.conf"
cmp -s "$dest$conf/gpt2d.conf.default" "$build/deploy/gpt2d.conf" || fail "gpt2d.conf.default is not the new defaults"
echo "install: all checks passed ($prefix, $conf)"
