#!/usr/bin/env python3
"""Issue 19 figure: the requests a three-node cluster makes of etcd, by kind.

    python benches/cluster_etcd_load.py --bin NEW [--baseline-bin OLD] [--runs 3]

Counts etcd's own gRPC counters (`grpc_server_handled_total` on its `/metrics`, by method)
around three phases, on three fresh nodes with one fresh etcd per run (lake off):

1. **idle**: 20 s with no client, after start-up settled (5 s);
2. **new topics**: 200 topics, each looked up and given a producer by the official Python
   client (every node in the service URL) and one message sent: placement on the LOOKUP, the
   topic's load, its first ledger (an ensemble chosen), per topic;
3. **owned topics**: a producer created and closed again on each of those 200 topics, now
   owned and loaded (a LOOKUP, redirected to the owner where the client asked another node,
   and the producer's registration), per topic;
4. **acks**: 20 of those topics with a consumer each acknowledging 20 messages a second for
   60 s (each subscription's cursor is saved about once a second; the window holds two of each
   node's replica collections, every 30 s), per second.

With `--baseline-bin` the same runs of another build alternate with these; medians of each
are printed with their ratio. Prints a JSON document, then a markdown table; stops every
process by PID.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request

import pulsar

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "interop"))
from conftest import Service, _free_port  # noqa: E402
from servers import Etcd  # noqa: E402

METHODS = ("Range", "Txn", "Put", "DeleteRange", "LeaseGrant", "LeaseKeepAlive", "Watch")


def counters(etcd):
    """Requests etcd handled so far, by gRPC method."""
    with urllib.request.urlopen(f"http://{etcd.endpoint}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {m: 0.0 for m in METHODS}
    for line in text.splitlines():
        if not line.startswith("grpc_server_handled_total{"):
            continue
        labels, value = line.rsplit(" ", 1)
        for m in METHODS:
            if f'grpc_method="{m}"' in labels:
                out[m] += float(value)
    return out


def delta(before, after, per):
    return {m: round((after[m] - before[m]) / per, 2) for m in METHODS}


def one_run(binary):
    etcd = Etcd()
    dirs, nodes = [], []
    try:
        for _ in range(3):
            d = tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR"))
            dirs.append(d)
            nodes.append(Service(binary, d.name, env={"LEDGERLAKE_LAKE__ENABLED": "false"},
                                 args=["--metadata-url", etcd.url("/load"),
                                       "--bookie-addr", f"127.0.0.1:{_free_port()}"]))
        for x in nodes:
            x.start()
        time.sleep(5)
        c0 = counters(etcd)
        time.sleep(20)
        c1 = counters(etcd)
        idle = delta(c0, c1, 20.0)
        url = "pulsar://" + ",".join(f"127.0.0.1:{x.pulsar_port}" for x in nodes)
        client = pulsar.Client(url, operation_timeout_seconds=60)
        try:
            topics = [f"persistent://public/default/load-{i}" for i in range(200)]
            c2 = counters(etcd)
            for t in topics:
                p = client.create_producer(t, batching_enabled=False)
                p.send(b"x")
                p.close()
            c3 = counters(etcd)
            new_topics = delta(c2, c3, len(topics))
            for t in topics:
                client.create_producer(t, batching_enabled=False).close()
            c4 = counters(etcd)
            owned = delta(c3, c4, len(topics))
            acks = ack_phase(client, topics[:20], etcd)
        finally:
            client.close()
        return {"idle_per_s": idle, "per_new_topic": new_topics,
                "per_owned_topic_producer": owned, "acks_per_s": acks}
    finally:
        for x in nodes:
            x.stop()
        etcd.stop()
        for d in dirs:
            d.cleanup()


def ack_phase(client, topics, etcd, seconds=60, rate=20):
    """Per-second etcd requests while a consumer per topic acknowledges `rate` msg/s."""
    pairs = []
    for t in topics:
        consumer = client.subscribe(t, "acks", initial_position=pulsar.InitialPosition.Earliest)
        pairs.append((client.create_producer(t, batching_enabled=False), consumer))
    stop = threading.Event()

    def drive(producer, consumer):
        while not stop.is_set():
            producer.send(b"y")
            msg = consumer.receive(timeout_millis=10000)
            consumer.acknowledge(msg)
            time.sleep(1.0 / rate)

    threads = [threading.Thread(target=drive, args=p, daemon=True) for p in pairs]
    for th in threads:
        th.start()
    time.sleep(2)
    c0 = counters(etcd)
    time.sleep(seconds)
    c1 = counters(etcd)
    stop.set()
    for th in threads:
        th.join(timeout=30)
    for producer, consumer in pairs:
        producer.close()
        consumer.close()
    return delta(c0, c1, float(seconds))


def medians(rows):
    out = {}
    for phase in rows[0]:
        out[phase] = {m: statistics.median(r[phase][m] for r in rows) for m in METHODS}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--baseline-bin")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    new, old = [], []
    for _ in range(args.runs):
        if args.baseline_bin:
            old.append(one_run(args.baseline_bin))
        new.append(one_run(args.bin))
    result = {"runs": new, "medians": medians(new)}
    if old:
        result["baseline_runs"] = old
        result["baseline_medians"] = medians(old)
    print(json.dumps(result, indent=2))
    print("| phase | build | " + " | ".join(METHODS) + " |")
    print("|---|---|" + "---|" * len(METHODS))
    for phase in result["medians"]:
        for label, key in [("baseline", "baseline_medians"), ("this", "medians")]:
            if key in result:
                row = result[key][phase]
                print(f"| {phase} | {label} | " + " | ".join(f"{row[m]:g}" for m in METHODS)
                      + " |")


if __name__ == "__main__":
    main()
