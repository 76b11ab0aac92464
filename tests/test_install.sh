#!/usr/bin/env bash
# tests/test_install.sh BUILD: `meson install` into a scratch DESTDIR puts the
# binary, the download script, the unit files and /etc/gpt2d/gpt2d.conf in
# place; the config file holds every key with its default (the server starts
# with it) and an operator's edits survive a second install.
set -euo pipefail
build=$(realpath "$1")
dest=$(mktemp -d /tmp/gpt2d-install-XXXXXX)
trap 'rm -rf "$dest"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
meson install -C "$build" --destdir "$dest" --no-rebuild --quiet > /dev/null
prefix=$(meson introspect "$build" --buildoptions | python3 -c \
    'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"][0])')
for f in "$prefix/bin/gpt2d" "$prefix/bin/gpt2d-download" "$prefix/lib/systemd/system/gpt2d.service" \
         "$prefix/lib/systemd/system/gpt2d.socket" "$prefix/share/doc/gpt2d/operations.md"; do
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
grep -q '^model = /var/lib/gpt2d/models/gpt2$' "$dest$conf/gpt2d.conf" || fail "no model line"
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
