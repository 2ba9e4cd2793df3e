#!/usr/bin/env python3
"""Issue 19 / ADR 0016: what a replica killed mid-ledger costs a producer.

    python benches/cluster_ensemble.py --bin target/release/ledgerlake [--runs 3]

Four nodes on one etcd (persistence 3/3/2: a spare bookie outside each ledger's ensemble)
against three (the same policy: no spare, so the ledger rolls). One topic; the official Python
client sends synchronously (batching off) for `--before` seconds, then one of the open
ledger's two replicas (never its writer) is SIGKILLed, and sends go on for `--after` seconds.
Per run:
- the longest send acknowledged after the kill (the stall the producer sees) and the sends per
  second before and after;
- four nodes: the time from the kill until the writer's
  `ledgerlake_ensemble_changes_total{outcome="replaced"}` counts it (polled every 20 ms by a
  thread), and whether the topic kept one ledger;
- three nodes: the same with `outcome="not_replaced"`, and the ledgers the topic has.
At the end a reader from earliest finds every acknowledged message once, in order. Runs
alternate between the two setups; medians are reported. Prints JSON, then a markdown table;
stops every process by PID.
"""
import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time

import pulsar

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "interop"))
from servers import Etcd  # noqa: E402
from cluster_move import owner_of  # noqa: E402  (benches/ is the script's directory)
from cluster_replication import cluster  # noqa: E402
from test_cluster_replication import _bookie_id, _ledgers, _metric  # noqa: E402


def one_run(binary, etcd, n, before, after):
    dirs = []
    prefix, nodes = cluster(binary, etcd, {}, dirs, n=n)
    by_id = {f"127.0.0.1:{x.http_port}": x for x in nodes}
    by_bookie = {_bookie_id(x): x for x in nodes}
    topic = f"persistent://public/default/ensemble-{time.time_ns()}"
    client = pulsar.Client("pulsar://" + ",".join(f"127.0.0.1:{x.pulsar_port}" for x in nodes),
                           operation_timeout_seconds=60)
    sent, latencies = [], []
    outcome = "replaced" if n > 3 else "not_replaced"
    seen = {}
    try:
        producer = client.create_producer(topic, batching_enabled=False,
                                          send_timeout_millis=60000)

        def send_for(seconds):
            end = time.perf_counter() + seconds
            count = 0
            while time.perf_counter() < end:
                sent.append(f"m{len(sent)}")
                t = time.perf_counter()
                producer.send(sent[-1].encode())
                latencies.append(time.perf_counter() - t)
                count += 1
            return count / seconds

        rate_before = send_for(before)
        writer = by_id[owner_of(etcd, prefix, topic)]
        # The cluster's only topic has one open ledger (state 1 as etcd stores it).
        (ledger,) = [r for r in _ledgers(etcd, prefix).values() if r["state"] == 1]
        victim = by_bookie[ledger["replicas"][0]]
        name = f'ledgerlake_ensemble_changes_total{{outcome="{outcome}"}}'
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                try:
                    if _metric(writer, name) >= 1:
                        seen["at"] = time.perf_counter()
                        return
                except OSError:
                    pass
                time.sleep(0.02)

        watcher = threading.Thread(target=watch)
        watcher.start()
        first_after = len(latencies)
        t0 = time.perf_counter()
        victim.stop(signal.SIGKILL)
        rate_after = send_for(after)
        stop.set()
        watcher.join()
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        got = [reader.read_next(timeout_millis=60000).data().decode() for _ in sent]
        assert got == sent, "lost, duplicated or reordered messages"
        assert not reader.has_message_available()
        ledgers = [r for r in _ledgers(etcd, prefix).values()
                   if r["topic_id"] == ledger["topic_id"]]
        return {
            "nodes": n,
            "outcome_seen_after_s": round(seen["at"] - t0, 3) if "at" in seen else None,
            "longest_send_after_kill_ms": round(max(latencies[first_after:]) * 1000, 1),
            "longest_send_before_kill_ms": round(max(latencies[:first_after]) * 1000, 1),
            "sends_per_s_before": round(rate_before),
            "sends_per_s_after": round(rate_after),
            "ledgers_of_topic": len(ledgers),
            "messages": len(sent),
        }
    finally:
        client.close()
        for x in nodes:
            x.stop()
        for d in dirs:
            d.cleanup()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--before", type=float, default=4.0)
    ap.add_argument("--after", type=float, default=6.0)
    args = ap.parse_args()
    etcd = Etcd()
    rows = {4: [], 3: []}
    try:
        for _ in range(args.runs):
            for n in (4, 3):
                rows[n].append(one_run(args.bin, etcd, n, args.before, args.after))
    finally:
        etcd.stop()
    print(json.dumps(rows, indent=2))
    print("| setup | failed replica | outcome counted after | longest send after the kill "
          "| longest before | sends/s before → after | ledgers of the topic |")
    print("|---|---|---|---|---|---|---|")
    for n, label in [(4, "replaced in the ledger"), (3, "ledger rolled (no spare)")]:
        r = rows[n]

        def med(key):
            values = [x[key] for x in r if x[key] is not None]
            return statistics.median(values) if values else None
        print(f"| {n} nodes, 3/3/2 | {label} | {med('outcome_seen_after_s')} s "
              f"({', '.join(str(x['outcome_seen_after_s']) for x in r)}) | "
              f"{med('longest_send_after_kill_ms')} ms "
              f"({', '.join(str(x['longest_send_after_kill_ms']) for x in r)}) | "
              f"{med('longest_send_before_kill_ms')} ms | {med('sends_per_s_before')} → "
              f"{med('sends_per_s_after')} | {med('ledgers_of_topic')} |")


if __name__ == "__main__":
    main()
