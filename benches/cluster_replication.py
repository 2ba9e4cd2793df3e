#!/usr/bin/env python3
"""Issue 19 figures: replicated produce and failover.

    python benches/cluster_replication.py --bin target/release/ledgerlake [--runs 3] [--rounds 5]
        [--failover-only | --tls-only]

1. **Produce at 20,000 msg/s** (`ledgerlake perf produce --rate 20000 --size 100`, one topic,
   one producer, `--duration 20s`): one node on its embedded defaults (unreplicated, 1/1/1)
   against three nodes on one etcd with the namespace's persistence policy 3/3/2 (every entry
   on three bookies, acknowledged by two). Each run starts fresh services (lake off); the
   medians of `--runs` runs of each, alternating, are reported with their ratio.
2. **Failover**: three nodes (3/3/2), one topic, a producer of the official Python client
   (batching off, every node in the service URL) sending synchronously; each round `t0` just
   before SIGKILL of the topic's owner, `t1` when the next synchronous `send()` is
   acknowledged by the new owner (once the old owner's session ended, it fenced and recovered
   its open ledger). Measured on the defaults (session TTL 10 s; peers probe each other every
   500 ms and end the session of a node whose listeners refuse) and with the probing off
   (`metadata.peer_probe_interval = 0`: the session ends when its lease runs out). At the end
   a reader from earliest finds every acknowledged message once, in order.

3. **Bookie TLS** (`--tls-only`, issue 19 / ADR 0013): the produce run of 1. on three nodes
   3/3/2 with plain bookie connections against three nodes whose bookie listeners speak TLS
   (`server.bookie_tls`, a test CA made with openssl), alternating, medians and the p99 ratio.
4. **Striping** (`--striped-only`, ADR 0017): the produce run of 1. on four nodes with whole
   copies (4/4/2) against four nodes striped (4/3/2: each entry on the writer's bookie and two
   of the other three), alternating; medians, the p99 ratio, and each node's journal bytes
   after the run (the replicas' share of the writer's).

Prints a JSON document, then a markdown snippet, on stdout; stops every process by PID.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import pulsar

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "interop"))
from conftest import Service, _free_port  # noqa: E402
from servers import Etcd  # noqa: E402
from cluster_move import owner_of  # noqa: E402  (benches/ is the script's directory)
from test_tls import make_certs  # noqa: E402


def post(node, path, body):
    req = urllib.request.Request(node.http + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 204, r.status


def cluster(binary, etcd, extra_env, dirs, n=3, quorums=(3, 3, 2)):
    prefix = f"/bench-{len(dirs)}-{time.time_ns()}"
    env = {"LEDGERLAKE_LAKE__ENABLED": "false", **extra_env}
    nodes = []
    for _ in range(n):
        d = tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR"))
        dirs.append(d)
        nodes.append(Service(binary, d.name, env=env,
                             args=["--metadata-url", etcd.url(prefix),
                                   "--bookie-addr", f"127.0.0.1:{_free_port()}"]))
    for x in nodes:
        x.start()
    post(nodes[0], "/admin/v2/namespaces/public/default/persistence",
         {"bookkeeperEnsemble": quorums[0], "bookkeeperWriteQuorum": quorums[1],
          "bookkeeperAckQuorum": quorums[2], "managedLedgerMaxMarkDeleteRate": 0})
    return prefix, nodes


def produce(binary, url, topic, duration):
    out = subprocess.run(
        [binary, "perf", "produce", "--service-url", url, "--topic", topic, "--rate", "20000",
         "--size", "100", "--duration", duration, "--json"],
        check=True, capture_output=True, text=True, timeout=600)
    r = json.loads(out.stdout)
    return {"msgs_per_s": round(r["msgs_per_s"]), "p50_ms": r["latency"]["p50_us"] / 1000,
            "p99_ms": r["latency"]["p99_us"] / 1000, "send_errors": r["send_errors"],
            "generator_cpu_cores": round(r["generator_cpu_cores"], 2)}


def produce_on_three(binary, etcd, env, name, duration):
    """The produce run on three fresh nodes (3/3/2) with `env`, stopped after it."""
    dirs = []
    _, nodes = cluster(binary, etcd, env, dirs)
    try:
        # The Rust client takes one host: it looks the topic up there and is redirected.
        return produce(binary, nodes[0].url, f"persistent://public/default/{name}", duration)
    finally:
        for x in nodes:
            x.stop()


def journal_bytes(node):
    """Bytes written to the journal's segment files in `node`'s data directory (segments are
    preallocated: each counts up to its last byte that is not zero)."""
    total = 0
    for root, _, files in os.walk(os.path.join(node.data_dir, "data", "ledger")):
        for f in files:
            if f.endswith(".seg"):
                total += written(os.path.join(root, f))
    return total


def written(path, chunk=1 << 20):
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        while end > 0:
            start = max(0, end - chunk)
            f.seek(start)
            data = f.read(end - start).rstrip(b"\0")
            if data:
                return start + len(data)
            end = start
    return 0


def striped_runs(binary, etcd, runs, duration):
    """Four nodes with whole copies (4/4/2) against four striped (4/3/2), alternating; each
    run also gives each node's journal bytes (the writer's first)."""
    rows = {"whole": [], "striped": []}
    for i in range(runs):
        for label, quorums in [("whole", (4, 4, 2)), ("striped", (4, 3, 2))]:
            dirs = []
            prefix, nodes = cluster(binary, etcd, {}, dirs, n=4, quorums=quorums)
            try:
                topic = f"persistent://public/default/{label}-{i}"
                r = produce(binary, nodes[0].url, topic, duration)
                writer = owner_of(etcd, prefix, topic)
                by_id = {f"127.0.0.1:{x.http_port}": x for x in nodes}
                r["writer_bytes"] = journal_bytes(by_id[writer])
                r["replica_bytes"] = sorted(journal_bytes(x) for x in nodes
                                            if x is not by_id[writer])
                rows[label].append(r)
            finally:
                for x in nodes:
                    x.stop()
    return rows


def tls_runs(binary, etcd, runs, duration):
    """Three nodes with plain bookie connections against three with TLS, alternating."""
    certs_dir = tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR"))
    certs = make_certs(certs_dir.name)
    tls_env = {"LEDGERLAKE_SERVER__BOOKIE_TLS": "true",
               "LEDGERLAKE_SERVER__TLS_CERT_FILE": certs["cert"],
               "LEDGERLAKE_SERVER__TLS_KEY_FILE": certs["key"],
               "LEDGERLAKE_SERVER__BOOKIE_TLS_TRUST_CERTS_FILE": certs["ca"]}
    plain, tls = [], []
    try:
        for i in range(runs):
            for env, rows, label in [({}, plain, "plain"), (tls_env, tls, "tls")]:
                rows.append(produce_on_three(binary, etcd, env, f"{label}-{i}", duration))
    finally:
        certs_dir.cleanup()
    return plain, tls


def produce_runs(binary, etcd, runs, duration):
    single, replicated = [], []
    for i in range(runs):
        dirs = []
        d = tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR"))
        dirs.append(d)
        one = Service(binary, d.name, env={"LEDGERLAKE_LAKE__ENABLED": "false"})
        one.start()
        try:
            single.append(produce(binary, one.url, f"persistent://public/default/one-{i}",
                                  duration))
        finally:
            one.stop()
        replicated.append(produce_on_three(binary, etcd, {}, f"three-{i}", duration))
    return single, replicated


def failover_rounds(binary, etcd, extra_env, rounds):
    dirs = []
    prefix, nodes = cluster(binary, etcd, extra_env, dirs)
    by_id = {f"127.0.0.1:{x.http_port}": x for x in nodes}
    topic = f"persistent://public/default/failover-{time.time_ns()}"
    client = pulsar.Client("pulsar://" + ",".join(f"127.0.0.1:{x.pulsar_port}" for x in nodes),
                           operation_timeout_seconds=120)
    times, sent = [], []
    try:
        producer = client.create_producer(topic, batching_enabled=False,
                                          send_timeout_millis=120000)
        for _ in range(rounds):
            for _ in range(50):
                sent.append(f"m{len(sent)}")
                producer.send(sent[-1].encode())
            owner = by_id[owner_of(etcd, prefix, topic)]
            t0 = time.perf_counter()
            owner.stop(signal.SIGKILL)
            sent.append(f"m{len(sent)}")
            producer.send(sent[-1].encode())
            times.append(time.perf_counter() - t0)
            owner.start()
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        got = [reader.read_next(timeout_millis=60000).data().decode() for _ in sent]
        assert got == sent, "lost, duplicated or reordered messages"
    finally:
        client.close()
        for x in nodes:
            x.stop()
    return times


def med(rows, key):
    return statistics.median(r[key] for r in rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", default="20s")
    ap.add_argument("--failover-only", action="store_true",
                    help="skip the produce runs")
    ap.add_argument("--tls-only", action="store_true",
                    help="only the plain-against-TLS bookie produce runs")
    ap.add_argument("--striped-only", action="store_true",
                    help="only the whole-against-striped produce runs on four nodes")
    args = ap.parse_args()
    etcd = Etcd()
    if args.striped_only:
        try:
            rows = striped_runs(args.bin, etcd, args.runs, args.duration)
        finally:
            etcd.stop()
        ratio = round(med(rows["striped"], "p99_ms") / med(rows["whole"], "p99_ms"), 2)
        print(json.dumps({**rows, "p99_ratio": ratio}, indent=2))
        print("| four nodes | msg/s (median) | p50 ms | p99 ms | replica bytes / writer bytes |")
        print("|---|---|---|---|---|")
        for name, key in [("whole copies, 4/4/2", "whole"), ("striped, 4/3/2", "striped")]:
            share = statistics.median(statistics.mean(r["replica_bytes"]) / r["writer_bytes"]
                                      for r in rows[key])
            print(f"| {name} | {med(rows[key], 'msgs_per_s'):.0f} | "
                  f"{med(rows[key], 'p50_ms'):.2f} | {med(rows[key], 'p99_ms'):.2f} | "
                  f"{share:.2f} |")
        print(f"\np99 ratio (striped / whole): {ratio}")
        return
    if args.tls_only:
        try:
            plain, tls = tls_runs(args.bin, etcd, args.runs, args.duration)
        finally:
            etcd.stop()
        ratio = round(med(tls, "p99_ms") / med(plain, "p99_ms"), 2)
        print(json.dumps({"three_nodes_plain": plain, "three_nodes_bookie_tls": tls,
                          "p99_ratio": ratio}, indent=2))
        print("| bookie connections (three nodes, 3/3/2) | msg/s (median) | p50 ms | p99 ms |")
        print("|---|---|---|---|")
        for name, rows in [("plain TCP", plain), ("TLS", tls)]:
            print(f"| {name} | {med(rows, 'msgs_per_s'):.0f} | {med(rows, 'p50_ms'):.2f} | "
                  f"{med(rows, 'p99_ms'):.2f} |")
        print(f"\np99 ratio (TLS / plain): {ratio}")
        return
    try:
        single, replicated = ([], []) if args.failover_only else \
            produce_runs(args.bin, etcd, args.runs, args.duration)
        probing = failover_rounds(args.bin, etcd, {}, args.rounds)
        lease_only = failover_rounds(args.bin, etcd,
                                     {"LEDGERLAKE_METADATA__PEER_PROBE_INTERVAL": "0s"},
                                     args.rounds)
    finally:
        etcd.stop()
    out = {
        "produce_single_1_1_1": single,
        "produce_three_nodes_3_3_2": replicated,
        "p99_ratio": round(med(replicated, "p99_ms") / med(single, "p99_ms"), 2)
        if replicated else None,
        "failover_defaults_s": [round(t, 2) for t in probing],
        "failover_lease_only_s": [round(t, 2) for t in lease_only],
    }
    print(json.dumps(out, indent=2))
    print("| setup | msg/s (median) | p50 ms | p99 ms | generator cores |")
    print("|---|---|---|---|---|")
    for name, rows in [("one node, 1/1/1", single), ("three nodes, 3/3/2", replicated)][
            :2 if replicated else 0]:
        print(f"| {name} | {med(rows, 'msgs_per_s'):.0f} | {med(rows, 'p50_ms'):.2f} | "
              f"{med(rows, 'p99_ms'):.2f} | {med(rows, 'generator_cpu_cores'):.2f} |")
    print(f"\np99 ratio (three nodes / one node): {out['p99_ratio']}")
    print("| failover setup | median | max |")
    print("|---|---|---|")
    for name, ts in [("defaults (TTL 10 s, peers probed)", probing),
                     ("TTL 10 s, probing off (lease only)", lease_only)]:
        print(f"| {name} | {statistics.median(ts):.2f} s | {max(ts):.2f} s |")


if __name__ == "__main__":
    main()
