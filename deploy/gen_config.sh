#!/bin/sh
# deploy/gen_config.sh GPT2D OUT: the example /etc/gpt2d/gpt2d.conf, from
# `gpt2d serve --print-defaults`, with the model directory the service uses.
set -eu
"$1" serve --print-defaults |
    sed 's|^# model = \.\.\.$|model = /var/lib/gpt2d/models/gpt2|' > "$2.tmp"
grep -q '^model = /var/lib/gpt2d/models/gpt2$' "$2.tmp"
mv "$2.tmp" "$2"
