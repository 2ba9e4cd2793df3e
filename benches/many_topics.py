"""Many topics on one node (issue 22): what a topic costs loaded and idle-unloaded, how long an
unloaded topic takes to load back, and how long a restart takes.

    python benches/many_topics.py --bin target/release/ledgerlake --topics 10000 --runs 3

Each run starts a fresh service (lake off: every topic would otherwise get an Iceberg table of
its own, which the shared-table layout of issue 22 has not replaced yet), then:
1. `ledgerlake perf produce` creates a durable subscription on each of N topics and produces
   `--messages-per-topic` messages to each (16 connections), so every topic was written to and
   has a backlog;
2. with every topic still loaded: resident memory, open files and CPU over `--window` seconds
   (before any `/metrics` scrape), then resident memory after one scrape;
3. once `broker.unload_idle_after` unloaded them all: the same again, in the window right
   after the last unloads and in the next one (settled);
4. load time of unloaded topics, from the official Python client (`create_producer`, which
   includes the lookup) on `--samples` random topics, and from the server's
   `ledgerlake_topic_load_seconds` histogram;
5. a graceful restart: time from SIGTERM to exit, and from start to `/health/ready`;
6. a crash restart: every topic is written to again (so each has an open ledger), then
   SIGKILL, and the time from start to `/health/ready` (recovery seals every open ledger).
Prints one JSON object per run and the medians. With `--loaded-windows N`, only: topics never
unloaded, CPU over N consecutive windows after the populate.
"""
import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


def open_files(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def metrics(http):
    with urllib.request.urlopen(f"{http}/metrics", timeout=60) as r:
        return r.read().decode()


def metric(http, name):
    for line in metrics(http).splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def load_buckets(http):
    """{upper bound: cumulative count} of ledgerlake_topic_load_seconds."""
    out = {}
    for line in metrics(http).splitlines():
        if line.startswith("ledgerlake_topic_load_seconds_bucket"):
            le = line.split('le="')[1].split('"')[0]
            out[float("inf") if le == "+Inf" else float(le)] = float(line.split()[1])
    return out


def quantile_from_buckets(before, after, q):
    """Upper bound of the bucket holding quantile q of the loads between two scrapes."""
    bounds = sorted(after)
    total = after[bounds[-1]] - before.get(bounds[-1], 0)
    if total <= 0:
        return None
    for b in bounds:
        if after[b] - before.get(b, 0) >= q * total:
            return b
    return bounds[-1]


class Service:
    """A service on fresh ports; the lake is off unless `env` turns it on (with its knobs)."""

    def __init__(self, binary, data_dir, idle, env=None):
        self.binary, self.data_dir, self.idle = binary, data_dir, idle
        self.env = {"LEDGERLAKE_LAKE__ENABLED": "false", **(env or {})}
        self.pulsar, self.http_port, self.pg = free_port(), free_port(), free_port()
        self.http = f"http://127.0.0.1:{self.http_port}"
        self.url = f"pulsar://127.0.0.1:{self.pulsar}"
        self.proc = None

    def start(self):
        env = dict(os.environ, LEDGERLAKE_BROKER__UNLOAD_IDLE_AFTER=self.idle, **self.env)
        log = open(os.path.join(self.data_dir, "serve.log"), "ab")
        started = time.time()
        self.proc = subprocess.Popen(
            [self.binary, "serve", "--data-dir", os.path.join(self.data_dir, "data"),
             "--pulsar-addr", f"127.0.0.1:{self.pulsar}",
             "--http-addr", f"127.0.0.1:{self.http_port}",
             "--pg-addr", f"127.0.0.1:{self.pg}"],
            stdout=subprocess.DEVNULL, stderr=log, env=env)
        while time.time() - started < 600:
            if self.proc.poll() is not None:
                raise RuntimeError("service exited")
            try:
                with urllib.request.urlopen(f"{self.http}/health/ready", timeout=1) as r:
                    if r.status == 200:
                        return time.time() - started
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("service not ready")

    def stop(self, sig=signal.SIGTERM):
        started = time.time()
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            self.proc.wait(timeout=600)
        self.proc = None
        return time.time() - started


def measure(pid, window):
    c0, t0 = cpu_seconds(pid), time.time()
    time.sleep(window)
    cpu = (cpu_seconds(pid) - c0) / (time.time() - t0)
    return {"rss_mb": round(rss_mb(pid), 1), "open_files": open_files(pid),
            "cpu_percent_of_a_core": round(100 * cpu, 2)}


def load_times(svc, topics, samples):
    import pulsar
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    took = []
    for t in random.sample(topics, min(samples, len(topics))):
        started = time.perf_counter()
        p = client.create_producer(t)
        took.append((time.perf_counter() - started) * 1000)
        p.close()
    client.close()
    took.sort()
    return {"samples": len(took), "p50_ms": round(took[len(took) // 2], 2),
            "p99_ms": round(took[min(len(took) - 1, int(len(took) * 0.99))], 2)}


def populate(args, svc, base, per_topic):
    """Produces `per_topic` messages to each topic (with a durable subscription on each)."""
    cmd = [args.bin, "perf", "produce", "--service-url", svc.url, "--topic", base,
           "--topic-count", str(args.topics), "--subscription", "s",
           "--messages", str(args.topics * per_topic),
           "--rate", str(args.rate), "--connections", "16",
           "--batch-max-messages", "1", "--duration", "1h", "--json"]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def note(out):
    """The run's figures so far, on stderr (a long run that fails later keeps them)."""
    print(json.dumps(out), file=sys.stderr, flush=True)


def run_once(args):
    with tempfile.TemporaryDirectory(dir=args.tmp) as d:
        svc = Service(args.bin, d, args.idle)
        svc.start()
        try:
            pid = svc.proc.pid
            out = {"topics": args.topics, "empty": measure(pid, 2)}
            base = "persistent://public/default/many"
            started = time.time()
            produced = populate(args, svc, base, args.messages_per_topic)
            out["populate_seconds"] = round(time.time() - started, 1)
            out["populate"] = {k: produced[k] for k in
                               ("messages", "msgs_per_s", "setup_seconds", "send_errors",
                                "generator_cpu_cores")}
            # Measured before the first /metrics scrape: with topic-level metrics on (the
            # default) one scrape's text is several KB per topic, and malloc keeps that memory
            # for reuse afterwards.
            out["all_loaded"] = measure(pid, args.window)
            out["loaded_topics"] = metric(svc.http, "ledgerlake_topics_loaded")
            time.sleep(2)
            out["all_loaded_after_a_scrape_rss_mb"] = round(rss_mb(pid), 1)
            note(out)
            deadline = time.time() + 900
            while metric(svc.http, "ledgerlake_topics_loaded") not in (0, None):
                if time.time() > deadline:
                    raise RuntimeError("topics were not unloaded")
                time.sleep(1)
            out["unloaded"] = measure(pid, args.window)
            # The window right after the last unloads holds their tail (sealing, memory handed
            # back); the next one is the settled idle cost.
            out["unloaded_settled"] = measure(pid, args.window)
            note(out)
            topics = [f"{base}-{i}" for i in range(args.topics)]
            before = load_buckets(svc.http)
            out["load_from_client"] = load_times(svc, topics, args.samples)
            after = load_buckets(svc.http)
            out["load_on_server"] = {
                "p50_ms_at_most": 1000 * quantile_from_buckets(before, after, 0.5),
                "p99_ms_at_most": 1000 * quantile_from_buckets(before, after, 0.99)}
            out["stop_seconds"] = round(svc.stop(), 2)
            note(out)
            out["restart_to_ready_seconds"] = round(svc.start(), 2)
            out["after_restart"] = measure(svc.proc.pid, 2)
            if args.crash:
                populate(args, svc, base, 1)
                svc.stop(signal.SIGKILL)
                out["crash_restart_to_ready_seconds"] = round(svc.start(), 2)
                out["after_crash_restart"] = measure(svc.proc.pid, 2)
        finally:
            svc.stop(signal.SIGKILL)
        return out


def loaded_tail(args):
    """`--loaded-windows N`: topics never unloaded; CPU over N consecutive windows after the
    populate, to see how long the work its traffic left behind lasts and what an idle, loaded
    node costs once it is done."""
    with tempfile.TemporaryDirectory(dir=args.tmp) as d:
        svc = Service(args.bin, d, "0s")
        svc.start()
        try:
            pid = svc.proc.pid
            populate(args, svc, "persistent://public/default/many", args.messages_per_topic)
            windows = [measure(pid, args.window)["cpu_percent_of_a_core"]
                       for _ in range(args.loaded_windows)]
            return {"topics": args.topics, "window_seconds": args.window,
                    "loaded_cpu_percent_of_a_core_per_window": windows,
                    "rss_mb": round(rss_mb(pid), 1)}
        finally:
            svc.stop(signal.SIGKILL)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--topics", type=int, default=10000)
    ap.add_argument("--messages-per-topic", type=int, default=2)
    ap.add_argument("--rate", type=int, default=20000)
    ap.add_argument("--idle", default="30s", help="broker.unload_idle_after")
    ap.add_argument("--window", type=float, default=10.0, help="CPU sampling window, seconds")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--no-crash", dest="crash", action="store_false",
                    help="skip the crash restart (step 6)")
    ap.add_argument("--loaded-windows", type=int, default=0,
                    help="only measure CPU over this many windows with every topic loaded")
    args = ap.parse_args()
    if args.loaded_windows:
        for _ in range(args.runs):
            print(json.dumps(loaded_tail(args)), flush=True)
        return 0
    runs = []
    for i in range(args.runs):
        r = run_once(args)
        print(json.dumps(r), flush=True)
        runs.append(r)

    def med(path):
        vals = []
        for r in runs:
            v = r
            for k in path.split("."):
                v = v[k]
            vals.append(v)
        return statistics.median(vals)

    keys = ["all_loaded.rss_mb", "all_loaded.cpu_percent_of_a_core", "all_loaded.open_files",
            "unloaded.rss_mb", "unloaded.cpu_percent_of_a_core", "unloaded.open_files",
            "unloaded_settled.cpu_percent_of_a_core",
            "empty.rss_mb", "load_from_client.p50_ms", "load_from_client.p99_ms",
            "restart_to_ready_seconds", "stop_seconds", "populate.msgs_per_s"]
    if args.crash:
        keys.append("crash_restart_to_ready_seconds")
    print(json.dumps({"medians_of": len(runs), **{k: med(k) for k in keys}}))


if __name__ == "__main__":
    sys.exit(main())
