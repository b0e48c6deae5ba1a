#!/usr/bin/env python3
"""Soak `agentrl serve` under a mixed, throttled load and sample its resident
memory and open file descriptors every minute.

Standard library only; not part of CI (it runs for an hour by default):

    cargo build --release -p agentrl
    python3 scripts/soak_server.py --bin target/release/agentrl --minutes 60

The load mixes, per worker and at random: whole episodes played with the
server's expert on every env (WebShop and SearchQA with a catalog/corpus size
drawn from eight, so the LRU caches build and evict), AgentGym-dialect
episodes under /{env}/, invalid actions, malformed JSON, unknown ids, steps
after done, forbidden and out-of-range params, oversized bodies, abandoned
sessions (left for the TTL to close) and slow clients that send half a
request head and wait. Every answer's status is checked against what
docs/src/serving-envs.md promises; anything else (a 5xx that is not a cap or timeout, a reset
connection, the server exiting) is counted as a failure.

Writes a CSV of the samples (--csv) and prints a summary; exits 1 on any
failure or if the server's memory or fds at the end exceed --max-growth times
their peak over the first half (after a tenth of the run for warm-up).
"""

import argparse
import csv
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter

ENVS = ["bandit", "frozenlake", "sokoban", "textcraft", "alfworld", "babyai", "webshop", "searchqa"]
CATALOG_SIZES = [100, 150, 200, 250, 300, 350, 400, 450]


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.statuses = Counter()
        self.scenarios = Counter()
        self.failures = []

    def status(self, s):
        with self.lock:
            self.statuses[s] += 1

    def scenario(self, name):
        with self.lock:
            self.scenarios[name] += 1

    def fail(self, what):
        with self.lock:
            if len(self.failures) < 200:
                self.failures.append(what)
            self.statuses["FAIL"] += 1


class Client:
    """One keep-alive connection; reconnects when the server closes it."""

    def __init__(self, port, stats):
        self.port, self.stats = port, stats
        self.conn = None

    def request(self, method, path, body=None, raw=None, expect=(200,), closes=False):
        """`closes`: the server may refuse the request by closing the
        connection before the body is sent (an oversized body)."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        for attempt in range(2):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                headers = {"Content-Type": "application/json"} if data is not None else {}
                self.conn.request(method, path, body=data, headers=headers)
                resp = self.conn.getresponse()
                payload = resp.read()
                break
            except (ConnectionError, http.client.HTTPException, socket.timeout) as e:
                # An idle keep-alive connection may be closed by the server's
                # header timeout or connection cap: reconnect once.
                self.conn = None
                if closes:
                    self.stats.status("closed")
                    return None, None
                if attempt == 1:
                    self.stats.fail(f"{method} {path}: {type(e).__name__}: {e}")
                    return None, None
        self.stats.status(resp.status)
        if resp.status not in expect:
            self.stats.fail(f"{method} {path} -> {resp.status} (expected {expect}): {payload[:200]!r}")
        try:
            return resp.status, json.loads(payload) if payload else None
        except json.JSONDecodeError:
            self.stats.fail(f"{method} {path}: non-JSON answer {payload[:200]!r}")
            return resp.status, None


def params_for(env, rng):
    if env == "webshop":
        return {"catalog_size": rng.choice(CATALOG_SIZES)}
    if env == "searchqa":
        return {"corpus_size": rng.choice(CATALOG_SIZES)}
    return {}


def expert_episode(c, rng, stats):
    env = rng.choice(ENVS)
    st, created = c.request("POST", "/create", {"env": env, "seed": rng.randrange(10**6),
                                                "params": params_for(env, rng)},
                            expect=(200, 503))
    if st != 200 or created is None:
        return
    sid = created["id"]
    for _ in range(60):
        st, a = c.request("GET", f"/expert_action?id={sid}", expect=(200, 409))
        if st != 200 or not a or a.get("action") is None:
            break
        st, step = c.request("POST", "/step", {"id": sid, "action": a["action"]})
        if step is None or step.get("done"):
            break
    c.request("POST", "/step", {"id": sid, "action": "Up"}, expect=(200, 400, 409))
    c.request("POST", "/close", {"id": sid})


def agentgym_episode(c, rng, stats):
    env = rng.choice(["babyai", "textcraft", "alfworld"])
    if env == "textcraft":
        st, created = c.request("POST", f"/{env}/create", {"commands": None, "goal": None},
                                expect=(200, 503))
    else:
        st, created = c.request("POST", f"/{env}/create", expect=(200, 503))
    if st != 200 or created is None:
        return
    sid = created["id"] if isinstance(created, dict) else created
    if env == "alfworld":
        c.request("POST", f"/{env}/reset", {"id": sid, "game": rng.randrange(50), "world_type": "Text"})
    else:
        c.request("POST", f"/{env}/reset", {"id": sid, "data_idx": rng.randrange(50)})
    for _ in range(5):
        c.request("GET", f"/{env}/observation?id={sid}")
        c.request("POST", f"/{env}/step", {"id": sid, "action": rng.choice(["look", "go north", "turn left", "inventory", "nonsense!"])})
    c.request("POST", f"/{env}/close", {"id": sid})


def bad_requests(c, rng, stats):
    c.request("POST", "/create", raw=b"{not json", expect=(400,))
    c.request("POST", "/step", {"id": rng.randrange(1, 2**53), "action": "Up"}, expect=(404,))
    c.request("POST", "/create", {"env": "chess"}, expect=(404,))
    c.request("POST", "/create", {"env": "webshop", "params": {"data_dir": "/etc"}}, expect=(403,))
    c.request("POST", "/create", {"env": "frozenlake", "params": {"size": 10**6}}, expect=(400, 422))
    c.request("POST", "/create", raw=b'{"env":"bandit","pad":"' + b"x" * (2 << 20) + b'"}',
              expect=(413,), closes=True)
    st, created = c.request("POST", "/create", {"env": "sokoban", "seed": rng.randrange(1000)},
                            expect=(200, 503))
    if st == 200 and created:
        sid = created["id"]
        c.request("POST", "/step", {"id": sid, "action": "teleport"}, expect=(400,))
        c.request("POST", "/step", {"id": sid, "action": "Up " * 10_000}, expect=(400,))
        c.request("POST", "/close", {"id": sid})
        c.request("POST", "/close", {"id": sid}, expect=(404,))


def abandoned(c, rng, stats):
    env = rng.choice(ENVS)
    c.request("POST", "/create", {"env": env, "seed": rng.randrange(10**6), "params": params_for(env, rng)},
              expect=(200, 503))


def slow_client(port, rng, stats):
    """Half a request head, then silence: the header timeout must close it."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"POST /step HTTP/1.1\r\nHost: x\r\n")
        s.settimeout(1.0)
        try:
            s.recv(1)
        except socket.timeout:
            pass
        s.close()
    except OSError as e:
        stats.fail(f"slow client: {e}")


SCENARIOS = [(expert_episode, 50), (agentgym_episode, 15), (bad_requests, 15), (abandoned, 15)]


def worker(port, seed, stop, stats, pause):
    rng = random.Random(seed)
    c = Client(port, stats)
    fns, weights = zip(*SCENARIOS)
    while not stop.is_set():
        if rng.random() < 0.03:
            stats.scenario("slow_client")
            slow_client(port, rng, stats)
        else:
            fn = rng.choices(fns, weights)[0]
            stats.scenario(fn.__name__)
            fn(c, rng, stats)
        stop.wait(pause)


def sample(pid):
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) // 1024
            if line.startswith("Threads:"):
                threads = int(line.split()[1])
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return rss, fds, threads


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release/agentrl")
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--pause", type=float, default=0.05, help="seconds each worker rests between scenarios")
    ap.add_argument("--ttl-secs", type=int, default=20)
    ap.add_argument("--sample-secs", type=float, default=60)
    ap.add_argument("--csv", default="soak.csv")
    ap.add_argument("--max-growth", type=float, default=1.25,
                    help="largest allowed ratio of the last sample to the peak of the first half "
                         "after warm-up (RSS and fds)")
    args = ap.parse_args()

    server = subprocess.Popen(
        [args.bin, "serve", "--port", "0", "--ttl-secs", str(args.ttl_secs), "--header-timeout-secs", "5"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = server.stdout.readline()
    m = re.search(r"http://127\.0\.0\.1:(\d+)", first)
    if not m:
        print("server did not start:", first, server.stdout.read(), file=sys.stderr)
        return 1
    port = int(m.group(1))
    threading.Thread(target=lambda: [None for _ in server.stdout], daemon=True).start()

    stats, stop = Stats(), threading.Event()
    threads = [threading.Thread(target=worker, args=(port, i, stop, stats, args.pause), daemon=True)
               for i in range(args.workers)]
    for t in threads:
        t.start()
    health = Client(port, Stats())
    rows = []
    start = time.time()
    end = start + args.minutes * 60
    with open(args.csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["minute", "rss_mib", "fds", "threads", "sessions", "requests", "failures"])
        while True:
            now = time.time()
            if server.poll() is not None:
                stats.fail(f"server exited with {server.returncode}")
                break
            rss, fds, nthreads = sample(server.pid)
            _, h = health.request("GET", "/health")
            with stats.lock:
                requests = sum(v for k, v in stats.statuses.items() if k != "FAIL")
                failures = stats.statuses["FAIL"]
            row = [round((now - start) / 60, 1), rss, fds, nthreads, (h or {}).get("sessions"), requests, failures]
            rows.append(row)
            w.writerow(row)
            f.flush()
            print("minute {:>5}  rss {:>5} MiB  fds {:>4}  threads {:>3}  sessions {:>5}  requests {:>8}  failures {}".format(*row), flush=True)
            if now >= end:
                break
            time.sleep(min(args.sample_secs, max(0.0, end - now)))
    stop.set()
    for t in threads:
        t.join(timeout=30)
    server.send_signal(signal.SIGINT)
    try:
        code = server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        code = "killed after 30 s"
    print("\nscenarios:", dict(stats.scenarios))
    print("statuses:", dict(sorted(stats.statuses.items(), key=str)))
    print("server exit on ctrl-c:", code)
    bad = list(stats.failures)
    # Caches fill during the first minutes; a leak shows as the second half
    # outgrowing the first half's peak.
    if len(rows) >= 6:
        warm = rows[len(rows) // 10 + 1 : len(rows) // 2 + 1]
        last = rows[-1]
        for name, i in [("rss", 1), ("fds", 2)]:
            peak = max(r[i] for r in warm)
            if last[i] > args.max_growth * max(peak, 1):
                bad.append(f"{name} grew from a first-half peak of {peak} to {last[i]}")
    if code != 0:
        bad.append(f"server exit code {code}")
    for b in bad[:30]:
        print("FAIL:", b)
    print("PASS" if not bad else f"{len(bad)} failure(s)")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
