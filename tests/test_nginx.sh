#!/usr/bin/env bash
# tests/test_nginx.sh GPT2D [CASE...]: deploy/nginx/gpt2d.conf, for real:
# nginx in front of two gpt2d replicas on loopback. Streaming and
# non-streaming completions (curl and the OpenAI Node client) through the
# proxy, traffic reaching both replicas, then one replica killed (SIGKILL)
# mid-test while requests keep succeeding on the other; the same over
# HTTPS (nginx terminating TLS with a self-signed certificate this test
# makes with openssl, trusted through --cacert and NODE_EXTRA_CA_CERTS).
# Each case is a
# function case_NAME; name cases to run only those, `--list` lists them
# (tests/lib/cases.sh). Without nginx (or the openai npm package) it skips
# with the reason; with GPT2D_REQUIRE_ALL=1 (scripts/test.sh) it fails.
# The case `documented` is docs/operations.md's "Two replicas behind
# nginx" with its own ports and files: replicas as `systemctl enable --now
# gpt2d@8081 gpt2d@8082` starts them, nginx on 8080 with the shipped site.
set -euo pipefail
gpt2d=$(realpath "$1")
shift
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d /tmp/gpt2d-nginx-XXXXXX)
chmod 755 "$dir"
. "$here/lib/cases.sh"
. "$here/lib/server.sh"
cleanup() {
    [ -f "$dir/nginx.pid" ] && kill "$(cat "$dir/nginx.pid")" 2>/dev/null
    [ -f "$dir/doc/nginx.pid" ] && kill "$(cat "$dir/doc/nginx.pid")" 2>/dev/null
    srv_stop_all
    rm -rf "$dir"
}
trap cleanup EXIT
[ "${1:-}" = --list ] || command -v nginx >/dev/null || skip "nginx is not installed (scripts/setup.sh --test installs nginx-light)"
[ "${1:-}" = --list ] || command -v openssl >/dev/null || skip "openssl is not installed (it makes the HTTPS server's certificate)"

srv_model "$dir/model" tiny

# The proxy every case uses: replicas a and b, nginx in front on $port.
fixture_proxy() {
srv_start a "$dir/model" || return 1
pid_a=$last_pid port_a=$port
srv_start b "$dir/model" || return 1
pid_b=$last_pid port_b=$port
port=$(python3 "$srv_lib/gpt2d_server.py" free-port)
tls_port=$(python3 "$srv_lib/gpt2d_server.py" free-port)
# The HTTPS server's certificate: self-signed for localhost and 127.0.0.1.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj "/CN=gpt2d-nginx-test" -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
    -keyout "$dir/tls.key" -out "$dir/tls.crt" 2> "$dir/openssl.log" ||
    { echo "FAIL: openssl: $(cat "$dir/openssl.log")" >&2; return 1; }

# The deployed file with this test's ports and certificate; everything
# else as shipped.
sed -e "s|server 127.0.0.1:8081 |server 127.0.0.1:$port_a |" \
    -e "s|server 127.0.0.1:8082 |server 127.0.0.1:$port_b |" \
    -e "s|listen 8080;|listen 127.0.0.1:$port;|" \
    -e "s|listen 8443 ssl;|listen 127.0.0.1:$tls_port ssl;|" \
    -e "s|/etc/nginx/tls/gpt2d.crt;|$dir/tls.crt;|" \
    -e "s|/etc/nginx/tls/gpt2d.key;|$dir/tls.key;|" "$here/../deploy/nginx/gpt2d.conf" > "$dir/gpt2d.conf"
grep -q "127.0.0.1:$port_a " "$dir/gpt2d.conf" && grep -q "127.0.0.1:$port_b " "$dir/gpt2d.conf" &&
    grep -q "listen 127.0.0.1:$port;" "$dir/gpt2d.conf" && grep -q "listen 127.0.0.1:$tls_port ssl;" "$dir/gpt2d.conf" &&
    grep -q "ssl_certificate $dir/tls.crt;" "$dir/gpt2d.conf" && grep -q "ssl_certificate_key $dir/tls.key;" "$dir/gpt2d.conf" ||
    { echo "FAIL: could not set the ports and the certificate" >&2; return 1; }
user=
[ "$(id -u)" = 0 ] && user="user root;"
cat > "$dir/nginx.conf" <<CONF
$user
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/nginx-error.log warn;
events { worker_connections 1024; }
http {
    access_log $dir/nginx-access.log;
    client_body_temp_path $dir/body;
    proxy_temp_path $dir/proxy;
    fastcgi_temp_path $dir/fastcgi;
    uwsgi_temp_path $dir/uwsgi;
    scgi_temp_path $dir/scgi;
    include $dir/gpt2d.conf;
}
CONF
nginx -t -p "$dir" -c "$dir/nginx.conf" > "$dir/nginx-t.log" 2>&1 || { echo "FAIL: nginx -t: $(cat "$dir/nginx-t.log")" >&2; return 1; }
nginx -p "$dir" -c "$dir/nginx.conf" || return 1
for _ in $(seq 50); do [ -f "$dir/nginx.pid" ] && break; sleep 0.1; done
base="http://127.0.0.1:$port"
tls_base="https://127.0.0.1:$tls_port"
for _ in $(seq 50); do curl -s -o /dev/null "$base/health" && break; sleep 0.1; done
}

req='{"model":"gpt2","prompt":"Hello, my name is","max_tokens":8,"temperature":0,"ignore_eos":true}'
sreq='{"model":"gpt2","prompt":"Hello, my name is","max_tokens":8,"temperature":0,"ignore_eos":true,"stream":true}'
complete() { curl -s -m 30 -w '\n%{http_code}' "$base/v1/completions" -H 'Content-Type: application/json' -d "$req"; }
check_json() { # the output of complete
    python3 -c '
import json, sys
body, code = sys.stdin.read().rsplit("\n", 1)
assert code == "200", code + " " + body
d = json.loads(body)
assert d["usage"]["completion_tokens"] == 8 and d["choices"][0]["finish_reason"] == "length", d
'
}
check_stream() { # an SSE body on stdin: 8 tokens of chunks, one finish, [DONE] last
    python3 -c '
import json, sys
raw = sys.stdin.read()
events = [e for e in raw.split("\n\n") if e.strip() and not e.startswith(":")]
assert events[-1] == "data: [DONE]", raw[-200:]
chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
assert all(c["object"] == "text_completion" for c in chunks), chunks
assert sum(1 for c in chunks if c["choices"][0]["finish_reason"] == "length") == 1, chunks
'
}

# 1. Through the proxy: JSON, SSE (arriving as a stream, not buffered), the
#    OpenAI Node client.
case_proxy() {
complete | check_json || fail "a completion through nginx"
curl -s -N -m 30 -D "$dir/headers" "$base/v1/completions" -H 'Content-Type: application/json' -d "$sreq" |
    check_stream || fail "a stream through nginx"
grep -qi '^content-type: text/event-stream' "$dir/headers" || fail "stream content type: $(cat "$dir/headers")"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$base/metrics")" = 404 ] || fail "/metrics is exposed through the proxy"
}

case_openai_client() {
need_node_module openai
node "$here/differential/openai_client.mjs" "$base/v1" > "$dir/openai.log" 2>&1 ||
    fail "the OpenAI Node client through nginx: $(cat "$dir/openai.log")"
}

# 1b. HTTPS: nginx terminates TLS in front of the plain replicas. curl
#    trusting the test's certificate (--cacert): a completion, a stream,
#    /metrics not exposed; without it curl refuses the certificate; plain
#    HTTP on the TLS port is nginx's 400; the OpenAI Node client with
#    NODE_EXTRA_CA_CERTS.
case_tls_proxy() {
curl -s -m 30 --cacert "$dir/tls.crt" -w '\n%{http_code}' "$tls_base/v1/completions" \
    -H 'Content-Type: application/json' -d "$req" | check_json || fail "a completion through nginx over HTTPS"
curl -s -N -m 30 --cacert "$dir/tls.crt" -D "$dir/tls-headers" "https://localhost:$tls_port/v1/completions" \
    -H 'Content-Type: application/json' -d "$sreq" | check_stream || fail "a stream through nginx over HTTPS"
grep -qi '^content-type: text/event-stream' "$dir/tls-headers" || fail "stream content type over HTTPS: $(cat "$dir/tls-headers")"
[ "$(curl -s -o /dev/null -w '%{http_code}' --cacert "$dir/tls.crt" "$tls_base/metrics")" = 404 ] ||
    fail "/metrics is exposed through the HTTPS proxy"
rc=0
curl -s -m 10 -o /dev/null "$tls_base/health" || rc=$?
[ "$rc" = 60 ] || fail "curl without --cacert: exit $rc, want 60 (certificate not trusted)"
[ "$(curl -s -m 10 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$tls_port/health")" = 400 ] ||
    fail "plain HTTP on the HTTPS port is not nginx's 400"
need_node_module openai
NODE_EXTRA_CA_CERTS="$dir/tls.crt" node "$here/differential/openai_client.mjs" "$tls_base/v1" > "$dir/openai-tls.log" 2>&1 ||
    fail "the OpenAI Node client through nginx over HTTPS: $(cat "$dir/openai-tls.log")"
}

# 2. Traffic reaches both replicas (least_conn with concurrent clients).
count() { curl -s "http://127.0.0.1:$1/metrics" | sed -n 's/^gpt2d_requests_total{route="\/v1\/completions",status="200"} //p'; }
case_both_replicas() {
cpids=()
for i in $(seq 24); do complete > "$dir/c$i.out" & cpids+=($!); done
wait "${cpids[@]}"
for i in $(seq 24); do check_json < "$dir/c$i.out" || fail "request $i of 24"; done
n_a=$(count "$port_a"); n_b=$(count "$port_b")
[ "${n_a:-0}" -gt 0 ] && [ "${n_b:-0}" -gt 0 ] || fail "traffic did not reach both replicas: a=$n_a b=$n_b"
echo "nginx: both replicas served (a=$n_a, b=$n_b completions)"
}

# 3. Kill replica a mid-test: 4 clients keep sending, a dies with SIGKILL
#    while they do, and every request still succeeds (on b). These are JSON
#    completions: one in flight on a when it dies has sent nothing back yet,
#    so nginx sends it to b (proxy_next_upstream error ... non_idempotent).
#    A stream cut after its first bytes cannot be replayed by any proxy; the
#    streams come after the kill.
case_failover() {
n_a=$(count "$port_a"); n_b=$(count "$port_b")
n_a=${n_a:-0} n_b=${n_b:-0} # a fresh replica has no such series yet (this case alone)
client() { # id: 12 requests in a row
    for j in $(seq 12); do
        complete | check_json || { echo "client $1 request $j failed" > "$dir/client$1.err"; return; }
    done
    : > "$dir/client$1.ok"
}
cpids=()
for c in 1 2 3 4; do client "$c" & cpids+=($!); done
# Kill a once it has served some of these requests, mid-stream for some.
for _ in $(seq 100); do [ "$(count "$port_a")" -gt "$((n_a + 2))" ] && break; sleep 0.05; done
kill -9 "$pid_a"
wait "${cpids[@]}"
ls "$dir"/client*.err > /dev/null 2>&1 && fail "with a replica killed: $(cat "$dir"/client*.err)"
[ "$(ls "$dir"/client*.ok | wc -l)" = 4 ] || fail "clients did not finish"
kill -0 "$pid_a" 2>/dev/null && fail "replica a is still alive"
after_b=$(count "$port_b")
[ "$after_b" -gt "$n_b" ] || fail "b served nothing after a died"
# And afterwards, everything goes to b, streams included.
for i in 1 2 3 4; do
    complete | check_json || fail "a completion after the kill"
    curl -s -N -m 30 "$base/v1/completions" -H 'Content-Type: application/json' -d "$sreq" |
        check_stream || fail "a stream after the kill"
done
echo "nginx: replica a killed mid-test; 48 requests all succeeded (b served $((after_b - n_b)))"
}

# 4. 256 clients at once through the proxy (issue 24, finding 1): nginx
#    opens as many connections to the replicas, all from one address
#    (loopback, exempt from max_connections_per_ip, as a trusted proxy
#    would be); every one is answered 200, none reset. Each client holds
#    its connection open until all 256 are connected, then sends.
case_many_clients() {
python3 - "$port" <<'PY' || fail "256 concurrent clients through nginx"
import json, socket, sys, threading
port, n = int(sys.argv[1]), 256
body = json.dumps({"model": "gpt2", "prompt": "Hello", "max_tokens": 2, "temperature": 0}).encode()
req = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
       b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
barrier = threading.Barrier(n)
errors = []
def client(i):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        barrier.wait(60)
        s.sendall(req)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        s.close()
        if not data.startswith(b"HTTP/1.1 200"):
            errors.append("client %d: %r" % (i, data[:120]))
    except Exception as e:
        errors.append("client %d: %r" % (i, e))
threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("nginx: %d concurrent clients, %d errors" % (n, len(errors)))
if errors:
    print("\n".join(errors[:5]), file=sys.stderr)
    sys.exit(1)
PY
}

# 5. The documented deployment, on the documented ports, from the shipped
#    files (docs/operations.md, "Two replicas behind nginx"): the replicas
#    gpt2d@8081 and gpt2d@8082 run as systemd runs them (deploy/gpt2d@.service's
#    ExecStart, %i the port) with the gpt2d.conf `meson install` installs
#    (its model this test's), and nginx with deploy/nginx/gpt2d.conf as
#    shipped (8080, and 8443 with this test's certificate in place of
#    /etc/nginx/tls/: the one change). A completion and a stream on 8080,
#    HTTPS on 8443, and both replicas serve.
case_documented() {
local p build
build=$(dirname "$(dirname "$gpt2d")")
[ -f "$build/deploy/gpt2d.conf" ] || fail "no $build/deploy/gpt2d.conf (the installed configuration, built by meson)"
for p in 8080 8081 8082 8443; do
    if (exec 3<> "/dev/tcp/127.0.0.1/$p") 2> /dev/null; then
        skip "port $p is taken on this machine: this case needs the documented ports 8080-8082 and 8443"
    fi
done
mkdir -p "$dir/doc"
sed -e "s|^model = .*|model = $dir/model|" -e 's|^fallback_model = .*|fallback_model =|' \
    "$build/deploy/gpt2d.conf" > "$dir/doc/gpt2d.conf"
echo "kv_cache_mb = 64" >> "$dir/doc/gpt2d.conf"
local exec_start cmd
exec_start=$(sed -n 's/^ExecStart=//p' "$here/../deploy/gpt2d@.service")
for p in 8081 8082; do
    cmd=${exec_start//%i/$p}
    cmd=${cmd/#\/usr\/local\/bin\/gpt2d /$gpt2d }
    cmd=${cmd/ \/etc\/gpt2d\/gpt2d.conf / $dir/doc/gpt2d.conf }
    [ "$cmd" = "$gpt2d serve --config $dir/doc/gpt2d.conf --port $p" ] || fail "gpt2d@$p's command line: $cmd"
    $cmd > "$dir/doc/replica-$p.log" 2>&1 &
    srv_pids+=($!)
done
for p in 8081 8082; do
    for _ in $(seq 300); do curl -s -o /dev/null "http://127.0.0.1:$p/health" && break; sleep 0.1; done
    curl -s -o /dev/null "http://127.0.0.1:$p/health" || fail "gpt2d@$p did not start: $(tail -3 "$dir/doc/replica-$p.log")"
done
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj "/CN=gpt2d-nginx-test" -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
    -keyout "$dir/doc/tls.key" -out "$dir/doc/tls.crt" 2> "$dir/doc/openssl.log" || fail "openssl: $(cat "$dir/doc/openssl.log")"
sed -e "s|/etc/nginx/tls/gpt2d.crt;|$dir/doc/tls.crt;|" -e "s|/etc/nginx/tls/gpt2d.key;|$dir/doc/tls.key;|" \
    "$here/../deploy/nginx/gpt2d.conf" > "$dir/doc/site.conf"
# Only the certificate's two lines differ from the shipped site.
[ "$(diff "$here/../deploy/nginx/gpt2d.conf" "$dir/doc/site.conf" | grep -c '^>')" = 2 ] ||
    fail "the site differs from deploy/nginx/gpt2d.conf in more than the certificate's paths"
local user=
[ "$(id -u)" = 0 ] && user="user root;"
cat > "$dir/doc/nginx.conf" <<CONF
$user
worker_processes 1;
pid $dir/doc/nginx.pid;
error_log $dir/doc/nginx-error.log warn;
events { worker_connections 1024; }
http {
    access_log $dir/doc/nginx-access.log;
    client_body_temp_path $dir/doc/body;
    proxy_temp_path $dir/doc/proxy;
    fastcgi_temp_path $dir/doc/fastcgi;
    uwsgi_temp_path $dir/doc/uwsgi;
    scgi_temp_path $dir/doc/scgi;
    include $dir/doc/site.conf;
}
CONF
nginx -t -p "$dir/doc" -c "$dir/doc/nginx.conf" > "$dir/doc/nginx-t.log" 2>&1 || fail "nginx -t: $(cat "$dir/doc/nginx-t.log")"
nginx -p "$dir/doc" -c "$dir/doc/nginx.conf" || fail "nginx did not start"
for _ in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:8080/health && break; sleep 0.1; done
base=http://127.0.0.1:8080
for _ in 1 2 3 4; do complete | check_json || fail "a completion on 8080"; done
curl -s -N -m 30 "$base/v1/completions" -H 'Content-Type: application/json' -d "$sreq" | check_stream ||
    fail "a stream on 8080"
curl -s -m 30 --cacert "$dir/doc/tls.crt" -w '\n%{http_code}' https://127.0.0.1:8443/v1/completions \
    -H 'Content-Type: application/json' -d "$req" | check_json || fail "a completion on 8443 (HTTPS)"
# least_conn with concurrent clients reaches both replicas.
local cpids=() i
for i in $(seq 12); do complete > "$dir/doc/c$i.out" & cpids+=($!); done
wait "${cpids[@]}"
for i in $(seq 12); do check_json < "$dir/doc/c$i.out" || fail "request $i of 12 on 8080"; done
n_a=$(count 8081); n_b=$(count 8082)
[ "${n_a:-0}" -gt 0 ] && [ "${n_b:-0}" -gt 0 ] || fail "traffic on 8080 did not reach both replicas: 8081=$n_a 8082=$n_b"
kill "$(cat "$dir/doc/nginx.pid")"
for _ in $(seq 50); do [ -f "$dir/doc/nginx.pid" ] || break; sleep 0.1; done
echo "nginx: the documented setup served on 8080 and 8443 (gpt2d@8081 $n_a, gpt2d@8082 $n_b completions)"
}

CASES=(proxy:proxy openai_client:proxy tls_proxy:proxy both_replicas:proxy many_clients:proxy failover:proxy documented)
run_cases "$@"
