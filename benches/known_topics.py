"""A million topics known to the metadata store, only the active ones loaded (issue 22).

    python benches/known_topics.py --bin target/release/ledgerlake --topics 1000000 \
        [--compare-bin OLD_BINARY]

One run on a fresh service (lake off, embedded SQLite metadata store, defaults otherwise):
1. creates N non-partitioned topics through the admin API (`PUT /admin/v2/persistent/...`,
   `--threads` keep-alive connections) and reports topics created per second; each creation
   loads its topic, which `broker.unload_idle_after` (`--idle`) unloads again;
2. once none is loaded: resident memory, open files, CPU over `--window` seconds and the
   metadata store's size;
3. what must not grow with the number of topics: the load time of unloaded topics from the
   official Python client (`create_producer`, lookup included) on `--samples` random topics,
   then one message produced and read back on each of 20 of them; the latency of a SQL query
   naming one topic (`POST /sql`, median of `--sql-samples`);
4. what is a listing by nature, for reference: the namespace's topic list (`GET
   /admin/v2/persistent/public/default`) and `information_schema.tables` (given
   `--listing-timeout` seconds; an error is reported as such);
5. a graceful restart (SIGTERM to exit, start to `/health/ready`) and a crash restart (SIGKILL
   with 1,000 topics written to, so each has an open ledger, then start to ready).
With `--compare-bin`, the other binary is started on the same data directory afterwards and
steps 2-3 (idle figures and SQL latency) are measured again, so the two are compared in one run.
Prints one JSON object; partial figures go to stderr as they come.
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from many_topics import (Service, load_buckets, load_times, measure, metric,  # noqa: E402
                         quantile_from_buckets)

BASE = "persistent://public/default/known"


def note(out):
    print(json.dumps(out), file=sys.stderr, flush=True)


def create_topics(svc, n, threads):
    """PUTs topics known-0..n-1 over `threads` keep-alive connections; returns topics/s."""
    def worker(part):
        conn = http.client.HTTPConnection("127.0.0.1", svc.http_port, timeout=120)
        for i in range(part, n, threads):
            conn.request("PUT", f"/admin/v2/persistent/public/default/known-{i}")
            r = conn.getresponse()
            r.read()
            if r.status not in (204, 409):
                raise RuntimeError(f"creating known-{i}: HTTP {r.status}")
        conn.close()

    started = time.time()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for f in [pool.submit(worker, p) for p in range(threads)]:
            f.result()
    took = time.time() - started
    return {"topics": n, "seconds": round(took, 1), "topics_per_s": round(n / took)}


def wait_unloaded(svc, limit=900):
    deadline = time.time() + limit
    while metric(svc.http, "ledgerlake_topics_loaded") not in (0, None):
        if time.time() > deadline:
            raise RuntimeError("topics were not unloaded")
        time.sleep(1)


def timed_get(url, timeout=600):
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=timeout) as r:
        body = r.read()
    return (time.perf_counter() - started) * 1000, body


def sql(svc, query, timeout=600):
    req = urllib.request.Request(f"{svc.http}/sql", data=query.encode(), method="POST",
                                 headers={"Content-Type": "text/plain"})
    started = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        rows = json.loads(r.read())
    return (time.perf_counter() - started) * 1000, rows


def sql_latency(svc, n, samples):
    took = []
    for i in random.sample(range(n), samples):
        ms, rows = sql(svc, f'SELECT count(*) AS c FROM "known-{i}"')
        took.append(ms)
    return {"samples": samples, "median_ms": round(statistics.median(took), 2),
            "max_ms": round(max(took), 2)}


def client_checks(svc, n, samples):
    import pulsar
    loads = load_times(svc, [f"{BASE}-{i}" for i in random.sample(range(n), samples)], samples)
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    checked = 0
    for i in random.sample(range(n), 20):
        topic = f"{BASE}-{i}"
        consumer = client.subscribe(topic, "check",
                                    initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic)
        payload = f"m-{i}".encode()
        producer.send(payload)
        got = consumer.receive(timeout_millis=10000)
        if got.data() != payload:
            raise RuntimeError(f"{topic}: read {got.data()!r}, sent {payload!r}")
        consumer.acknowledge(got)
        producer.close()
        consumer.close()
        checked += 1
    client.close()
    return loads, checked


def idle_and_sql(svc, args, data_dir):
    wait_unloaded(svc)
    out = {"unloaded": measure(svc.proc.pid, args.window)}
    db = os.path.join(data_dir, "data", "metadata.db")
    out["metadata_db_mb"] = round(os.path.getsize(db) / 2**20, 1)
    out["sql_one_topic"] = sql_latency(svc, args.topics, args.sql_samples)
    return out


def run(args):
    with tempfile.TemporaryDirectory(dir=args.tmp) as d:
        svc = Service(args.bin, d, args.idle)
        out = {"topics": args.topics, "start_seconds": round(svc.start(), 2)}
        try:
            out["empty"] = measure(svc.proc.pid, 2)
            out["create"] = create_topics(svc, args.topics, args.threads)
            note(out)
            out.update(idle_and_sql(svc, args, d))
            note(out)
            before = load_buckets(svc.http)
            out["load_from_client"], out["produced_and_read"] = client_checks(
                svc, args.topics, args.samples)
            after = load_buckets(svc.http)
            out["load_on_server"] = {
                "p50_ms_at_most": 1000 * quantile_from_buckets(before, after, 0.5),
                "p99_ms_at_most": 1000 * quantile_from_buckets(before, after, 0.99)}
            ms, body = timed_get(f"{svc.http}/admin/v2/persistent/public/default")
            out["namespace_listing"] = {"ms": round(ms), "topics": len(json.loads(body))}
            try:
                ms, rows = sql(svc, "SELECT count(*) AS c FROM information_schema.tables "
                                    "WHERE table_schema = 'default'", timeout=args.listing_timeout)
                out["information_schema_tables"] = {"ms": round(ms), "rows": rows}
            except OSError as e:
                out["information_schema_tables"] = {
                    "error": f"{e} (timeout {args.listing_timeout} s)"}
            note(out)
            out["stop_seconds"] = round(svc.stop(), 2)
            out["restart_to_ready_seconds"] = round(svc.start(), 2)
            out["after_restart"] = measure(svc.proc.pid, 2)
            client = __import__("pulsar").Client(svc.url, operation_timeout_seconds=30)
            for i in random.sample(range(args.topics), 1000):
                client.create_producer(f"{BASE}-{i}").send(b"x")
            client.close()
            svc.stop(signal.SIGKILL)
            out["crash_restart_to_ready_seconds"] = round(svc.start(), 2)
            note(out)
            if args.compare_bin:
                svc.stop()
                other = Service(args.compare_bin, d, args.idle)
                other.start()
                svc = other
                out["compare_bin"] = {"bin": args.compare_bin,
                                      **idle_and_sql(svc, args, d)}
        finally:
            svc.stop(signal.SIGKILL)
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--compare-bin", default=None)
    ap.add_argument("--topics", type=int, default=1000000)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--idle", default="5s", help="broker.unload_idle_after")
    ap.add_argument("--window", type=float, default=10.0, help="CPU sampling window, seconds")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--sql-samples", type=int, default=20)
    ap.add_argument("--listing-timeout", type=float, default=120.0,
                    help="seconds allowed to the information_schema listing")
    ap.add_argument("--tmp", default=None)
    args = ap.parse_args()
    print(json.dumps(run(args), indent=1))


if __name__ == "__main__":
    main()
