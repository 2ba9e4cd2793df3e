#!/usr/bin/env python3
"""Issue 18 figures: the cost of `GET /metrics` at 1,000 and 10,000 loaded topic partitions
(scrape time, body size, resident memory before and after repeated scrapes: a scrape must keep
nothing per topic), and produce throughput and publish p99 with metrics on vs off, measured in
the same run by `ledgerlake perf produce` against services this script starts on 127.0.0.1
(and stops by PID).

    python3 benches/metrics_compare.py --bin target/release/ledgerlake [--runs 3] [--seconds 10]
"""
import argparse
import os
import statistics
import subprocess
import threading
import time
import urllib.request

from tenancy_compare import Service, perf


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def scrape(svc):
    started = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{svc.http}/metrics", timeout=60) as r:
        body = r.read()
    return time.perf_counter() - started, body


def load_topics(binary, svc, n):
    """N topic partitions loaded, each with messages and a producer that came and went."""
    topic = f"persistent://public/default/scrape-{n}"
    args = [binary, "perf", "produce", "--service-url", f"pulsar://127.0.0.1:{svc.pulsar}",
            "--admin-url", f"http://127.0.0.1:{svc.http}", "--topic", topic,
            "--partitions", str(n), "--rate", str(min(2 * n, 20000)), "--duration", "15s",
            "--batch-max-messages", "1", "--json"]
    subprocess.run(args, capture_output=True, text=True, timeout=600, check=True)


def scrape_cost(binary, n, scrapes):
    svc = Service(binary)
    try:
        load_topics(binary, svc, n)
        time.sleep(2)
        before = rss_kib(svc.proc.pid)
        times, size, series = [], 0, 0
        for _ in range(scrapes):
            took, body = scrape(svc)
            times.append(took)
            size = len(body)
            series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        after = rss_kib(svc.proc.pid)
        for _ in range(scrapes):
            scrape(svc)
        after_more = rss_kib(svc.proc.pid)
        return {"topics": n, "median_s": statistics.median(times), "max_s": max(times),
                "bytes": size, "series": series, "rss_before_mib": before / 1024,
                "rss_after_mib": after / 1024, "rss_after_2x_mib": after_more / 1024}
    finally:
        svc.stop()


def scraper(svc, stop):
    while not stop.is_set():
        try:
            scrape(svc)
        except OSError:
            pass
        stop.wait(1.0)


def produce_cost(binary, seconds, runs, rate):
    on = Service(binary)
    os.environ["LEDGERLAKE_METRICS__ENABLED"] = "false"
    try:
        off = Service(binary)
    finally:
        del os.environ["LEDGERLAKE_METRICS__ENABLED"]
    stop = threading.Event()
    # Metrics on is scraped every second, as Prometheus would.
    t = threading.Thread(target=scraper, args=(on, stop), daemon=True)
    t.start()
    out = {"off": [], "on (scraped every 1 s)": []}
    try:
        for i in range(runs):
            for mode, svc in [("off", off), ("on (scraped every 1 s)", on)]:
                out[mode].append(perf(binary, svc, f"persistent://public/default/m-{i}",
                                      seconds, rate=rate))
        return out
    finally:
        stop.set()
        t.join()
        on.stop()
        off.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--scrapes", type=int, default=10)
    ap.add_argument("--only", choices=["scrape", "produce"])
    a = ap.parse_args()
    if a.only != "produce":
        scrape_table(a)
    if a.only != "scrape":
        produce_tables(a)


def scrape_table(a):
    print("## GET /metrics cost (topic partitions loaded, each with messages)")
    print("| topics | scrape median s | max s | body MB | series | RSS before MiB "
          "| after N scrapes | after 2N |")
    print("|---|---|---|---|---|---|---|---|")
    for n in (1000, 10000):
        r = scrape_cost(a.bin, n, a.scrapes)
        print(f"| {n} | {r['median_s']:.3f} | {r['max_s']:.3f} | {r['bytes'] / 1e6:.1f} | "
              f"{r['series']} | {r['rss_before_mib']:.0f} | {r['rss_after_mib']:.0f} | "
              f"{r['rss_after_2x_mib']:.0f} |")


def produce_tables(a):
    for label, rate in (("unthrottled", None), ("20000 msg/s offered", 20000)):
        res = produce_cost(a.bin, a.seconds, a.runs, rate)
        print(f"\n## produce with metrics off vs on, {label}, medians of {a.runs} x {a.seconds} s")
        print("| metrics | msg/s | p50 µs | p99 µs |")
        print("|---|---|---|---|")
        base = None
        for mode, rs in res.items():
            msgs = statistics.median(r["msgs_per_s"] for r in rs)
            p50 = statistics.median(r["latency"]["p50_us"] for r in rs)
            p99 = statistics.median(r["latency"]["p99_us"] for r in rs)
            base = base or msgs
            print(f"| {mode} | {msgs:.0f} ({100 * (msgs - base) / base:+.1f} %) | {p50:.0f} | "
                  f"{p99:.0f} |")


if __name__ == "__main__":
    main()
