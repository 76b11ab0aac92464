#!/bin/sh
# deploy/install_config.sh CONF CONFDIR: run by `meson install`. Installs
# CONF as CONFDIR/gpt2d.conf.default, and as CONFDIR/gpt2d.conf only when
# that does not exist (an operator's edits survive upgrades).
set -eu
dir="${DESTDIR:-}$2"
mkdir -p "$dir"
install -m 0644 "$1" "$dir/gpt2d.conf.default"
if [ -e "$dir/gpt2d.conf" ]; then
    echo "gpt2d: kept $dir/gpt2d.conf; the new defaults are in gpt2d.conf.default"
else
    install -m 0644 "$1" "$dir/gpt2d.conf"
    echo "gpt2d: installed $dir/gpt2d.conf"
fi
