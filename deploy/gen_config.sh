#!/bin/sh
# deploy/gen_config.sh GPT2D OUT TINYDIR: the example /etc/gpt2d/gpt2d.conf,
# from `gpt2d serve --print-defaults`, with the model directory the service
# uses and, until the operator downloads GPT-2 there, the installed
# embedded model (TINYDIR) as fallback_model.
set -eu
"$1" serve --print-defaults |
    sed -e 's|^# model = \.\.\.$|model = /var/lib/gpt2d/models/gpt2|' \
        -e "s|^# fallback_model = \\.\\.\\.\$|fallback_model = $3|" > "$2.tmp"
grep -q '^model = /var/lib/gpt2d/models/gpt2$' "$2.tmp"
grep -qx "fallback_model = $3" "$2.tmp"
mv "$2.tmp" "$2"
