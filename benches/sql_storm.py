#!/usr/bin/env python3
"""Issue 20 figure: producer publish latency during a storm of 50 heavy SQL queries.

    python benches/sql_storm.py --bin target/release/ledgerlake [--messages 200000]
        [--window 30] [--rounds 3] [--clients 50] [--rate 200] [--out F.json]

One `ledgerlake serve` on a temp data dir, default configuration (SQL on its own runtime of
`sql.threads` = 2 workers, at most `sql.max_concurrent_queries` = 8 at once, 1 GiB per query,
300 s deadline), bound to 127.0.0.1 on free ports, stopped by PID at the end.

Set-up: two topics of `--messages` messages each (about 100 bytes, 5,000 distinct keys); the
first is offloaded to the lake and its local copy kept, the second stays in the live tail, so
the storm reads both paths.

The measured producer: the official Python client, batching off, one synchronous `send` every
1/`--rate` s on its own topic; a message's latency is send → SEND_RECEIPT.

Windows alternate `--rounds` times: **quiet** (the producer alone) then **storm**: `--clients`
PostgreSQL-wire connections (psycopg2, in a separate process so this one's timing is not
disturbed) each running heavy queries back to back: a group-by over all keys, a deep sort of
every payload, a hash join of the two topics on key, a cross join that runs to its deadline,
a count-distinct and a sort of hashes. At most 8 run at once; the others wait in the service's
queue, which is part of the storm. Storm windows begin after a 5 s ramp; at the end of a storm
every in-flight query is cancelled (PostgreSQL CancelRequest) and the next quiet window starts
once the storm process has exited.

Reported: publish p50/p99/max per window, the medians over rounds, the ratio storm p99 / quiet
p99 (the issue asks for at most 2), queries finished and failed during storms, and CPU (service,
storm process, machine). One JSON document, then a markdown snippet, on stdout.
"""
import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid

import pulsar

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sql_freshness import CpuWindow, Service, build_running, log  # noqa: E402


def heavy_queries(a, b):
    return [
        f'SELECT key, count(*), sum(length(payload)) FROM "{a}" GROUP BY key ORDER BY 2 DESC, 1 LIMIT 20',
        f'SELECT payload FROM "{b}" ORDER BY payload DESC LIMIT 10 OFFSET 10000',
        f'SELECT count(*) FROM "{a}" x JOIN "{b}" y ON x.key = y.key',
        f'SELECT count(*) FROM "{a}" x CROSS JOIN "{b}" y WHERE (x.entry_id + y.entry_id) % 1000 = 7',
        f'SELECT count(DISTINCT payload) FROM "{b}"',
        f'SELECT count(*) FROM (SELECT md5(payload) AS h FROM "{a}" ORDER BY h)',
    ]


def storm_worker(port, queries, n_clients, stop, stats):
    """Runs in its own process: n_clients connections running queries until `stop` is set."""
    import psycopg2

    conns, done, failed, lock = [], [0], [0], threading.Lock()
    for _ in range(n_clients):
        c = psycopg2.connect(host="127.0.0.1", port=port, user="bench", dbname="lake")
        c.autocommit = True
        conns.append(c)

    def loop(i, conn):
        k = i
        while not stop.is_set():
            sql = queries[k % len(queries)]
            k += 1
            try:
                with conn.cursor() as cur:
                    cur.execute(sql)
                    cur.fetchall()
                ok = True
            except psycopg2.Error:
                ok = False
            with lock:
                (done if ok else failed)[0] += 1

    threads = [threading.Thread(target=loop, args=(i, c)) for i, c in enumerate(conns)]
    for t in threads:
        t.start()
    log(f"storm: {n_clients} connections running queries")
    stop.wait()
    log("storm: stopping")
    # A cancel that reaches a connection between two queries cancels nothing, and the query it
    # sends next runs to its end: cancel every running one, once a second, until all are done.
    deadline = time.monotonic() + 120
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        for c, t in zip(conns, threads):
            if t.is_alive():
                try:
                    c.cancel()
                except psycopg2.Error:
                    pass
        for t in threads:
            t.join(timeout=1.0 / len(threads))
        log(f"storm: {sum(t.is_alive() for t in threads)} queries still running")
    for c in conns:
        c.close()
    stats["finished"], stats["failed"] = done[0], failed[0]


def fill(client, topic, n):
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=1000,
                                      batching_max_publish_delay_ms=5, block_if_queue_full=True)
    for i in range(n):
        producer.send_async(f"{i:09d}-{uuid.uuid4().hex}-{'x' * 50}".encode(), None,
                            partition_key=f"k{i % 5000}")
    producer.flush()
    producer.close()


def publish_window(producer, seconds, rate):
    """Paced synchronous sends for `seconds`: each one's latency in ms."""
    lat, interval = [], 1.0 / rate
    end = time.perf_counter() + seconds
    nxt = time.perf_counter()
    while nxt < end:
        now = time.perf_counter()
        if now < nxt:
            time.sleep(nxt - now)
        t0 = time.perf_counter()
        producer.send(b"p" * 100)
        lat.append((time.perf_counter() - t0) * 1000)
        nxt += interval
    return lat


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summary(lat):
    return {"n": len(lat), "p50_ms": round(pct(lat, 0.5), 2), "p99_ms": round(pct(lat, 0.99), 2),
            "max_ms": round(max(lat), 2)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--window", type=float, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--rate", type=float, default=200)
    ap.add_argument("--out")
    args = ap.parse_args()
    busy = build_running()
    if busy:
        log(f"warning: a build is running ({busy}): figures will be noisy")

    svc = Service(os.path.abspath(args.bin))
    svc.start()
    spawn = multiprocessing.get_context("spawn")
    result = {"binary": args.bin, "messages_per_topic": args.messages, "clients": args.clients,
              "rate": args.rate, "window_s": args.window, "builds_running_at_start": busy,
              "rounds": []}
    try:
        client = pulsar.Client(f"pulsar://127.0.0.1:{svc.pulsar}", operation_timeout_seconds=60)
        a, b = (f"storm-{c}-{uuid.uuid4().hex[:6]}" for c in "ab")
        for t in (a, b):
            log(f"filling {t} with {args.messages} messages")
            fill(client, f"persistent://public/default/{t}", args.messages)
        log(f"offloading {a}")
        subprocess.run([args.bin, "offload", a, "--wait", "--url", f"http://127.0.0.1:{svc.http}"],
                       check=True, stdout=subprocess.DEVNULL)
        producer = client.create_producer(f"persistent://public/default/storm-probe-{uuid.uuid4().hex[:6]}",
                                          batching_enabled=False)
        publish_window(producer, 3, args.rate)  # warm-up
        queries = heavy_queries(a, b)
        for r in range(args.rounds):
            cpu = CpuWindow({"service": svc.proc.pid})
            cpu.start()
            quiet = publish_window(producer, args.window, args.rate)
            quiet_cpu = cpu.stop()
            stop, mgr = spawn.Event(), spawn.Manager()
            stats = mgr.dict()
            storm = spawn.Process(target=storm_worker,
                                  args=(svc.pg, queries, args.clients, stop, stats))
            storm.start()
            publish_window(producer, 5, args.rate)  # ramp: connections open, queries start
            cpu = CpuWindow({"service": svc.proc.pid, "storm": storm.pid})
            cpu.start()
            loud = publish_window(producer, args.window, args.rate)
            loud_cpu = cpu.stop()
            stop.set()
            storm.join(timeout=180)
            if storm.is_alive():
                storm.kill()
                raise RuntimeError("the storm process did not stop")
            rnd = {"quiet": summary(quiet), "quiet_cpu": quiet_cpu, "storm": summary(loud),
                   "storm_cpu": loud_cpu, "queries_finished": stats.get("finished"),
                   "queries_failed": stats.get("failed")}
            mgr.shutdown()
            log(json.dumps(rnd))
            result["rounds"].append(rnd)
        producer.close()
        client.close()
    finally:
        svc.stop()
    q99 = statistics.median(r["quiet"]["p99_ms"] for r in result["rounds"])
    s99 = statistics.median(r["storm"]["p99_ms"] for r in result["rounds"])
    result["median_quiet_p99_ms"], result["median_storm_p99_ms"] = q99, s99
    result["p99_ratio"] = round(s99 / q99, 2)
    result["per_round_ratios"] = [round(r["storm"]["p99_ms"] / r["quiet"]["p99_ms"], 2)
                                  for r in result["rounds"]]
    doc = json.dumps(result, indent=2)
    print(doc)
    if args.out:
        with open(args.out, "w") as f:
            f.write(doc)
    print("\n| window | publish p50 | p99 | max | queries done / failed | service cores |")
    print("|---|---|---|---|---|---|")
    for i, r in enumerate(result["rounds"], 1):
        for w in ("quiet", "storm"):
            s = r[w]
            qs = f'{r["queries_finished"]} / {r["queries_failed"]}' if w == "storm" else "—"
            print(f'| {w} {i} | {s["p50_ms"]} ms | {s["p99_ms"]} ms | {s["max_ms"]} ms | {qs} | '
                  f'{r[w + "_cpu"].get("service_cores")} |')
    print(f"\nmedian p99: quiet {q99} ms, storm {s99} ms, ratio {result['p99_ratio']}")


if __name__ == "__main__":
    main()
