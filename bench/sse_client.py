"""bench/sse_client.py: what the load generators share (stdlib only): the
data events of a streamed completion as they arrive, and a percentile."""
import json


def events(resp):
    """Yields each `data: {...}` event of an HTTP response as a dict, as soon
    as its blank line arrives (comments and `data: [DONE]` are skipped)."""
    buf = b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            return
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if event.startswith(b"data: {"):
                yield json.loads(event[6:])


def pct(v, p):
    """The p-th percentile of v (nearest rank below), 0 when v is empty."""
    v = sorted(v)
    return v[min(len(v) - 1, int(p / 100 * len(v)))] if v else 0
