#!/usr/bin/env bash
# tests/test_cli.sh GPT2D [CASE...]: the gpt2d command line on real files.
# Each case is a function case_NAME; name cases to run only those, `--list`
# lists them (tests/lib/cases.sh); every failing case is reported at the
# end. A case that needs a file an earlier case makes (need_*) makes it the
# same way when run alone.
set -euo pipefail
gpt2d=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d /tmp/gpt2d-cli-XXXXXX)
trap 'rm -rf "$dir"' EXIT
. "$here/lib/cases.sh"

need_numpy() { /usr/bin/python3 -c 'import numpy' 2> /dev/null || skip "python3-numpy is not installed (scripts/setup.sh --test installs it)"; }
need_a() { # synth's a.safetensors
    [ -f "$dir/a.safetensors" ] ||
        "$gpt2d" synth "$dir/a.safetensors" --layers 2 --embd 64 --heads 2 --ctx 32 --vocab 300 --seed 3 > /dev/null
}
need_dtypes() { # convert_dtype's a_f16, a_bf16, a_q8
    need_a
    for dt in f16 bf16 q8; do
        [ -f "$dir/a_$dt.safetensors" ] || "$gpt2d" convert "$dir/a.safetensors" "$dir/a_$dt.safetensors" --dtype "$dt" 2>/dev/null
    done
}
need_q8_f32() { # q8_values' q8_f32
    need_dtypes
    [ -f "$dir/q8_f32.safetensors" ] || "$gpt2d" convert "$dir/a_q8.safetensors" "$dir/q8_f32.safetensors" --dtype f32 2>/dev/null
}
need_bench() { # bench's bench/ and bench.json
    [ -f "$dir/bench.json" ] && return 0
    mkdir -p "$dir/bench"
    "$gpt2d" synth "$dir/bench/model.safetensors" --layers 2 --embd 64 --heads 2 --ctx 64 --vocab 300 --seed 3 > /dev/null
    "$gpt2d" bench --model "$dir/bench" --tokens 4 --sequences 3,1 > "$dir/bench.json"
}

# Usage errors exit 2 with the usage; help exits 0.
case_usage() {
"$gpt2d" help | grep -q '^  inspect' || fail "help does not list inspect"
"$gpt2d" help | grep -q '^  synth' || fail "help does not list synth"
set +e
"$gpt2d" frobnicate 2>"$dir/err"; rc=$?
set -e
[ "$rc" = 2 ] || fail "unknown command exited $rc"
grep -q "unknown command 'frobnicate'" "$dir/err" || fail "no message for unknown command"
grep -q "^usage: gpt2d" "$dir/err" || fail "no usage for unknown command"
set +e
"$gpt2d" inspect --bogus x 2>"$dir/err"; rc=$?
"$gpt2d" 2>/dev/null; rc0=$?
"$gpt2d" synth --layers 0 "$dir/x" 2>/dev/null; rc1=$?
"$gpt2d" synth --embd 100 --heads 3 "$dir/x" 2>/dev/null; rc2=$?
set -e
[ "$rc" = 2 ] || fail "unknown option exited $rc"
grep -q "usage: gpt2d inspect" "$dir/err" || fail "no usage for unknown option"
[ "$rc0" = 2 ] || fail "no command exited $rc0"
[ "$rc1" = 2 ] || fail "--layers 0 exited $rc1"
[ "$rc2" = 2 ] || fail "embd not a multiple of heads exited $rc2"
}

# The Done-means check of the foundation issue: a GPT-2-small-shaped file,
# misaligned, with the mask buffers, lists 160 tensors, all misaligned.
case_inspect_small() {
"$gpt2d" synth "$dir/small.safetensors" --misaligned --mask-buffers --seed 7
"$gpt2d" inspect "$dir/small.safetensors" > "$dir/out"
grep -q '^160 tensors, 137022720 elements, 0 aligned, 160 misaligned$' "$dir/out" \
    || { cat "$dir/out" | tail -3; fail "inspect summary"; }
grep -Eq '^wte.weight +F32 +\[50257, 768\] ' "$dir/out" || fail "wte.weight row"
grep -Eq '^h.11.attn.bias +F32 +\[1, 1, 1024, 1024\] ' "$dir/out" || fail "mask row"
grep -q 'metadata    format=pt' "$dir/out" || fail "metadata"
"$gpt2d" inspect --json "$dir/small.safetensors" > "$dir/out.json"
python3 - "$dir/out.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["tensor_count"] == 160, d["tensor_count"]
assert d["aligned_count"] == 0
assert d["data_start"] % 4 == 3, d["data_start"]
assert d["metadata"] == {"format": "pt", "gpt2d.weights": "random"}, d["metadata"]
t = {x["name"]: x for x in d["tensors"]}
assert t["h.0.attn.c_attn.weight"]["shape"] == [768, 2304]
assert t["h.0.mlp.c_proj.weight"]["shape"] == [3072, 768]
assert sum(1 for n in t if n.endswith(".attn.bias")) == 12
# The tensors tile the data section.
spans = sorted(x["data_offsets"] for x in d["tensors"])
pos = 0
for b, e in spans:
    assert b == pos, (b, pos)
    pos = e
assert pos == d["file_size"] - d["data_start"]
PY
grep -q '"n_head": 12' "$dir/config.json" || fail "config.json"
}

# Aligned by default; same seed, same bytes; different seed, different bytes.
case_synth() {
"$gpt2d" synth "$dir/a.safetensors" --layers 2 --embd 64 --heads 2 --ctx 32 --vocab 300 --seed 3
"$gpt2d" synth "$dir/b.safetensors" --layers 2 --embd 64 --heads 2 --ctx 32 --vocab 300 --seed 3
"$gpt2d" synth "$dir/c.safetensors" --layers 2 --embd 64 --heads 2 --ctx 32 --vocab 300 --seed 4
cmp -s "$dir/a.safetensors" "$dir/b.safetensors" || fail "synth is not deterministic"
cmp -s "$dir/a.safetensors" "$dir/c.safetensors" && fail "the seed changes nothing"
"$gpt2d" inspect "$dir/a.safetensors" | grep -q '^28 tensors, .* 28 aligned, 0 misaligned$' \
    || fail "tiny synth not aligned"
"$gpt2d" synth "$dir/p.safetensors" --layers 1 --embd 64 --heads 1 --ctx 8 --vocab 10 \
    --prefix transformer. --lm-head
"$gpt2d" inspect "$dir/p.safetensors" | grep -Eq '^transformer.h.0.mlp.c_fc.weight +F32 +\[64, 256\]' \
    || fail "prefix"
"$gpt2d" inspect "$dir/p.safetensors" | grep -Eq '^lm_head.weight +F32 +\[10, 64\]' || fail "lm_head"
# --meta: what a checkpoint says about itself (wformat.h), set by synth,
# kept by convert through every format and layout, set again by convert;
# a value gpt2d would refuse to load is refused at once.
"$gpt2d" synth "$dir/m.safetensors" --layers 1 --embd 64 --heads 1 --ctx 8 --vocab 10 \
    --meta gpt2d.model_name=tiny-one --meta 'gpt2d.description=A test; not GPT-2' --meta gpt2d.weights=trained
"$gpt2d" convert "$dir/m.safetensors" "$dir/m8.safetensors" --dtype q8 --layout panel64 2> /dev/null
"$gpt2d" convert "$dir/m8.safetensors" "$dir/m16.safetensors" --dtype bf16 --layout hf --meta gpt2d.owned_by=tests 2> /dev/null
"$gpt2d" inspect --json "$dir/m16.safetensors" > "$dir/m16.json"
python3 - "$dir/m16.json" <<'PY' || fail "--meta through convert"
import json, sys
m = json.load(open(sys.argv[1]))["metadata"]
assert m == {"format": "pt", "gpt2d.model_name": "tiny-one", "gpt2d.description": "A test; not GPT-2",
             "gpt2d.weights": "trained", "gpt2d.owned_by": "tests"}, m
PY
for bad in 'gpt2d.weights=rnd|--meta gpt2d.weights: "random" or "trained"' \
           'gpt2d.model_name=a b|--meta gpt2d.model_name: 1 to 127 printable ASCII characters without spaces' \
           'gpt2d.layout=panel64|--meta gpt2d.layout: written by gpt2d convert itself (--dtype, --layout)' \
           'gpt2d.nmae=x|--meta gpt2d.nmae: not a key gpt2d knows' 'noequals|--meta takes KEY=VALUE'; do
    for cmd in "synth $dir/bad.safetensors" "convert $dir/m.safetensors $dir/bad.safetensors"; do
        set +e
        # shellcheck disable=SC2086 # the command's words
        "$gpt2d" $cmd --meta "${bad%%|*}" 2> "$dir/meta.err" > /dev/null; rc=$?
        set -e
        [ "$rc" = 2 ] && head -1 "$dir/meta.err" | grep -qF -- "${bad#*|}" || fail "--meta ${bad%%|*}: $rc $(head -1 "$dir/meta.err")"
    done
done
[ ! -e "$dir/bad.safetensors" ] || fail "a refused --meta wrote a file"
}

# An invalid file: exit 1, one line on stderr.
case_invalid_file() {
printf 'garbage!' > "$dir/bad.safetensors"
set +e
"$gpt2d" inspect "$dir/bad.safetensors" >/dev/null 2>"$dir/err"; rc=$?
set -e
[ "$rc" = 1 ] || fail "invalid file exited $rc"
[ "$(wc -l < "$dir/err")" = 1 ] || fail "error is not one line"
grep -q "bad.safetensors" "$dir/err" || fail "error does not name the file"
}

# tokenize / detokenize on the vendored GPT-2 vocabulary.
case_tokenize() {
vocab=$(dirname "$0")/../tokenizer/data
(cd "$vocab" && sha256sum --quiet -c SHA256SUMS) || fail "the vendored vocabulary does not match its published sha256"
grep -q '^196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783  vocab.json$' "$vocab/SHA256SUMS" || fail "SHA256SUMS vocab.json"
grep -q '^1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5  merges.txt$' "$vocab/SHA256SUMS" || fail "SHA256SUMS merges.txt"
[ "$(printf 'Hello, world!' | "$gpt2d" tokenize --model "$vocab")" = "[15496, 11, 995, 0]" ] || fail "tokenize"
printf '"Hello, my name is"\n" world"\n"\\u65e5\\u672c"\n' | "$gpt2d" tokenize --model "$vocab" --jsonl > "$dir/jl"
[ "$(sed -n 1p "$dir/jl")" = "[15496, 11, 616, 1438, 318]" ] || fail "jsonl line 1"
[ "$(sed -n 2p "$dir/jl")" = "[995]" ] || fail "jsonl line 2"
[ "$(sed -n 3p "$dir/jl")" = "[33768, 98, 17312, 105]" ] || fail "jsonl line 3"
[ "$(echo '[15496, 11, 995, 0, 50256]' | "$gpt2d" detokenize --model "$vocab")" = "Hello, world!<|endoftext|>" ] || fail "detokenize"
head -c 4096 /dev/urandom > "$dir/rand.bin"
"$gpt2d" tokenize --model "$vocab" < "$dir/rand.bin" | "$gpt2d" detokenize --model "$vocab" > "$dir/rand.out"
cmp -s "$dir/rand.bin" "$dir/rand.out" || fail "random bytes do not round-trip"
set +e
echo '[1, 99999999]' | "$gpt2d" detokenize --model "$vocab" >/dev/null 2>"$dir/err"; rc=$?
echo '[1, "x"]' | "$gpt2d" detokenize --model "$vocab" >/dev/null 2>/dev/null; rc2=$?
echo 'not json' | "$gpt2d" tokenize --model "$vocab" --jsonl >/dev/null 2>/dev/null; rc3=$?
"$gpt2d" tokenize --model "$dir" </dev/null >/dev/null 2>"$dir/err2"; rc4=$?
"$gpt2d" tokenize </dev/null >/dev/null 2>/dev/null; rc5=$?
set -e
[ "$rc" = 1 ] && grep -q "99999999" "$dir/err" || fail "unknown id: rc $rc"
[ "$rc2" = 1 ] || fail "non-integer id: rc $rc2"
[ "$rc3" = 1 ] || fail "bad jsonl: rc $rc3"
[ "$rc4" = 1 ] && grep -q "vocab.json: cannot open" "$dir/err2" || fail "missing vocab: rc $rc4"
[ "$rc5" = 2 ] || fail "missing --model: rc $rc5"
}

# gpt2d bench: its JSON, the decode runs asked for with --sequences, and
# usage errors for a bad list.
case_bench() {
mkdir -p "$dir/bench"
"$gpt2d" synth "$dir/bench/model.safetensors" --layers 2 --embd 64 --heads 2 --ctx 64 --vocab 300 --seed 3
"$gpt2d" bench --model "$dir/bench" --tokens 4 --sequences 3,1 > "$dir/bench.json"
python3 - "$dir/bench.json" <<'PY' || fail "gpt2d bench output"
import json, sys
d = json.load(open(sys.argv[1]))
runs = d["decode"]
assert [r["sequences"] for r in runs] == [3, 1], runs
assert runs[1]["vs_single"] == 1.0 and runs[0]["tokens_per_s"] > 0, runs
assert d["model"]["layers"] == 2 and d["prefill_512"]["tokens_per_s"] > 0, d
PY
for bad in 0 65 1,2,3,4,5,6,7,8,9 4,x 4,; do
    set +e
    "$gpt2d" bench --model "$dir/bench" --sequences "$bad" 2>/dev/null; rc=$?
    set -e
    [ "$rc" = 2 ] || fail "--sequences $bad exited $rc"
done
}

# gpt2d convert --dtype: f16 and bf16 round to nearest even (checked here
# against numpy's float16 and the bf16 rounding written out), inspect and
# bench name the format, a bad --dtype is a usage error.
case_convert_dtype() {
need_numpy
need_a
# convert's last words say whether the server reads the file in place or,
# on the matrix-unit levels (inspect's kernels line), a private copy too.
for dt in f16 bf16 q8; do
    "$gpt2d" convert "$dir/a.safetensors" "$dir/a_$dt.safetensors" --dtype "$dt" 2>"$dir/said"
    "$gpt2d" inspect "$dir/a_$dt.safetensors" > "$dir/insp"
    grep -q "^format      $dt " "$dir/insp" || fail "inspect does not say $dt"
    kernels=$(sed -n 's/^kernels *\([^ ]*\) .*/\1/p' "$dir/insp")
    case "$kernels" in
    avx512-bf16 | avx512-vnni)
        grep -q "its $kernels kernels read a private copy of the projections" "$dir/said" ;;
    avx512) # f16 in the Hugging Face layout: the panel copy (engine/op_w_panels.c)
        [ "$dt" = f16 ] && grep -q "its avx512 kernels read a private panel copy" "$dir/said" ;;
    *) grep -q "reads its weights in place, without a copy in memory" "$dir/said" ;;
    esac || fail "convert --dtype $dt on kernels '$kernels' said: $(cat "$dir/said")"
done
"$gpt2d" convert "$dir/a_bf16.safetensors" "$dir/a_back.safetensors" 2>/dev/null
"$gpt2d" inspect "$dir/a_back.safetensors" > "$dir/insp"
grep -q "^format      bf16 " "$dir/insp" || fail "convert without --dtype changed the format"
"$gpt2d" convert "$dir/a_bf16.safetensors" "$dir/a_wide.safetensors" --dtype f32 2>/dev/null
"$gpt2d" inspect --json "$dir/a_wide.safetensors" > "$dir/wide.json"
grep -q '^  "format": "f32",$' "$dir/wide.json" || fail "inspect --json format"
/usr/bin/python3 - "$dir/a.safetensors" "$dir/a_f16.safetensors" "$dir/a_bf16.safetensors" \
    "$dir/a_wide.safetensors" <<'PY' || fail "convert rounding"
import json, struct, sys
import numpy as np
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    d = b[8 + n:]
    types = {"F32": "<f4", "F16": "<u2", "BF16": "<u2", "I8": "i1"}
    return {k: (v["dtype"], np.frombuffer(d[v["data_offsets"][0]:v["data_offsets"][1]],
                                          dtype=types[v["dtype"]]))
            for k, v in h.items() if k != "__metadata__"}
a, h, bf, wide = (load(p) for p in sys.argv[1:5])
for k, (dt, x) in a.items():
    assert h[k][0] == "F16" and np.array_equal(x.astype("<f2").view("<u2"), h[k][1]), k
    u = x.view("<u4").astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
    assert bf[k][0] == "BF16" and np.array_equal(r, bf[k][1]), k
    back = (bf[k][1].astype(np.uint32) << 16).view("<f4")
    assert wide[k][0] == "F32" and np.array_equal(back, wide[k][1]), k
PY
}

# q8 back to float: the dequantized values q * scale (blocks of 32 down the
# rows of a projection, along the rows of wte), and on to bf16.
case_q8_values() {
need_numpy
need_dtypes
"$gpt2d" convert "$dir/a_q8.safetensors" "$dir/q8_f32.safetensors" --dtype f32 2>/dev/null
"$gpt2d" convert "$dir/a_q8.safetensors" "$dir/q8_bf16.safetensors" --dtype bf16 2>/dev/null
"$gpt2d" inspect "$dir/q8_bf16.safetensors" > "$dir/insp"
grep -q "^format      bf16 " "$dir/insp" || fail "q8 -> bf16"
/usr/bin/python3 - "$dir/a.safetensors" "$dir/a_q8.safetensors" "$dir/q8_f32.safetensors" <<'PY' || fail "q8 values"
import json, struct, sys
import numpy as np
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    d = b[8 + n:]
    types = {"F32": "<f4", "I8": "i1"}
    return {k: np.frombuffer(d[v["data_offsets"][0]:v["data_offsets"][1]],
                             dtype=types[v["dtype"]]).reshape(v["shape"])
            for k, v in h.items() if k != "__metadata__"}
a, q, back = (load(p) for p in sys.argv[1:4])
assert "wte.weight.q8_scale" in q and "wpe.weight.q8_scale" not in q
for k, w in a.items():
    if w.ndim != 2 or k == "wpe.weight":
        assert np.array_equal(w, back[k]), k
        continue
    s = q[k + ".q8_scale"]
    if k == "wte.weight":
        full = np.repeat(s, 32, axis=1)
    else:
        full = np.repeat(s, 32, axis=0)[:w.shape[0]]
    assert np.array_equal((q[k].astype(np.float32) * full).astype(np.float32), back[k]), k
    assert np.abs(q[k]).max() <= 127 and np.abs(w - back[k]).max() <= full.max() / 2 * 1.001, k
PY
}

# A q8 file whose scale tensor is gone: inspect and convert refuse it, one
# line naming the tensor.
case_q8_malformed() {
need_dtypes
/usr/bin/python3 - "$dir/a_q8.safetensors" "$dir/q8bad.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
d = b[8 + n:]
drop = "h.0.mlp.c_fc.weight.q8_scale"
out, pos, hdr = b"", 0, {"__metadata__": h["__metadata__"]}
for k in sorted(x for x in h if x not in ("__metadata__", drop)):
    s, e = h[k]["data_offsets"]
    hdr[k] = dict(h[k], data_offsets=[pos, pos + e - s])
    out += d[s:e]
    pos += e - s
j = json.dumps(hdr).encode()
j += b" " * (-len(j) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(j)) + j + out)
PY
set +e
"$gpt2d" inspect "$dir/q8bad.safetensors" >/dev/null 2>"$dir/err"; rc=$?
"$gpt2d" convert "$dir/q8bad.safetensors" "$dir/x.safetensors" 2>"$dir/err2"; rc2=$?
set -e
[ "$rc" = 1 ] && [ "$(wc -l < "$dir/err")" = 1 ] \
    && grep -q "q8 tensor 'h.0.mlp.c_fc.weight' has no scale tensor 'h.0.mlp.c_fc.weight.q8_scale'" "$dir/err" \
    || { cat "$dir/err"; fail "inspect of a malformed q8 file exited $rc"; }
[ "$rc2" = 1 ] && grep -q "no scale tensor" "$dir/err2" || fail "convert of a malformed q8 file exited $rc2"
}

case_dtype_usage() {
need_a
set +e
"$gpt2d" convert "$dir/a.safetensors" "$dir/x.safetensors" --dtype f8 2>"$dir/err"; rc=$?
set -e
[ "$rc" = 2 ] && grep -q "f32, f16, bf16 or q8" "$dir/err" || fail "--dtype f8 exited $rc"
}

# gpt2d convert --layout panel64 (formats/include/wformat.h): in every dtype, the
# projections (and q8 scales) stored [N/64, K, 64], inspect names the layout,
# and back to hf gives the same bytes as the hf conversion.
case_panel64() {
need_numpy
need_q8_f32
"$gpt2d" convert --help > "$dir/help"
grep -q -- "--layout L .*panel64 is gpt2d's serving" "$dir/help" \
    || fail "convert --help does not document --layout"
"$gpt2d" inspect "$dir/a.safetensors" > "$dir/insp"
grep -q '^layout      hf ' "$dir/insp" || fail "inspect: layout hf"
"$gpt2d" convert "$dir/a.safetensors" "$dir/a_f32.safetensors" --dtype f32 2>/dev/null
for dt in f32 f16 bf16 q8; do
    "$gpt2d" convert "$dir/a.safetensors" "$dir/p_$dt.safetensors" --dtype "$dt" \
        --layout panel64 2>"$dir/msg"
    grep -q "f32 -> $dt, layout hf -> panel64" "$dir/msg" || fail "convert message: $(cat "$dir/msg")"
    "$gpt2d" inspect "$dir/p_$dt.safetensors" > "$dir/insp"
    grep -q "^format      $dt " "$dir/insp" && grep -q '^layout      panel64 ' "$dir/insp" \
        || fail "inspect of the panel64 $dt file"
    "$gpt2d" inspect --json "$dir/p_$dt.safetensors" > "$dir/insp.json"
    grep -q '^  "layout": "panel64",$' "$dir/insp.json" \
        || fail "inspect --json layout of the panel64 $dt file"
    "$gpt2d" convert "$dir/p_$dt.safetensors" "$dir/p_hf_$dt.safetensors" --layout hf 2>/dev/null
    cmp "$dir/a_$dt.safetensors" "$dir/p_hf_$dt.safetensors" \
        || fail "panel64 $dt -> hf differs from the hf conversion"
done
# Without --layout the layout is kept; any dtype from a panel file works.
"$gpt2d" convert "$dir/p_f32.safetensors" "$dir/p_bf16b.safetensors" --dtype bf16 2>/dev/null
cmp "$dir/p_bf16.safetensors" "$dir/p_bf16b.safetensors" || fail "panel64 f32 -> bf16"
"$gpt2d" convert "$dir/p_q8.safetensors" "$dir/p_q8_f32.safetensors" --dtype f32 --layout hf \
    2>/dev/null
cmp "$dir/q8_f32.safetensors" "$dir/p_q8_f32.safetensors" || fail "panel64 q8 -> hf f32"
"$gpt2d" convert "$dir/p_f32.safetensors" "$dir/p_q8b.safetensors" --dtype q8 2>/dev/null
cmp "$dir/p_q8.safetensors" "$dir/p_q8b.safetensors" || fail "panel64 f32 -> q8"
/usr/bin/python3 - "$dir/a.safetensors" "$dir/p_f32.safetensors" "$dir/a_q8.safetensors" \
    "$dir/p_q8.safetensors" <<'PY' || fail "panel64 element positions"
import json, struct, sys
import numpy as np
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    d = b[8 + n:]
    types = {"F32": "<f4", "I8": "i1"}
    return h.get("__metadata__", {}), {
        k: np.frombuffer(d[v["data_offsets"][0]:v["data_offsets"][1]],
                         dtype=types[v["dtype"]]).reshape(v["shape"])
        for k, v in h.items() if k != "__metadata__"}
proj = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
def check(hf, pa):
    (hm, h), (pm, p) = hf, pa
    assert pm.get("gpt2d.layout") == "panel64" and "gpt2d.layout" not in hm, (hm, pm)
    assert {k: v for k, v in pm.items() if k != "gpt2d.layout"} == hm, (hm, pm)
    assert sorted(h) == sorted(p)
    moved = 0
    for k, w in h.items():
        base = k[:-len(".q8_scale")] if k.endswith(".q8_scale") else k
        if not base.endswith(proj):
            assert np.array_equal(w, p[k]), k
            continue
        K, N = w.shape
        assert p[k].shape == (N // 64, K, 64), (k, p[k].shape)
        flat = p[k].reshape(-1)
        for kk, n in ((0, 0), (K - 1, N - 1), (K // 2, 65 % N), (1, N - 2)):
            assert flat[((n // 64) * K + kk) * 64 + n % 64] == w[kk, n], (k, kk, n)
        assert np.array_equal(p[k].transpose(1, 0, 2).reshape(K, N), w), k
        moved += 1
    return moved
assert check(load(sys.argv[1]), load(sys.argv[2])) == 8
assert check(load(sys.argv[3]), load(sys.argv[4])) == 16
PY
}

# A width that is not a multiple of 64 cannot be panelled; a bad --layout
# is a usage error.
case_panel_width() {
"$gpt2d" synth "$dir/w96.safetensors" --layers 1 --embd 96 --heads 2 --ctx 8 --vocab 50 2>/dev/null
set +e
"$gpt2d" convert "$dir/w96.safetensors" "$dir/x.safetensors" --layout panel64 2>"$dir/err"; rc=$?
"$gpt2d" convert "$dir/a.safetensors" "$dir/x.safetensors" --layout panel32 2>"$dir/err2"; rc2=$?
set -e
[ "$rc" = 1 ] && grep -q "h.0.attn.c_attn.weight: 288 columns are not a multiple of 64" "$dir/err" \
    || { cat "$dir/err"; fail "convert of a width-96 model to panel64 exited $rc"; }
[ ! -e "$dir/x.safetensors" ] || fail "a refused convert wrote its output"
[ "$rc2" = 2 ] && grep -q "\-\-layout must be hf, panel64 or pairs64, not 'panel32'" "$dir/err2" \
    || fail "--layout panel32 exited $rc2"
}

# gpt2d convert --layout pairs64 (formats/include/wformat.h): BF16 only,
# the projections stored [N/64, K/2, 64, 2] with the data at a multiple of
# 64 bytes, inspect names it, back to hf gives the bf16 hf file's bytes,
# and an F32 file (or a q8 one) is refused with the tensor named.
case_pairs64() {
need_numpy
need_dtypes
"$gpt2d" convert "$dir/a.safetensors" "$dir/r_bf16.safetensors" --dtype bf16 --layout pairs64 \
    2>"$dir/msg" || fail "convert to pairs64: $(cat "$dir/msg")"
grep -q "f32 -> bf16, layout hf -> pairs64" "$dir/msg" || fail "convert message: $(cat "$dir/msg")"
"$gpt2d" inspect "$dir/r_bf16.safetensors" > "$dir/insp"
grep -q '^layout      pairs64 ' "$dir/insp" && grep -q '^format      bf16 ' "$dir/insp" \
    || fail "inspect of the pairs64 file: $(cat "$dir/insp")"
"$gpt2d" convert "$dir/r_bf16.safetensors" "$dir/r_hf.safetensors" --layout hf 2>/dev/null
cmp "$dir/a_bf16.safetensors" "$dir/r_hf.safetensors" || fail "pairs64 -> hf differs from the bf16 hf file"
"$gpt2d" convert "$dir/r_bf16.safetensors" "$dir/r_p.safetensors" --layout panel64 2>/dev/null
"$gpt2d" convert "$dir/a_bf16.safetensors" "$dir/r_p2.safetensors" --layout panel64 2>/dev/null
cmp "$dir/r_p.safetensors" "$dir/r_p2.safetensors" || fail "pairs64 -> panel64 differs"
/usr/bin/python3 - "$dir/a_bf16.safetensors" "$dir/r_bf16.safetensors" <<'PY' || fail "pairs64 element positions"
import json, struct, sys
import numpy as np
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return 8 + n, h, b
s0, h, b = load(sys.argv[1])
s1, hp, bp = load(sys.argv[2])
assert s1 % 64 == 0, s1
name = "h.1.mlp.c_fc.weight"
K, N = h[name]["shape"]
o, e = h[name]["data_offsets"]
w = np.frombuffer(b[s0 + o:s0 + e], "<u2").reshape(K, N)
assert hp[name]["shape"] == [N // 64, K // 2, 64, 2], hp[name]
o, e = hp[name]["data_offsets"]
p = np.frombuffer(bp[s1 + o:s1 + e], "<u2").reshape(N // 64, K // 2, 64, 2)
for k, n in ((0, 0), (1, 0), (K - 1, N - 1), (2, 65), (K - 2, 63)):
    assert p[n // 64, k // 2, n % 64, k % 2] == w[k, n], (k, n)
PY
set +e
"$gpt2d" convert "$dir/a.safetensors" "$dir/y.safetensors" --layout pairs64 2>"$dir/err"; rc=$?
"$gpt2d" convert "$dir/a.safetensors" "$dir/y.safetensors" --dtype q8 --layout pairs64 2>"$dir/err2"; rc2=$?
set -e
[ "$rc" = 1 ] && grep -q "F32 2-D; the pairs64 layout stores BF16 projection matrices only" "$dir/err" \
    || fail "f32 to pairs64 exited $rc: $(cat "$dir/err")"
[ "$rc2" = 1 ] && grep -q "the pairs64 layout stores BF16 projection matrices only" "$dir/err2" \
    || fail "q8 to pairs64 exited $rc2: $(cat "$dir/err2")"
[ ! -e "$dir/y.safetensors" ] || fail "a refused convert wrote its output"
}

case_bench_format() {
need_bench
mkdir -p "$dir/bench16"
"$gpt2d" convert "$dir/bench/model.safetensors" "$dir/bench16/model.safetensors" --dtype bf16 2>/dev/null
"$gpt2d" bench --model "$dir/bench16" --tokens 4 --sequences 1 > "$dir/bench16.json"
mkdir -p "$dir/bench8"
"$gpt2d" convert "$dir/bench/model.safetensors" "$dir/bench8/model.safetensors" --dtype q8 2>/dev/null
"$gpt2d" bench --model "$dir/bench8" --tokens 4 --sequences 1 > "$dir/bench8.json"
python3 - "$dir/bench.json" "$dir/bench16.json" "$dir/bench8.json" <<'PY' || fail "gpt2d bench format"
import json, sys
f32, bf16, q8 = (json.load(open(p)) for p in sys.argv[1:4])
# The work counted is the weight matmuls' (tools/bench.c): a prompt token
# goes through the projections only (params less wte and wpe), a generated
# one through the LM head (vocab x width) too. The bounding peaks are those
# of the kernel path each file runs on: the F32 FMA's for widening kernels,
# VDPBF16PS's for BF16 on avx512-bf16; q8 on avx512-vnni prefills on
# VPDPBUSD and decodes on it and the FMA (the LM head): the rate at which
# both parts would take their least time. Each run measures its own peaks.
def bounds(b):
    pk, k, md = b["machine"]["peaks"], b["model"]["kernels"], b["model"]
    lm = md["vocab"] * md["width"]
    proj = md["params"] - lm - md["context"] * md["width"]  # less wte and wpe
    assert b["flop_per_token"] == {"prefill": 2 * proj, "decode": 2 * (proj + lm)}, b
    if k == "avx512-bf16":
        return pk["bf16_dot_gflop_s"], pk["bf16_dot_gflop_s"]
    if k == "avx512-vnni":
        assert pk["int8_dot_gop_s"] > 0, b
        return pk["int8_dot_gop_s"], (proj + lm) / (proj / pk["int8_dot_gop_s"] + lm / pk["f32_fma_gflop_s"])
    return pk["f32_fma_gflop_s"], pk["f32_fma_gflop_s"]
close = lambda got, want: abs(got - want) <= 0.2 + 1e-3 * want
for b in (f32, bf16, q8):
    pk, (pre_peak, dec_peak) = b["machine"]["peaks"], bounds(b)
    assert close(pk["bounding_prefill_gflop_s"], pre_peak) and close(pk["bounding_decode_gflop_s"], dec_peak), \
        (pre_peak, dec_peak, b["model"], b["machine"])
    # Each fraction is of its peak (printed figures are rounded, the peaks
    # to 0.1, so within 2 %).
    for tps, fr, flop, peak in [(b["prefill_512"]["tokens_per_s"], b["prefill_512"]["fraction_of_compute_peak"],
                                 b["flop_per_token"]["prefill"], pre_peak)] + \
            [(d["tokens_per_s"], d["fraction_of_compute_peak"], b["flop_per_token"]["decode"], dec_peak)
             for d in b["decode"]]:
        want = tps * flop / 1e9 / peak if peak > 0 else 0
        assert abs(fr - want) <= 2e-3 + 0.02 * want, (fr, want, b)
assert q8["model"]["format"] == "q8", q8["model"]
assert f32["model"]["format"] == "f32" and bf16["model"]["format"] == "bf16", (f32, bf16)
assert bf16["model"]["weight_bytes"] * 2 == f32["model"]["weight_bytes"], (f32, bf16)
# The pair copy (engine/op_matmul_bf16.c): none for F32; for BF16 at the
# avx512-bf16 level, panels of 64 columns of k-pairs of 4 bytes, of the
# four projections of each layer and of wte read as (C, V).
assert f32["model"]["pair_copy_bytes"] == 0, f32
pairs = lambda K, N: -(-N // 64) * -(-K // 2) * 64 * 4
L, C, V = 2, 64, 300
want = L * (pairs(C, 3 * C) + pairs(C, C) + pairs(C, 4 * C) + pairs(4 * C, C)) + pairs(C, V)
got = bf16["model"]["pair_copy_bytes"]
assert got == (want if bf16["model"]["kernels"] == "avx512-bf16" else 0), (got, want, bf16["model"])
# The panel copy (engine/op_w_panels.c): an hf F32 file's projections at
# the AVX-512 level, 4 bytes each; BF16 has its pair copy instead.
panel = L * 12 * C * C * 4
assert f32["model"]["panel_copy_bytes"] == (panel if f32["model"]["kernels"] == "avx512" else 0), f32
assert bf16["model"]["panel_copy_bytes"] == 0, bf16
PY
}
# PEFT LoRA adapters: inspect names a shipped adapter's rank, scaling,
# targets and layers (text and --json, the folder or its safetensors
# file); a malformed one is refused in one line; `lora merge` writes the
# same F32 hf file twice, from the BF16 panel64 base and from its q8 copy
# (dequantized), refuses a base of another shape and words its usage errors.
case_lora() {
models=$here/../models
"$gpt2d" inspect "$models/gpt2d-tiny-pirate" > "$dir/lora.txt" || fail "inspect adapter"
grep -q '^rank        8$' "$dir/lora.txt" || fail "inspect: rank"
grep -q '^scaling     2 (lora_alpha 16 / r)$' "$dir/lora.txt" || fail "inspect: scaling"
grep -q '^targets     attn.c_attn attn.c_proj mlp.c_fc mlp.c_proj$' "$dir/lora.txt" || fail "inspect: targets"
grep -q '^layers      0-5 (of 6; width 128)$' "$dir/lora.txt" || fail "inspect: layers"
"$gpt2d" inspect --json "$models/gpt2d-tiny-formal/adapter_model.safetensors" > "$dir/lora.json" \
    || fail "inspect --json adapter file"
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert (j["kind"], j["rank"], j["scaling"], j["dtype"], j["layers"]) == ("lora", 8, 2.0, "F32", [0, 1, 2, 3, 4, 5]), j' \
    "$dir/lora.json" || fail "inspect --json: fields"
mkdir -p "$dir/dora"
cp "$models/gpt2d-tiny-pirate/adapter_model.safetensors" "$dir/dora/"
sed 's/"use_dora": false/"use_dora": true/' "$models/gpt2d-tiny-pirate/adapter_config.json" > "$dir/dora/adapter_config.json"
rc=0
"$gpt2d" inspect "$dir/dora" > /dev/null 2> "$dir/err" || rc=$?
[ "$rc" = 1 ] && [ "$(wc -l < "$dir/err")" = 1 ] && grep -q 'use_dora: DoRA' "$dir/err" \
    || { cat "$dir/err"; fail "a DoRA adapter is not refused in one line (rc $rc)"; }
for args in "lora" "lora frob" "lora merge a b" "lora merge --bogus a b c"; do
    rc=0
    "$gpt2d" $args > /dev/null 2>&1 || rc=$?
    [ "$rc" = 2 ] || fail "gpt2d $args: exit $rc, not 2"
done
"$gpt2d" lora merge "$models/gpt2d-tiny" "$models/gpt2d-tiny-pirate" "$dir/merged1.safetensors" 2> /dev/null \
    || fail "lora merge"
"$gpt2d" convert "$models/gpt2d-tiny/model.safetensors" "$dir/tiny_q8.safetensors" --dtype q8 2> /dev/null
"$gpt2d" lora merge "$dir/tiny_q8.safetensors" "$models/gpt2d-tiny-pirate" "$dir/merged_q8.safetensors" \
    2> /dev/null || fail "lora merge of a q8 base"
"$gpt2d" lora merge "$models/gpt2d-tiny/model.safetensors" "$models/gpt2d-tiny-pirate" \
    "$dir/merged2.safetensors" 2> /dev/null || fail "lora merge (file)"
cmp -s "$dir/merged1.safetensors" "$dir/merged2.safetensors" || fail "two merges differ"
"$gpt2d" inspect "$dir/merged_q8.safetensors" > "$dir/insp"
grep -q '^format      f32 ' "$dir/insp" || fail "merged q8 base is not f32"
need_a
rc=0
"$gpt2d" lora merge "$dir/a.safetensors" "$models/gpt2d-tiny-pirate" "$dir/lora_refused.safetensors" 2> "$dir/err" || rc=$?
[ "$rc" = 1 ] && grep -q "layer 2, but the base has 2 layers" "$dir/err" \
    || { cat "$dir/err"; fail "a base of another shape is not refused (rc $rc)"; }
[ ! -e "$dir/lora_refused.safetensors" ] || fail "a refused merge wrote its output"
}
CASES=(usage inspect_small synth invalid_file tokenize bench convert_dtype q8_values q8_malformed
       dtype_usage panel64 panel_width pairs64 bench_format lora)
run_cases "$@"
