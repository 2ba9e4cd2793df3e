#!/usr/bin/env python3
"""Issue 19 figure: planned move time, `PUT …/unload?destinationBroker=` → first acknowledged
publish on the new owner.

    python benches/cluster_move.py --bin target/release/ledgerlake [--rounds 20]

Two `ledgerlake serve` nodes on one etcd (all on free 127.0.0.1 ports, temp directories, lake
off, default session settings), each with its bookie listener. One topic; a producer of the
official Python client (batching off, both nodes in a multi-host service URL) has sent 200
messages. Each round: `t0` just before the admin call to the current owner naming the other
node; the call returns once the topic is sealed and released; then one synchronous `send()`
(the client has received CLOSE_PRODUCER, looks the topic up again and is redirected to the
new owner); `t1` when it is acknowledged. Reported: median and max of `t1 - t0`, and of the
admin call alone. Every round checks that the owner changed (read from etcd) and, at the end,
that a consumer from earliest reads every message once, in order.

The same measure on a single node (SQLite metadata, `unload` without a destination: the same
node loads the topic again) is the comparison, in the same run.

Third measure, graceful stop: `t0` just before SIGTERM to the owner (which hands its topics
over: marks itself stopping, closes its clients, seals, releases, exits); `t1` when the next
synchronous `send()` is acknowledged by the other node; then the stopped node is started again
(not timed) for the next round.

Prints a JSON document, then a markdown snippet, on stdout; stops every process by PID.
"""
import argparse
import json
import os
import statistics
import sys
import time
import urllib.request

import pulsar

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "interop"))
from conftest import Service, _free_port  # noqa: E402
from servers import Etcd  # noqa: E402


def put(node, path):
    req = urllib.request.Request(node.http + path, data=b"", method="PUT")
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 204, r.status


def owner_of(etcd, prefix, topic):
    for key, value in etcd.items(f"{prefix}/cluster/owners/").items():
        if key.endswith(topic):
            return json.loads(value[1:])["id"]
    return None


def rounds(nodes, topic, n, move_to):
    """(move → ack seconds, admin call seconds) per round."""
    client = pulsar.Client("pulsar://" + ",".join(f"127.0.0.1:{x.pulsar_port}" for x in nodes),
                           operation_timeout_seconds=30)
    total, admin = [], []
    sent = 0
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for _ in range(200):
            producer.send(f"m{sent}".encode())
            sent += 1
        for _ in range(n):
            owner, target = move_to()
            path = f"/admin/v2/persistent/public/default/{topic.rsplit('/', 1)[1]}/unload"
            if target is not None:
                path += f"?destinationBroker=127.0.0.1:{target.http_port}"
            t0 = time.perf_counter()
            put(owner, path)
            t_admin = time.perf_counter()
            producer.send(f"m{sent}".encode())
            t1 = time.perf_counter()
            sent += 1
            total.append(t1 - t0)
            admin.append(t_admin - t0)
        consumer = client.subscribe(topic, "check", initial_position=pulsar.InitialPosition.Earliest)
        got = [consumer.receive(timeout_millis=30000).data() for _ in range(sent)]
        assert got == [f"m{i}".encode() for i in range(sent)], "lost or reordered messages"
    finally:
        client.close()
    return total, admin


def stop_rounds(nodes, etcd, prefix, topic, n):
    """SIGTERM → first ack on the other node, seconds per round."""
    by_id = {f"127.0.0.1:{x.http_port}": x for x in nodes}
    client = pulsar.Client("pulsar://" + ",".join(f"127.0.0.1:{x.pulsar_port}" for x in nodes),
                           operation_timeout_seconds=30)
    times = []
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"first")
        for _ in range(n):
            owner = by_id[owner_of(etcd, prefix, topic)]
            t0 = time.perf_counter()
            owner.stop()
            producer.send(b"after")
            times.append(time.perf_counter() - t0)
            assert by_id[owner_of(etcd, prefix, topic)] is not owner
            owner.start()
    finally:
        client.close()
    return times


def summary(xs):
    return {"median_ms": round(statistics.median(xs) * 1000, 1),
            "max_ms": round(max(xs) * 1000, 1), "rounds": len(xs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    import tempfile
    etcd = Etcd()
    prefix = "/bench-move"
    started = []
    try:
        env = {"LEDGERLAKE_LAKE__ENABLED": "false"}
        nodes = []
        for _ in range(2):
            d = tempfile.mkdtemp(prefix="ll-move-")
            node = Service(args.bin, d, env=env, args=[
                "--metadata-url", etcd.url(prefix), "--bookie-addr", f"127.0.0.1:{_free_port()}"])
            node.start()
            started.append(node)
            nodes.append(node)
        topic = "persistent://public/default/bench-move"
        by_id = {f"127.0.0.1:{n.http_port}": n for n in nodes}

        def flip():
            owner = by_id[owner_of(etcd, prefix, topic)]
            return owner, [n for n in nodes if n is not owner][0]
        moved, moved_admin = rounds(nodes, topic, args.rounds, flip)
        assert owner_of(etcd, prefix, topic) is not None
        stopped = stop_rounds(nodes, etcd, prefix, "persistent://public/default/bench-stop",
                              max(3, args.rounds // 2))

        single = Service(args.bin, tempfile.mkdtemp(prefix="ll-move1-"), env=env)
        single.start()
        started.append(single)
        same, same_admin = rounds([single], "persistent://public/default/bench-same", args.rounds,
                                  lambda: (single, None))
    finally:
        for s in started:
            s.stop()
        etcd.stop()
    out = {
        "binary": args.bin,
        "planned_move_two_nodes": summary(moved),
        "planned_move_admin_call": summary(moved_admin),
        "unload_reload_one_node": summary(same),
        "unload_reload_admin_call": summary(same_admin),
        "graceful_stop_two_nodes": summary(stopped),
    }
    print(json.dumps(out, indent=2))
    print(f"| planned move (unload → first ack on the other node) | "
          f"{out['planned_move_two_nodes']['median_ms']} ms median, "
          f"{out['planned_move_two_nodes']['max_ms']} ms max |")
    print(f"| unload → first ack, one node (comparison) | "
          f"{out['unload_reload_one_node']['median_ms']} ms median, "
          f"{out['unload_reload_one_node']['max_ms']} ms max |")
    print(f"| graceful stop of the owner → first ack on the other node | "
          f"{out['graceful_stop_two_nodes']['median_ms']} ms median, "
          f"{out['graceful_stop_two_nodes']['max_ms']} ms max |")


if __name__ == "__main__":
    main()
