#!/usr/bin/env bash
# tests/test_download.sh: scripts/download.sh against a local stand-in for the
# Hugging Face hub (tests/hub_server.py): checksum match, mismatch, files
# kept, resume after a cut connection, checksums from the hub's metadata, and
# the built-in published checksums of gpt2's tokenizer files.
# tests/test_download.sh [CASE...] runs only those cases, `--list` lists them
# (tests/lib/cases.sh); every failing case is reported at the end.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dl=$here/../scripts/download.sh
dir=$(mktemp -d /tmp/gpt2d-download-XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
. "$here/lib/cases.sh" # fail shows the hub's log ($dir/hub.log)
sha() { sha256sum < "$1" | cut -d' ' -f1; }

hub=$dir/hub
mkdir -p "$hub/test/tiny" "$hub/openai-community/gpt2"
head -c 300000 /dev/urandom > "$hub/test/tiny/model.safetensors"
head -c 5000 /dev/urandom > "$hub/test/tiny/vocab.json"
head -c 3000 /dev/urandom > "$hub/test/tiny/merges.txt"
# gpt2 with the real tokenizer files (their published checksums are built
# into the script) and a model file that is not the published one.
cp "$here/../tokenizer/data/vocab.json" "$here/../tokenizer/data/merges.txt" "$hub/openai-community/gpt2/"
head -c 1000 /dev/urandom > "$hub/openai-community/gpt2/model.safetensors"
python3 "$here/hub_server.py" "$hub" "$dir/port" "$dir/hub.log" &
pid=$!
for _ in $(seq 100); do [ -f "$dir/port" ] && break; sleep 0.1; done
[ -f "$dir/port" ] || fail "hub did not start"
base=http://127.0.0.1:$(cat "$dir/port")
t=$hub/test/tiny
sums=(--sha256 "model.safetensors=$(sha "$t/model.safetensors")" --sha256 "vocab.json=$(sha "$t/vocab.json")"
      --sha256 "merges.txt=$(sha "$t/merges.txt")")

case_usage() {
"$dl" --help | grep -q '^usage: download.sh' || fail "--help"
set +e; "$dl" --bogus > /dev/null 2>&1; rc=$?; set -e
[ $rc = 2 ] || fail "an unknown option exits $rc, not 2"
}

# 1. A fresh download: every file verified and in place, no partial left.
case_fresh() {
"$dl" --model test/tiny --dir "$dir/m1" --base-url "$base" "${sums[@]}" > "$dir/out1" || fail "download 1"
for f in model.safetensors vocab.json merges.txt; do
    cmp -s "$t/$f" "$dir/m1/$f" || fail "$f differs"
done
[ ! -e "$dir/m1/.partial" ] || fail "partial directory left behind"
}

# 2. Again: files present and correct are kept, nothing is fetched.
case_kept() {
[ -f "$dir/m1/merges.txt" ] || "$dl" --model test/tiny --dir "$dir/m1" --base-url "$base" "${sums[@]}" > /dev/null # fresh's, alone
: > "$dir/hub.log"
"$dl" --model test/tiny --dir "$dir/m1" --base-url "$base" "${sums[@]}" > "$dir/out2" || fail "download 2"
[ "$(grep -c 'kept' "$dir/out2")" = 3 ] || fail "files were not kept: $(cat "$dir/out2")"
! grep -q resolve "$dir/hub.log" || fail "a kept file was fetched again"
}

# 3. A checksum mismatch: the script fails, the download is deleted and
#    nothing is moved into place.
case_mismatch() {
set +e
"$dl" --model test/tiny --dir "$dir/m3" --base-url "$base" "${sums[@]}" \
    --sha256 "vocab.json=$(printf '0%.0s' $(seq 64))" > "$dir/out3" 2>&1
rc=$?
set -e
[ $rc = 1 ] || fail "a mismatch exits $rc, not 1"
grep -q 'vocab.json: sha256 mismatch' "$dir/out3" || fail "no mismatch message: $(cat "$dir/out3")"
[ ! -e "$dir/m3/vocab.json" ] && [ ! -e "$dir/m3/.partial/vocab.json" ] || fail "the bad file was kept"
}

# 4. A cut connection: the next attempt resumes with a byte range.
case_resume() {
echo 120000 > "$t/model.safetensors.cut-after"
: > "$dir/hub.log"
"$dl" --model test/tiny --dir "$dir/m4" --base-url "$base" "${sums[@]}" > "$dir/out4" 2>&1 || fail "download 4: $(cat "$dir/out4")"
cmp -s "$t/model.safetensors" "$dir/m4/model.safetensors" || fail "the resumed file differs"
grep -q 'model.safetensors - 200-cut' "$dir/hub.log" || fail "the connection was not cut"
grep -q 'model.safetensors bytes=120000- 206' "$dir/hub.log" || fail "did not resume at 120000"
grep -q 'resuming at 120000 bytes' "$dir/out4" || fail "did not say it resumed"
rm "$t/model.safetensors.cut-after"
}

# 4b. A partial left by an interrupted run resumes in the next run.
case_resume_partial() {
mkdir -p "$dir/m4b/.partial"
head -c 50000 "$t/model.safetensors" > "$dir/m4b/.partial/model.safetensors"
: > "$dir/hub.log"
"$dl" --model test/tiny --dir "$dir/m4b" --base-url "$base" "${sums[@]}" > /dev/null 2>&1 || fail "download 4b"
cmp -s "$t/model.safetensors" "$dir/m4b/model.safetensors" || fail "4b: differs"
grep -q 'model.safetensors bytes=50000- 206' "$dir/hub.log" || fail "4b: did not resume the old partial"
}

# 4c. A corrupt partial as long as the file: the range is not satisfiable,
#     it is deleted and downloaded again.
case_corrupt_partial() {
mkdir -p "$dir/m4c/.partial"
head -c 300000 /dev/zero > "$dir/m4c/.partial/model.safetensors"
"$dl" --model test/tiny --dir "$dir/m4c" --base-url "$base" "${sums[@]}" > /dev/null 2>&1 || fail "download 4c"
cmp -s "$t/model.safetensors" "$dir/m4c/model.safetensors" || fail "4c: differs"
}

# 5. Checksums from the hub's LFS metadata when none is given for a file.
case_lfs_checksum() {
"$dl" --model test/tiny --dir "$dir/m5" --base-url "$base" \
    --sha256 "vocab.json=$(sha "$t/vocab.json")" --sha256 "merges.txt=$(sha "$t/merges.txt")" \
    > /dev/null 2>&1 || fail "download 5"
echo 1111111111111111111111111111111111111111111111111111111111111111 > "$t/model.safetensors.lfs-oid"
set +e
"$dl" --model test/tiny --dir "$dir/m5b" --base-url "$base" \
    --sha256 "vocab.json=$(sha "$t/vocab.json")" --sha256 "merges.txt=$(sha "$t/merges.txt")" > "$dir/out5" 2>&1
rc=$?
set -e
[ $rc = 1 ] && grep -q 'model.safetensors: sha256 mismatch (expected 1111' "$dir/out5" ||
    fail "the hub's checksum was not used: $(cat "$dir/out5")"
rm "$t/model.safetensors.lfs-oid"
}

# 6. gpt2: the published checksums built into the script. The real tokenizer
#    files pass (fetched first); the stand-in weights do not match the
#    published value.
case_published_checksums() {
set +e
"$dl" --model gpt2 --dir "$dir/m6" --base-url "$base" > "$dir/out6" 2>&1
rc=$?
set -e
[ $rc = 1 ] || fail "gpt2 with wrong weights exits $rc"
grep -q 'model.safetensors: sha256 mismatch (expected 248dfc3911869ec493c76e65bf2fcf7f615828b0254c12b473182f0f81d3a707' "$dir/out6" ||
    fail "gpt2: not checked against the published value: $(cat "$dir/out6")"
[ ! -e "$dir/m6/model.safetensors" ] || fail "gpt2: wrong weights moved into place"
"$dl" --model gpt2 --dir "$dir/m6" --base-url "$base" \
    --sha256 "model.safetensors=$(sha "$hub/openai-community/gpt2/model.safetensors")" > "$dir/out6b" 2>&1 ||
    fail "gpt2 tokenizer files: $(cat "$dir/out6b")"
grep -q 'vocab.json verified (sha256 196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783)' "$dir/out6" ||
    fail "vocab.json not checked against the published value"
grep -q 'merges.txt verified (sha256 1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5)' "$dir/out6" ||
    fail "merges.txt not checked against the published value"
}

# 7. An unreachable hub fails quickly and clearly.
case_unreachable() {
set +e
"$dl" --model gpt2 --dir "$dir/m7" --base-url http://127.0.0.1:9 --retries 1 > "$dir/out7" 2>&1
rc=$?
set -e
[ $rc = 1 ] && grep -q 'attempt 1 of 1 failed: cannot connect to 127.0.0.1:9' "$dir/out7" &&
    ! grep -q '^curl' "$dir/out7" || fail "unreachable hub: $rc $(cat "$dir/out7")"
}

CASES=(usage fresh kept mismatch resume resume_partial corrupt_partial lfs_checksum published_checksums
       unreachable)
run_cases "$@"
