// tests/differential/refusal_fetch.mjs URL TRIES BYTES [HEADER:VALUE...]:
// POSTs a BYTES-byte JSON body to URL TRIES times through Node's own
// fetch (undici, no package), one connection each, and prints one JSON
// line per try: {"try": i, "status": N, "body": "...", "error": "..."}.
// test_hostile.py's refusal_readable_* cases read them: a refusal given
// before the body is read (413, 401, 429, 503) must reach the client as
// its status and JSON, not as `write EPIPE` or a reset while the body is
// still being sent (issue 34). Exit 0 whatever the answers; 2 on usage.
const [url, triesArg, bytesArg, ...headerArgs] = process.argv.slice(2);
if (!url || !triesArg || !bytesArg) {
    console.error('usage: refusal_fetch.mjs URL TRIES BYTES [HEADER:VALUE...]');
    process.exit(2);
}
const tries = Number(triesArg), bytes = Number(bytesArg);
const headers = { 'content-type': 'application/json', connection: 'close' };
for (const h of headerArgs) {
    const i = h.indexOf(':');
    headers[h.slice(0, i).trim()] = h.slice(i + 1).trim();
}
// A JSON string of the size asked for: {"model":"gpt2","prompt":"xxx..."}.
const head = '{"model":"gpt2","max_tokens":1,"prompt":"', tail = '"}';
const body = Buffer.alloc(Math.max(bytes, head.length + tail.length), 'x');
body.write(head, 0);
body.write(tail, body.length - tail.length);

for (let i = 0; i < tries; i++) {
    const rec = { try: i };
    try {
        const res = await fetch(url, { method: 'POST', headers, body });
        rec.status = res.status;
        rec.body = await res.text();
    } catch (e) {
        const c = e.cause || {};
        rec.error = `${e.message}${c.code ? ' (' + c.code + ': ' + c.message + ')' : ''}`;
    }
    console.log(JSON.stringify(rec));
}
