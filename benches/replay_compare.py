"""Replay from the lake vs from the local log, and producer latency while a consumer replays the
lake; in one run, against a release build of `ledgerlake serve` on local disk.

    python benches/replay_compare.py --bin target/release/ledgerlake [--messages 10000000]
                                     [--rounds 3] [--s3]

With `--s3` the warehouse is a local S3 server (SeaweedFS, as in the interop tests) instead of
local disk.

1. Produce `--messages` 100 B messages (batched, as `perf produce` does) to topic A with offload
   off, restart the service (cold caches), then per round: consume A from the earliest with a new
   subscription (`perf consume --messages`): the local replay rate.
2. Offload A, delete the local copies (offloadDeletionLagMs = 0), restart, and per round consume A
   from the earliest again: the lake replay rate (every entry rebuilt from the Iceberg table).
3. Per round: `perf produce --rate 20000` to topic B alone (baseline p99), then the same while a
   consumer replays A from the lake: the ratio of p99 publish latencies. `GET /metrics` is
   scraped before and after each run beside the replay, proving from the service's own counters
   that the lake served the replay meanwhile (`ledgerlake_replay_entries_total{tier="lake"}`,
   `ledgerlake_subscription_reading_lake`) and giving the broker's own write latency
   (`pulsar_storage_write_latency_*` of topic B).

Prints a JSON summary (medians over rounds) for benches/RESULTS.md.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "interop"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    def __init__(self, binary, work, env):
        self.binary, self.work, self.extra_env = binary, work, env
        self.pulsar, self.http, self.pg = free_port(), free_port(), free_port()
        self.proc = None

    def start(self):
        log = open(os.path.join(self.work, "serve.log"), "ab")
        env = dict(os.environ, LEDGERLAKE_LAKE__CHECK_INTERVAL="200ms", **self.extra_env)
        self.proc = subprocess.Popen(
            [self.binary, "serve", "--data-dir", os.path.join(self.work, "data"),
             "--pulsar-addr", f"127.0.0.1:{self.pulsar}", "--http-addr", f"127.0.0.1:{self.http}",
             "--pg-addr", f"127.0.0.1:{self.pg}"],
            stdout=subprocess.DEVNULL, stderr=log, env=env)
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/health/ready", timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("service did not start")

    def stop(self):
        os.kill(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=120)

    def admin(self, method, path, body=None):
        req = urllib.request.Request(f"http://127.0.0.1:{self.http}{path}", method=method,
                                     data=body.encode() if body is not None else None)
        with urllib.request.urlopen(req, timeout=60) as r:
            text = r.read().decode()
            return json.loads(text) if text else None

    def metrics(self):
        """{(sample name, frozenset of labels): value} of one scrape."""
        from prometheus_client.parser import text_string_to_metric_families
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/metrics", timeout=60) as r:
            text = r.read().decode()
        return {(s.name, frozenset(s.labels.items())): s.value
                for f in text_string_to_metric_families(text) for s in f.samples}

    def perf(self, *args):
        out = subprocess.run([self.binary, "perf", *args, "--service-url",
                              f"pulsar://127.0.0.1:{self.pulsar}", "--json"],
                             check=True, capture_output=True, text=True)
        return json.loads(out.stdout)

    def perf_async(self, *args):
        return subprocess.Popen([self.binary, "perf", *args, "--service-url",
                                 f"pulsar://127.0.0.1:{self.pulsar}", "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


TOPIC_A = "persistent://public/default/replay-a"
TOPIC_B = "persistent://public/default/produce-b"


def consume(svc, sub, n):
    r = svc.perf("consume", "--topic", TOPIC_A, "--subscription", sub, "--messages", str(n),
                 "--duration", "1800s")
    assert r["messages"] >= n, r
    return r["msgs_per_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--messages", type=int, default=10_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--s3", action="store_true", help="warehouse on a local S3 server")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ll-replay-bench-")
    s3 = None
    env = {}
    if args.s3:
        from servers import S3Server
        s3 = S3Server()
        env = s3.service_env(f"replay-bench-{os.getpid()}")
    svc = Service(args.bin, work, env)
    result = {"messages": args.messages, "rounds": args.rounds,
              "warehouse": "s3" if args.s3 else "local"}
    try:
        svc.start()
        svc.admin("PUT", "/admin/v2/namespaces/public/default/offloadThreshold", "-1")
        produced = 0
        while produced < args.messages:
            r = svc.perf("produce", "--topic", TOPIC_A, "--size", "100", "--duration", "8s",
                         "--rate", str(max(args.messages // 8, 1000)))
            produced += r["messages"]
        result["produced"] = produced
        n = args.messages
        svc.stop()
        svc.start()
        result["local_msgs_per_s"] = [consume(svc, f"local-{i}", n) for i in range(args.rounds)]

        svc.admin("PUT", "/admin/v2/namespaces/public/default/offloadDeletionLagMs", "0")
        t0 = time.time()
        subprocess.run([args.bin, "offload", TOPIC_A, "--wait", "--url",
                        f"http://127.0.0.1:{svc.http}"], check=True, capture_output=True)
        result["offload_seconds"] = time.time() - t0
        path = "/admin/v2/persistent/public/default/replay-a/stats"
        for _ in range(3000):
            ledgers = svc.admin("GET", path)["ledgers"]
            if all(l["ledger"]["state"] in ("deleted", "open") for l in ledgers
                   if l["ledger"]["entry_count"] > 0):
                break
            time.sleep(0.2)
        result["ledgers_deleted"] = sum(1 for l in ledgers if l["ledger"]["state"] == "deleted")
        svc.stop()
        svc.start()
        result["lake_msgs_per_s"] = [consume(svc, f"lake-{i}", n) for i in range(args.rounds)]
        result["replay_stats"] = svc.admin("GET", path)["replay"]

        alone, during, lake_entries, reading_lake = [], [], [], []
        lake = ("ledgerlake_replay_entries_total", frozenset({("tier", "lake")}))
        for i in range(args.rounds):
            r = svc.perf("produce", "--topic", TOPIC_B, "--rate", "20000", "--duration", "20s")
            alone.append(r["latency"]["p99_us"])
            replayer = svc.perf_async("consume", "--topic", TOPIC_A, "--subscription",
                                      f"busy-{i}", "--messages", str(n), "--duration", "600s")
            time.sleep(2)  # the replay is under way
            before = svc.metrics()
            r = svc.perf("produce", "--topic", TOPIC_B, "--rate", "20000", "--duration", "20s")
            after = svc.metrics()
            during.append(r["latency"]["p99_us"])
            lake_entries.append(after.get(lake, 0) - before.get(lake, 0))
            reading_lake.append(max((v for (name, labels), v in after.items()
                                     if name == "ledgerlake_subscription_reading_lake"
                                     and ("subscription", f"busy-{i}") in labels), default=0))
            replayer.kill()
            replayer.wait()
        result["lake_entries_served_during_runs"] = lake_entries
        result["replay_subscription_reading_lake"] = reading_lake
        result["p99_alone_us"] = alone
        result["p99_during_lake_replay_us"] = during
        med = statistics.median
        result["summary"] = {
            "local_msgs_per_s": med(result["local_msgs_per_s"]),
            "lake_msgs_per_s": med(result["lake_msgs_per_s"]),
            "lake_over_local": med(result["lake_msgs_per_s"]) / med(result["local_msgs_per_s"]),
            "p99_alone_us": med(alone),
            "p99_during_us": med(during),
            "p99_ratio": med(during) / med(alone),
        }
        svc.stop()
    finally:
        if svc.proc and svc.proc.poll() is None:
            svc.proc.kill()
        if s3 is not None:
            s3.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
