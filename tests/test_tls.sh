#!/usr/bin/env bash
# tests/test_tls.sh GPT2D [CASE...]: HTTPS served by gpt2d itself
# (tls_cert_file, tls_key_file), with self-signed certificates this test
# makes with openssl (no key is ever committed). curl with --cacert, the
# OpenAI Node client trusting the certificate through NODE_EXTRA_CA_CERTS,
# a rotation on SIGHUP seen by a new connection while one opened before
# keeps working, a bad certificate at reload (the old one keeps serving)
# and at start (refused, naming the file), the TLS versions served (1.2
# and 1.3; openssl s_client) and tls_priorities. Each case is a function
# case_NAME; name cases to run only those, `--list` lists them
# (tests/lib/cases.sh). Without openssl (or a build without GnuTLS) it
# skips with the reason; with GPT2D_REQUIRE_ALL=1 (scripts/test.sh) it
# fails.
set -euo pipefail
gpt2d=$(realpath "$1")
shift
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d /tmp/gpt2d-tls-XXXXXX)
. "$here/lib/cases.sh"
. "$here/lib/server.sh"
cleanup() {
    srv_stop_all
    rm -rf "$dir"
}
trap cleanup EXIT
if [ "${1:-}" != --list ]; then
    command -v openssl > /dev/null || skip "openssl is not installed (it makes the test's certificates)"
fi

# Skips the case when this gpt2d was built without GnuTLS (it says so at
# start when given a certificate, before anything else).
need_tls_build() {
    local out
    out=$("$gpt2d" serve --model "$dir" --port 0 --tls-cert-file /nonexistent --tls-key-file /nonexistent 2>&1 || true)
    case $out in
    *"built without GnuTLS"*) skip "this gpt2d was built without GnuTLS (meson -Dtls=enabled)" ;;
    esac
    return 0
}

# mkcert NAME: a self-signed certificate for localhost and 127.0.0.1 (its
# own CA, so --cacert NAME.crt trusts exactly it), in $dir.
mkcert() {
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
        -subj "/CN=gpt2d-test-$1" -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
        -keyout "$dir/$1.key" -out "$dir/$1.crt" 2> "$dir/openssl-$1.log" ||
        { echo "FAIL: openssl: $(cat "$dir/openssl-$1.log")" >&2; return 1; }
}

# The CN a new TLS connection to $port is shown, checked against CA file $1
# (python's ssl: verification on, so a certificate not signed by $1 fails).
peer_cn() {
    python3 - "$port" "$1" <<'PY'
import socket, ssl, sys
ctx = ssl.create_default_context(cafile=sys.argv[2])
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10) as s:
    with ctx.wrap_socket(s, server_hostname="localhost") as t:
        print(dict(x[0] for x in t.getpeercert()["subject"])["commonName"])
PY
}

# The server every case but bad_start shares: HTTPS with live.crt/live.key
# (copies of one's, overwritten by rotate).
fixture_tls() {
    need_tls_build
    srv_model "$dir/model" tiny
    mkcert one && mkcert two || return 1
    cp "$dir/one.crt" "$dir/live.crt"
    cp "$dir/one.key" "$dir/live.key"
    srv_start tls "$dir/model" --kv-cache-mb 64 --tls-cert-file "$dir/live.crt" \
        --tls-key-file "$dir/live.key" || return 1
    pid=$last_pid
    base="https://127.0.0.1:$port"
}

req='{"model":"gpt2","prompt":"Hello, my name is","max_tokens":8,"temperature":0,"ignore_eos":true}'
sreq='{"model":"gpt2","prompt":"Hello, my name is","max_tokens":8,"temperature":0,"ignore_eos":true,"stream":true}'

# 1. curl over HTTPS with the certificate as its CA: a whole answer, a
#    stream, /version; the log and its curl line say https://; without
#    --cacert curl refuses the self-signed certificate (it is verified).
case_curl_cacert() {
grep -q "serving gpt2 .* on https://127.0.0.1:$port\$" "$dir/tls.log" || fail "the start-up log does not say https://"
grep -q "try: curl -s https://127.0.0.1:$port/v1/completions" "$dir/tls.log" || fail "the curl line does not say https://"
out=$(curl -s -m 30 --cacert "$dir/one.crt" -w '\n%{http_code}' "$base/v1/completions" \
    -H 'Content-Type: application/json' -d "$req")
curl -s -N -m 30 --cacert "$dir/one.crt" "https://localhost:$port/v1/completions" \
    -H 'Content-Type: application/json' -d "$sreq" > "$dir/stream.txt"
# The stream's text is the whole answer's (temperature 0), in chunks
# ending with one finish and [DONE].
python3 - "$out" "$dir/stream.txt" <<'PY' || fail "a completion and a stream over HTTPS: $out"
import json, sys
body, code = sys.argv[1].rsplit("\n", 1)
assert code == "200", code + " " + body
d = json.loads(body)
assert d["usage"]["completion_tokens"] == 8, d
raw = open(sys.argv[2]).read()
events = [e for e in raw.split("\n\n") if e.strip() and not e.startswith(":")]
assert events[-1] == "data: [DONE]", raw[-200:]
chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
assert sum(1 for c in chunks if c["choices"][0]["finish_reason"] == "length") == 1, chunks
text = "".join(c["choices"][0]["text"] for c in chunks)
assert text == d["choices"][0]["text"], (text, d["choices"][0]["text"])
PY
curl -s -m 10 --cacert "$dir/one.crt" "$base/version" | python3 -c '
import json, sys
v = json.load(sys.stdin)
assert v["tls"] == "gnutls" and v["scheme"] == "https", v' || fail "/version does not say https"
rc=0
curl -s -m 10 -o /dev/null "$base/health" || rc=$?
[ "$rc" = 60 ] || fail "curl without --cacert: exit $rc, want 60 (certificate not trusted)"
}

# 2. The OpenAI Node client over HTTPS, trusting the certificate through
#    NODE_EXTRA_CA_CERTS (completions, a stream, an error).
case_openai_client() {
need_node_module openai
NODE_EXTRA_CA_CERTS="$dir/one.crt" node "$here/differential/openai_client.mjs" "$base/v1" > "$dir/openai.log" 2>&1 ||
    fail "the OpenAI Node client over HTTPS: $(cat "$dir/openai.log")"
}

# 3. Rotation: new files under the same names, SIGHUP, and a new
#    connection gets the second certificate (verified against it alone),
#    while a keep-alive connection opened before the rotation still
#    answers (its session holds the first certificate, retired, not
#    freed).
case_rotate() {
[ "$(peer_cn "$dir/one.crt")" = gpt2d-test-one ] || fail "before the rotation: not certificate one"
python3 - "$port" "$dir/one.crt" "$pid" "$dir/two.crt" "$dir/two.key" "$dir/live.crt" "$dir/live.key" \
    "$dir/tls.log" <<'PY' || fail "rotation"
import http.client, os, shutil, signal, ssl, sys, time
port, ca1, pid, crt2, key2, live_crt, live_key, log = sys.argv[1:]
ctx = ssl.create_default_context(cafile=ca1)
c = http.client.HTTPSConnection("localhost", int(port), context=ctx, timeout=10)
def get():
    c.request("GET", "/health")
    r = c.getresponse()
    r.read()
    return r.status
assert get() == 200
before = open(log).read().count("HTTPS certificate loaded")
shutil.copy(key2, live_key + ".new")
shutil.copy(crt2, live_crt + ".new")
os.rename(live_key + ".new", live_key)
os.rename(live_crt + ".new", live_crt)
os.kill(int(pid), signal.SIGHUP)
deadline = time.monotonic() + 10
while open(log).read().count("HTTPS certificate loaded") == before:
    assert time.monotonic() < deadline, "no 'HTTPS certificate loaded' line after SIGHUP"
    time.sleep(0.05)
for _ in range(3):  # the connection from before, kept alive, still answers
    assert get() == 200
c.close()
PY
[ "$(peer_cn "$dir/two.crt")" = gpt2d-test-two ] || fail "after the rotation: a new connection did not get certificate two"
rc=0
curl -s -m 10 -o /dev/null --cacert "$dir/one.crt" "$base/health" || rc=$?
[ "$rc" = 60 ] || fail "certificate one still served after the rotation (curl exit $rc)"
[ "$(curl -s -m 10 -o /dev/null -w '%{http_code}' --cacert "$dir/two.crt" "$base/health")" = 200 ] ||
    fail "no 200 with certificate two"
echo "tls: rotated from one to two on SIGHUP; the connection from before kept answering"
}

# 4. A bad certificate at reload (not PEM; then a key that does not
#    match): the current certificate keeps serving, the log says why and
#    names the file, the server answers on.
case_bad_reload() {
cur=$(peer_cn "$dir/one.crt" 2> /dev/null || peer_cn "$dir/two.crt")
ca="$dir/one.crt"
[ "$cur" = gpt2d-test-two ] && ca="$dir/two.crt"
cp "$dir/live.crt" "$dir/good.crt"
cp "$dir/live.key" "$dir/good.key"
n0=$(grep -c "the HTTPS certificate is unchanged" "$dir/tls.log" || true)
echo "not a certificate" > "$dir/live.crt"
kill -HUP "$pid"
for _ in $(seq 100); do
    [ "$(grep -c "the HTTPS certificate is unchanged" "$dir/tls.log" || true)" -gt "$n0" ] && break
    sleep 0.05
done
grep "the HTTPS certificate is unchanged" "$dir/tls.log" | tail -1 | grep -q "tls_cert_file $dir/live.crt: not a PEM" ||
    fail "no log line naming the bad file: $(tail -3 "$dir/tls.log")"
[ "$(peer_cn "$ca")" = "$cur" ] || fail "the certificate changed after a bad reload"
cp "$dir/good.crt" "$dir/live.crt"
if [ "$cur" = gpt2d-test-one ]; then cp "$dir/two.key" "$dir/live.key"; else cp "$dir/one.key" "$dir/live.key"; fi
kill -HUP "$pid"
for _ in $(seq 100); do
    [ "$(grep -c "the HTTPS certificate is unchanged" "$dir/tls.log" || true)" -gt "$((n0 + 1))" ] && break
    sleep 0.05
done
grep "the HTTPS certificate is unchanged" "$dir/tls.log" | tail -1 | grep -q "does not go with tls_cert_file" ||
    fail "no log line for a key that does not match: $(tail -3 "$dir/tls.log")"
[ "$(curl -s -m 10 -o /dev/null -w '%{http_code}' --cacert "$ca" "$base/health")" = 200 ] ||
    fail "no 200 after the bad reloads"
kill -0 "$pid" || fail "the server died"
cp "$dir/good.key" "$dir/live.key"
}

# tls_get VERSION [PORT]: GET /health through openssl s_client offering TLS
# VERSION alone (tls1, tls1_1, tls1_2, tls1_3), its output into
# $dir/s_client-VERSION.out. OPENSSL_CONF=/dev/null and security level 0:
# this openssl's own defaults (level 1 or 2, or a distribution's
# MinProtocol) refuse TLS 1.0 and 1.1 before the server is asked, and the
# refusal tested is the server's.
tls_get() {
    printf 'GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n' |
        OPENSSL_CONF=/dev/null timeout 20 openssl s_client -connect "127.0.0.1:${2:-$port}" \
            -servername localhost "-$1" -cipher 'DEFAULT@SECLEVEL=0' -ign_eof \
            > "$dir/s_client-$1.out" 2>&1 || true
}
tls_served() { grep -q '^HTTP/1.1 200' "$dir/s_client-$1.out"; }
# No answer, and not for the client's own refusal (which openssl words "no
# protocols available"). libmicrohttpd closes a failed handshake without
# an alert of its own, so what the client says next varies: the case
# below shows with a second server that this client does speak 1.0 and
# 1.1, so that their refusal is the server's.
tls_refused() {
    ! tls_served "$1" && ! grep -q 'no protocols available' "$dir/s_client-$1.out"
}

# 5. TLS versions (issue 34): by default (tls_priorities) the server
#    refuses TLS 1.0 and 1.1 (RFC 8996 retires them), and TLS 1.2 and 1.3
#    answer /health. A second server given GnuTLS's NORMAL (libmicrohttpd's
#    own default, what gpt2d used to serve) answers 1.0 and 1.1 to the same
#    client: the refusals are the server's, not this openssl's.
case_versions() {
for v in tls1 tls1_1; do
    tls_get "$v"
    tls_served "$v" && fail "-$v: a handshake and /health (RFC 8996 retires it): $(grep -m1 'Protocol  :' "$dir/s_client-$v.out")"
    tls_refused "$v" || fail "-$v: the client refused it itself: $(tail -5 "$dir/s_client-$v.out")"
done
for v in tls1_2 tls1_3; do
    tls_get "$v"
    tls_served "$v" || fail "-$v: no /health: $(tail -5 "$dir/s_client-$v.out")"
done
srv_start old "$dir/model" --kv-cache-mb 64 --tls-cert-file "$dir/one.crt" --tls-key-file "$dir/one.key" \
    --tls-priorities NORMAL || fail "no server with tls_priorities NORMAL"
for v in tls1 tls1_1; do
    tls_get "$v" "$port"
    tls_served "$v" || fail "-$v against tls_priorities NORMAL: no /health, so this client cannot test it: $(tail -5 "$dir/s_client-$v.out")"
done
echo "tls: 1.0 and 1.1 refused, 1.2 and 1.3 served; 1.0 and 1.1 served under tls_priorities NORMAL"
}

# 6. tls_priorities (issue 34): an operator's string is what handshakes
#    get (TLS 1.3 alone: 1.2 refused); one GnuTLS refuses stops start-up
#    (status 2, naming the key, before the model loads) and a reload (the
#    running configuration stays, the server answers on).
case_priorities() {
need_tls_build
[ -f "$dir/one.crt" ] || mkcert one
[ -d "$dir/model" ] || srv_model "$dir/model" tiny
rc=0
"$gpt2d" serve --model "$dir/model" --port 0 --tls-cert-file "$dir/one.crt" --tls-key-file "$dir/one.key" \
    --tls-priorities 'NORMAL:+VERS-BOGUS' > "$dir/prio-start.log" 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "a bad tls_priorities: exit $rc, want 2: $(tail -2 "$dir/prio-start.log")"
tail -1 "$dir/prio-start.log" | grep -qF "tls_priorities 'NORMAL:+VERS-BOGUS'" ||
    fail "the refusal does not name the key and its value: $(tail -1 "$dir/prio-start.log")"
grep -q "loading" "$dir/prio-start.log" && fail "the model loaded before the bad tls_priorities was refused"
printf 'tls_priorities = NORMAL:-VERS-ALL:+VERS-TLS1.3\n' > "$dir/prio.conf"
srv_start prio "$dir/model" --kv-cache-mb 64 --config "$dir/prio.conf" --tls-cert-file "$dir/one.crt" \
    --tls-key-file "$dir/one.key" || fail "no server with tls_priorities TLS 1.3 alone"
p=$port
tls_get tls1_2 "$p"
tls_refused tls1_2 || fail "tls_priorities TLS 1.3 alone: -tls1_2 not refused: $(tail -5 "$dir/s_client-tls1_2.out")"
tls_get tls1_3 "$p"
tls_served tls1_3 || fail "tls_priorities TLS 1.3 alone: -tls1_3 not served: $(tail -5 "$dir/s_client-tls1_3.out")"
printf 'tls_priorities = NORMAL:+VERS-BOGUS\n' > "$dir/prio.conf"
kill -HUP "$last_pid"
for _ in $(seq 100); do
    grep -q "SIGHUP: reload refused" "$dir/prio.log" && break
    sleep 0.05
done
grep "SIGHUP: reload refused" "$dir/prio.log" | grep -qF "tls_priorities 'NORMAL:+VERS-BOGUS'" ||
    fail "a bad tls_priorities on SIGHUP: no refusal naming it: $(tail -3 "$dir/prio.log")"
tls_get tls1_3 "$p"
tls_served tls1_3 || fail "no /health after the refused reload"
kill -0 "$last_pid" || fail "the server died"
}

# 7. A bad certificate at start: exit status 2 before the model loads,
#    one line naming the file and what is wrong; each key without the
#    other is refused too.
case_bad_start() {
need_tls_build
[ -f "$dir/one.crt" ] || mkcert one
[ -f "$dir/two.crt" ] || mkcert two
[ -d "$dir/model" ] || srv_model "$dir/model" tiny
echo "junk" > "$dir/junk.pem"
check_refused() { # WANT ARGS...: exit 2, the last line contains WANT
    local want=$1 rc=0
    shift
    "$gpt2d" serve --model "$dir/model" --port 0 "$@" > "$dir/start.log" 2>&1 || rc=$?
    [ "$rc" = 2 ] || fail "serve $*: exit $rc, want 2: $(tail -2 "$dir/start.log")"
    tail -1 "$dir/start.log" | grep -qF "$want" || fail "serve $*: '$(tail -1 "$dir/start.log")' lacks '$want'"
    grep -q "loading" "$dir/start.log" && fail "serve $*: the model loaded before the refusal"
    return 0
}
check_refused "tls_cert_file $dir/missing.crt: cannot be read" --tls-cert-file "$dir/missing.crt" --tls-key-file "$dir/one.key"
check_refused "tls_cert_file $dir/junk.pem: not a PEM certificate" --tls-cert-file "$dir/junk.pem" --tls-key-file "$dir/one.key"
check_refused "tls_key_file $dir/junk.pem: not a PEM private key" --tls-cert-file "$dir/one.crt" --tls-key-file "$dir/junk.pem"
check_refused "tls_key_file $dir/two.key does not go with tls_cert_file $dir/one.crt" --tls-cert-file "$dir/one.crt" --tls-key-file "$dir/two.key"
check_refused "tls_cert_file is set without tls_key_file" --tls-cert-file "$dir/one.crt"
check_refused "tls_key_file is set without tls_cert_file" --tls-key-file "$dir/one.key"
}

CASES=(curl_cacert:tls openai_client:tls versions:tls rotate:tls bad_reload:tls bad_start priorities)
run_cases "$@"
