#!/usr/bin/env bash
# tests/test_shared_weights.sh GPT2D HOLD_MODEL: two processes that map the
# same aligned checkpoint share one copy of the weights in the page cache
# (each one's Pss is about half the file), in F32 and in the 16-bit and
# 8-bit formats, which are served as stored (no private F32 copy), while a
# misaligned checkpoint costs each process a private copy. Reads
# /proc/PID/smaps_rollup.
set -euo pipefail
gpt2d=$1 hold=$2
dir=$(mktemp -d /tmp/gpt2d-pss-XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

mkdir "$dir/mis" "$dir/al"
# 4 layers of width 512 and GPT-2's vocabulary: ~154 MB of weights.
"$gpt2d" synth "$dir/mis/model.safetensors" --layers 4 --embd 512 --heads 8 --misaligned --mask-buffers
"$gpt2d" convert "$dir/mis/model.safetensors" "$dir/al/model.safetensors"
cp "$dir/mis/config.json" "$dir/al/"
"$gpt2d" inspect "$dir/al/model.safetensors" | grep -q ' 0 misaligned$' || fail "convert left misaligned tensors"
weights_kb=$(( $(stat -c %s "$dir/al/model.safetensors") / 1024 ))

field() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/smaps_rollup"; }

measure() { # model dir -> "pss_a anon_a pss_b anon_b" (kB)
    local fifo_a="$dir/in_a" fifo_b="$dir/in_b" out=""
    mkfifo "$fifo_a" "$fifo_b"
    "$hold" "$1" < "$fifo_a" > "$dir/ready_a" & local a=$!
    exec 7>"$fifo_a"
    "$hold" "$1" < "$fifo_b" > "$dir/ready_b" & local b=$!
    exec 8>"$fifo_b"
    pids+=("$a" "$b")
    for _ in $(seq 600); do
        grep -q ready "$dir/ready_a" 2>/dev/null && grep -q ready "$dir/ready_b" 2>/dev/null && break
        sleep 0.1
    done
    grep -q ready "$dir/ready_a" && grep -q ready "$dir/ready_b" || fail "holders did not start"
    out="$(field $a Pss) $(field $a Pss_Anon) $(field $b Pss) $(field $b Pss_Anon)"
    exec 7>&- 8>&-
    wait "$a" "$b"
    rm -f "$fifo_a" "$fifo_b"
    echo "$out"
}

# The F32 file's own pages (GPT2D_PANEL_COPY=off): at the AVX-512 level a
# Hugging Face file's projections are otherwise read from a panel copy,
# measured below.
read -r pa aa pb ab <<< "$(GPT2D_PANEL_COPY=off measure "$dir/al")"
read -r ma mana mb manb <<< "$(measure "$dir/mis")"
echo "weights ${weights_kb} kB"
echo "aligned:    Pss ${pa} + ${pb} kB, of which private (Pss_Anon) ${aa} + ${ab} kB"
echo "misaligned: Pss ${ma} + ${mb} kB, of which private (Pss_Anon) ${mana} + ${manb} kB"
# shared_half WHAT KB PSS ANON: a process's file-backed Pss (Pss less its
# private Pss_Anon: the pages of the weights it has read, and its
# libraries') is at most about half the file, the other process holding
# the other half; private memory (the step buffers, whatever
# MALLOC_PERTURB_ touches) is checked on its own below.
shared_half() {
    local f=$(( $3 - $4 ))
    [ "$f" -lt $(( $2 * 3 / 4 )) ] || fail "$1 file-backed Pss $f kB is not shared (weights $2 kB)"
}
# Aligned: each holds about half of the shared file pages, little private.
shared_half aligned "$weights_kb" "$pa" "$aa"
shared_half aligned "$weights_kb" "$pb" "$ab"
for p in "$aa" "$ab"; do
    [ "$p" -lt $(( weights_kb / 5 )) ] || fail "aligned private memory $p kB"
done
# Misaligned: each holds a private copy.
for p in "$mana" "$manb"; do
    [ "$p" -gt $(( weights_kb * 9 / 10 )) ] || fail "misaligned private memory $p kB is not a full copy"
done
# BF16 and q8 (`gpt2d convert --dtype`): shared too, nothing widened into
# private memory.
# (BF16 at the widening kernels: at the default "avx512-bf16" level the
# projections of an hf or panel64 file are read from a pair copy built at
# load, measured below.)
for dt in bf16 q8; do
    mkdir "$dir/$dt"
    "$gpt2d" convert "$dir/al/model.safetensors" "$dir/$dt/model.safetensors" --dtype "$dt" 2>/dev/null
    cp "$dir/al/config.json" "$dir/$dt/"
    kb=$(( $(stat -c %s "$dir/$dt/model.safetensors") / 1024 ))
    read -r pa aa pb ab <<< "$(GPT2D_KERNELS=avx512 measure "$dir/$dt")"
    echo "$dt: weights ${kb} kB; Pss ${pa} + ${pb} kB, of which private ${aa} + ${ab} kB"
    shared_half "$dt" "$kb" "$pa" "$aa"
    shared_half "$dt" "$kb" "$pb" "$ab"
    for p in "$aa" "$ab"; do
        [ "$p" -lt $(( weights_kb / 5 )) ] || fail "$dt private memory $p kB"
    done
done
# BF16 and q8 at the default level: where the CPU has AVX512_BF16 (and
# AVX512_VNNI) the projections are read from their pair (quad) copy, and
# BF16's LM head from wte's (engine/op_matmul_bf16.c, op_matmul_q8.c):
# private memory of the copies' size and no more; the rest is shared as
# above.
for dt in bf16 q8; do
    read -r pa aa pb ab <<< "$(measure "$dir/$dt")"
    pair_kb=$(( $(awk '{ print $3 }' "$dir/ready_a") / 1024 ))
    echo "$dt, default kernels: copy ${pair_kb} kB; Pss ${pa} + ${pb} kB, of which private ${aa} + ${ab} kB"
    shared_half "$dt (default kernels)" $(( $(stat -c %s "$dir/$dt/model.safetensors") / 1024 )) "$pa" "$aa"
    for p in "$aa" "$ab"; do
        [ "$p" -lt $(( weights_kb / 5 + pair_kb )) ] || fail "$dt private memory $p kB (copy $pair_kb kB)"
    done
done
# F32 at the default level: where the AVX-512 panel kernels run, a Hugging
# Face file's projections are read from a panel copy built at load
# (engine/op_w_panels.c): private memory of the copy's size and no more,
# the file's pages of the projections dropped from the process (read once,
# to build it), the rest shared. A panel64 file needs no copy.
read -r pa aa pb ab <<< "$(measure "$dir/al")"
panel_kb=$(( $(awk '{ print $4 }' "$dir/ready_a") / 1024 ))
echo "f32, default kernels: panel copy ${panel_kb} kB; Pss ${pa} + ${pb} kB, of which private ${aa} + ${ab} kB"
for p in "$aa" "$ab"; do
    [ "$p" -lt $(( weights_kb / 5 + panel_kb )) ] || fail "f32 private memory $p kB (copy $panel_kb kB)"
done
for p in "$pa" "$pb"; do
    [ "$p" -lt $(( (weights_kb - panel_kb) * 3 / 4 + panel_kb + weights_kb / 5 )) ] \
        || fail "f32 with its panel copy: Pss $p kB keeps the file's projections too (copy $panel_kb kB)"
done
mkdir "$dir/p"
"$gpt2d" convert "$dir/al/model.safetensors" "$dir/p/model.safetensors" --layout panel64 2>/dev/null
cp "$dir/al/config.json" "$dir/p/"
read -r pa aa pb ab <<< "$(measure "$dir/p")"
echo "f32 panel64: copy $(awk '{ print $4 }' "$dir/ready_a") bytes; Pss ${pa} + ${pb} kB, of which private ${aa} + ${ab} kB"
[ "$(awk '{ print $4 }' "$dir/ready_a")" = 0 ] || fail "a panel64 file got a panel copy"
shared_half "f32 panel64" "$weights_kb" "$pa" "$aa"
shared_half "f32 panel64" "$weights_kb" "$pb" "$ab"
for p in "$aa" "$ab"; do
    [ "$p" -lt $(( weights_kb / 5 )) ] || fail "f32 panel64 private memory $p kB"
done
# BF16 in the pairs64 layout (`gpt2d convert --layout pairs64`): at the
# avx512-bf16 level the projections are read from the shared mapping, so
# the private memory is wte's pair copy and no more, and two processes
# share the projections' pages; below that level (GPT2D_KERNELS=avx512) a
# panel copy of the projections takes their place.
mkdir "$dir/pairs"
"$gpt2d" convert "$dir/al/model.safetensors" "$dir/pairs/model.safetensors" --dtype bf16 \
    --layout pairs64 2>/dev/null
cp "$dir/al/config.json" "$dir/pairs/"
kb=$(( $(stat -c %s "$dir/pairs/model.safetensors") / 1024 ))
read -r pa aa pb ab <<< "$(measure "$dir/pairs")"
read -r _ _ pair_b panel_b < "$dir/ready_a"
echo "bf16 pairs64: weights ${kb} kB; pair copy $(( pair_b / 1024 )) kB, panel copy $(( panel_b / 1024 )) kB; Pss ${pa} + ${pb} kB, of which private ${aa} + ${ab} kB"
shared_half "bf16 pairs64" "$kb" "$pa" "$aa"
shared_half "bf16 pairs64" "$kb" "$pb" "$ab"
for p in "$aa" "$ab"; do
    [ "$p" -lt $(( weights_kb / 5 + pair_b / 1024 + panel_b / 1024 )) ] \
        || fail "bf16 pairs64 private memory $p kB (copies $(( (pair_b + panel_b) / 1024 )) kB)"
done
# Where the kernels read the pairs, the one copy is wte's (V = 50257 rows
# of C = 512, as the LM head reads it: ceil(V / 64) panels of C / 2 pairs
# of 64 lanes of 4 bytes); else none but the panel copy.
wte_pairs=$(( (50257 + 63) / 64 * 256 * 64 * 4 ))
{ [ "$pair_b" = "$wte_pairs" ] && [ "$panel_b" = 0 ]; } || { [ "$pair_b" = 0 ] && [ "$panel_b" -gt 0 ]; } \
    || fail "bf16 pairs64: copies $pair_b + $panel_b bytes (wte's pairs $wte_pairs)"
echo "shared weights: ok"
