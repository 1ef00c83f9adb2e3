#!/usr/bin/env python3
"""Load test for `kvcache serve`: concurrent streaming clients over loopback.

Runs N clients (default 64), each sending streaming /v1/completions requests one after
another for a bounded time and at most a bounded number of requests, then checks /metrics:

  - no 5xx responses, and every 200 stream ended with `data: [DONE]`;
  - p50/p99 time to first token (measured by the client) and end-to-end latency;
  - after the run, no KV block is still referenced (none leaked) and nothing is running.

Prompts share a long preamble, as chat traffic with one system prompt does, so the prefix
cache is exercised; the hit rate is reported.

Usage: scripts/load_test.py [--port 8080] [--clients 64] [--seconds 60] [--api-key KEY]
Exits non-zero when a check fails. Python 3 standard library only; loopback addresses only.
"""

import argparse
import http.client
import ipaddress
import json
import random
import sys
import threading
import time

PREAMBLE = (
    "Once upon a time, in a small village by the sea, there lived a girl named Lily who "
    "loved to play in the park with her friends. Every morning she walked to the beach "
    "with her dog Max, and every evening her mother told her a story. "
)
ENDINGS = [
    "One day, she found a big red ball",
    "One day, Max ran after a bird",
    "One day, it started to rain",
    "One day, a boy named Tim came to play",
    "One day, Lily saw a little cat",
    "One day, the sun was very hot",
    "One day, her mother baked a cake",
    "One day, they went to the park",
]


def loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def percentile(values, q):
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    s = sorted(values)
    rank = max(1, min(len(s), int(-(-q * len(s) // 1))))
    return s[rank - 1]


class Totals:
    def __init__(self):
        self.lock = threading.Lock()
        self.statuses = {}
        self.ttft = []
        self.e2e = []
        self.tokens = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.incomplete = 0
        self.errors = []
        self.requests = 0

    def claim(self, limit):
        """Reserves one request of the budget; False once it is spent."""
        with self.lock:
            if self.requests >= limit:
                return False
            self.requests += 1
            return True


def headers(api_key):
    h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        h["Authorization"] = "Bearer " + api_key
    return h


def one_request(conn, args, rng, totals):
    body = json.dumps({
        "model": "load-test",
        "prompt": PREAMBLE + rng.choice(ENDINGS),
        "max_tokens": args.max_tokens,
        "temperature": 0.8,
        "seed": rng.randrange(1 << 30),
        "stream": True,
        "stream_options": {"include_usage": True},
    })
    start = time.monotonic()
    conn.request("POST", "/v1/completions", body=body, headers=headers(args.api_key))
    resp = conn.getresponse()
    status = resp.status
    first = None
    done = False
    usage = None
    if status == 200:
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            payload = line[6:]
            if payload == b"[DONE]":
                done = True
                continue
            event = json.loads(payload)
            if "error" in event:
                with totals.lock:
                    totals.errors.append(event["error"].get("message", "?"))
                continue
            if event.get("usage"):
                usage = event["usage"]
            if first is None and any(c.get("text") for c in event.get("choices", [])):
                first = time.monotonic()
    else:
        text = resp.read().decode(errors="replace")
        if status >= 500:
            with totals.lock:
                totals.errors.append("HTTP %d: %s" % (status, text[:200]))
    end = time.monotonic()
    with totals.lock:
        totals.statuses[status] = totals.statuses.get(status, 0) + 1
        if status == 200:
            if not done:
                totals.incomplete += 1
            if first is not None:
                totals.ttft.append(first - start)
            totals.e2e.append(end - start)
            if usage:
                totals.tokens += usage["completion_tokens"]
                totals.prompt_tokens += usage["prompt_tokens"]
                totals.cached_tokens += usage["prompt_tokens_details"]["cached_tokens"]
    return status


def client(index, args, deadline, totals):
    rng = random.Random(index)
    conn = None
    while time.monotonic() < deadline and totals.claim(args.max_requests):
        try:
            if conn is None:
                conn = http.client.HTTPConnection(args.host, args.port, timeout=args.timeout)
            status = one_request(conn, args, rng, totals)
            if status == 429:
                time.sleep(1.0)
        except (OSError, http.client.HTTPException) as e:
            with totals.lock:
                totals.statuses["connection error"] = totals.statuses.get("connection error", 0) + 1
                totals.errors.append("%s: %s" % (type(e).__name__, e))
            if conn is not None:
                conn.close()
            conn = None
    if conn is not None:
        conn.close()


def metrics(args):
    """The /metrics samples as {(name, labels): value}."""
    conn = http.client.HTTPConnection(args.host, args.port, timeout=args.timeout)
    h = {"Authorization": "Bearer " + args.api_key} if args.api_key else {}
    conn.request("GET", "/metrics", headers=h)
    resp = conn.getresponse()
    text = resp.read().decode()
    conn.close()
    if resp.status != 200:
        raise RuntimeError("/metrics answered %d: %s" % (resp.status, text[:200]))
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        out[name_labels] = float(value)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--max-requests", type=int, default=100000, help="bound on requests in all")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--timeout", type=float, default=120.0, help="socket timeout, seconds")
    p.add_argument("--api-key", default="")
    args = p.parse_args()
    if not loopback(args.host):
        sys.exit("load_test.py: only loopback addresses are allowed, got %r" % args.host)
    if not 1 <= args.clients <= 1024 or not 0 < args.seconds <= 3600:
        sys.exit("load_test.py: --clients must be 1..1024 and --seconds 0..3600")

    before = metrics(args)
    totals = Totals()
    start = time.monotonic()
    deadline = start + args.seconds
    threads = [threading.Thread(target=client, args=(i, args, deadline, totals), daemon=True)
               for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        # Each client stops starting requests at the deadline; the last ones still finish.
        t.join(timeout=args.seconds + args.timeout + 10)
    elapsed = time.monotonic() - start
    stuck = sum(t.is_alive() for t in threads)

    # Requests end within one engine step of their last token; give the server a moment.
    after = metrics(args)
    for _ in range(50):
        if (after.get('kvcache_kv_blocks{state="referenced"}', 0) == 0
                and after.get("kvcache_requests_running", 0) == 0):
            break
        time.sleep(0.1)
        after = metrics(args)

    def delta(name):
        return after.get(name, 0) - before.get(name, 0)

    ms = lambda s: "n/a" if s is None else "%.1f ms" % (s * 1000)
    n200 = totals.statuses.get(200, 0)
    n5xx = sum(v for k, v in totals.statuses.items() if isinstance(k, int) and k >= 500)
    referenced = after.get('kvcache_kv_blocks{state="referenced"}', -1)
    print("load test: %d streaming clients for %.0f s against http://%s:%d (%.1f s elapsed)"
          % (args.clients, args.seconds, args.host, args.port, elapsed))
    print("requests:  %d  by status: %s" % (
        totals.requests, ", ".join("%s=%d" % kv for kv in sorted(totals.statuses.items(), key=str))))
    print("tokens:    %d generated (%.0f tokens/s), %d requests/s"
          % (totals.tokens, totals.tokens / elapsed, n200 / elapsed))
    print("TTFT:      p50 %s  p99 %s  (client-side, %d streams)"
          % (ms(percentile(totals.ttft, 0.5)), ms(percentile(totals.ttft, 0.99)), len(totals.ttft)))
    print("e2e:       p50 %s  p99 %s" % (ms(percentile(totals.e2e, 0.5)),
                                         ms(percentile(totals.e2e, 0.99))))
    if totals.prompt_tokens:
        print("prefix cache: %d of %d prompt tokens cached (%.1f%%)" % (
            totals.cached_tokens, totals.prompt_tokens,
            100.0 * totals.cached_tokens / totals.prompt_tokens))
    print("server:    preemptions +%d, evicted blocks +%d, requests running %d, waiting %d"
          % (delta("kvcache_preemptions_total"), delta("kvcache_prefix_cache_evicted_blocks_total"),
             after.get("kvcache_requests_running", -1), after.get("kvcache_requests_waiting", -1)))
    checks = [
        ("zero 5xx responses", n5xx == 0),
        ("every 200 stream ended with [DONE]", totals.incomplete == 0 and n200 > 0),
        ("no connection errors", "connection error" not in totals.statuses),
        ("no referenced (leaked) KV blocks afterwards: %d" % referenced, referenced == 0),
        ("no client stuck", stuck == 0),
    ]
    failed = 0
    for name, ok in checks:
        print("check:     %-55s %s" % (name, "ok" if ok else "FAILED"))
        failed += not ok
    for e in totals.errors[:10]:
        print("error:     %s" % e)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
