"""Autorecovery (issue 19, slice 6): three nodes on one etcd with the default 3/3/2
replication. One node is SIGKILLed, its data directory wiped, and it comes back as a new
bookie; once the old bookie is lost (past `autorecovery.delay`), every sealed ledger gets its
three copies back, and each copy is read back whole from each bookie over the bookie protocol
itself (independently of the service's readers) and found identical."""
import json
import os
import shutil
import signal
import urllib.request
import uuid

import pulsar

from bookiewire import served
from conftest import _free_port, eventually
from test_cluster_replication import _bookie_id, _http, _ledgers, _owner, _read_all

ENV = {"LEDGERLAKE_METADATA__SESSION_TTL": "3s", "LEDGERLAKE_LAKE__ENABLED": "false",
       "LEDGERLAKE_AUTORECOVERY__DELAY": "3s"}


def _read_copy(addr, topic, ledger, count):
    """Entries 0..count-1 of `ledger` as the bookie at `addr` serves them: (publish time,
    payload) pairs; every one of them must be there."""
    held = served(addr, topic, ledger, count)
    assert sorted(held) == list(range(count)), (addr, ledger, sorted(held)[:12])
    return [held[e] for e in range(count)]


def _members(etcd, prefix):
    """bookie id → bookie address of the live nodes, from their records in etcd."""
    out = {}
    for _, value in etcd.items(f"{prefix}/cluster/nodes/").items():
        record = json.loads(value[1:])
        out[record["bookie"]] = record["bookieAddr"]
    return out


def _status(node):
    with urllib.request.urlopen(f"{node.http}/admin/v2/autorecovery", timeout=30) as r:
        return json.loads(r.read())


def _metric(nodes, name):
    total = 0.0
    for n in nodes:
        with urllib.request.urlopen(f"{n.http}/metrics", timeout=30) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    total += float(line.split()[1])
    return total


def _unload(etcd, prefix, nodes, topic):
    """Seals the topic's open ledger: its owner unloads it."""
    (owner,) = _owner(etcd, prefix, topic, nodes)
    path = "/admin/v2/persistent/public/default/" + topic.rsplit("/", 1)[1]
    status, body = _http("PUT", f"{owner.http}{path}/unload")
    assert status == 204, body


def test_a_wiped_node_comes_back_and_every_sealed_ledger_gets_its_copies_back(etcd,
                                                                             make_service):
    prefix = f"/autorec-{uuid.uuid4().hex[:6]}"
    nodes = [make_service(env=ENV, args=["--metadata-url", etcd.url(prefix),
                                         "--bookie-addr", f"127.0.0.1:{_free_port()}"])
             for _ in range(3)]
    for n in nodes:
        n.start()
    client = pulsar.Client("pulsar://" + ",".join(f"127.0.0.1:{n.pulsar_port}" for n in nodes),
                           operation_timeout_seconds=60)
    try:
        topics, sent, producers, owners = [], {}, {}, {}

        def fill(topic):
            topics.append(topic)
            sent[topic] = [f"{topic[-6:]}-{i}" for i in range(60)]
            producers[topic] = client.create_producer(topic, batching_enabled=False,
                                                      send_timeout_millis=60000)
            for body in sent[topic]:
                producers[topic].send(body.encode())
            owners[topic] = _owner(etcd, prefix, topic, nodes)[0]

        # The busy topic goes on being written while the victim is gone; the victim writes
        # another topic's ledger (so a lost writer's place is taken).
        busy = f"persistent://public/default/autorec-busy-{uuid.uuid4().hex[:6]}"
        fill(busy)
        for i in range(20):
            fill(f"persistent://public/default/autorec-{i}-{uuid.uuid4().hex[:6]}")
            if len(topics) >= 4 and any(owners[t] is not owners[busy] for t in topics):
                break
        victim = next(owners[t] for t in topics if owners[t] is not owners[busy])
        written_by_victim = [t for t in topics if owners[t] is victim]
        for t in topics:
            if t != busy:
                producers[t].close()
                _unload(etcd, prefix, nodes, t)
        before = {r["id"]: r for r in _ledgers(etcd, prefix).values()
                  if r.get("seal") and r["seal"]["entry_count"] > 0}
        assert all(len({r["bookie"], *r["replicas"]}) == 3 for r in before.values()), before
        assert all(r.get("write_quorum") == 3 for r in before.values()), before

        # The victim is lost for good: killed, its disk wiped. Meanwhile the busy topic's
        # ledger loses its replica there, rolls, and its next ledger has two copies only.
        old = _bookie_id(victim)
        victim.stop(signal.SIGKILL)
        shutil.rmtree(os.path.join(victim.data_dir, "data"))
        more = [f"{busy[-6:]}-more-{i}" for i in range(30)]
        for body in more:
            producers[busy].send(body.encode())
        sent[busy] += more
        producers[busy].close()
        _unload(etcd, prefix, nodes, busy)
        sealed = {r["id"]: r for r in _ledgers(etcd, prefix).values()
                  if r.get("seal") and r["seal"]["entry_count"] > 0}
        assert sum(r["seal"]["entry_count"] for r in sealed.values()) == 60 * len(topics) + 30
        short = [r for r in sealed.values()
                 if old not in [r["bookie"], *r["replicas"]] and len(r["replicas"]) < 2]
        assert short, "a ledger sealed with fewer copies than its write quorum"
        # It comes back as a new bookie.
        victim.start()
        new = _bookie_id(victim)
        assert new != old

        def restored():
            records = _ledgers(etcd, prefix)
            live = _members(etcd, prefix)
            for lid in sealed:
                r = records[lid]
                bookies = [r["bookie"], *r["replicas"]]
                assert old not in bookies and len(set(bookies)) == 3, r
                assert set(bookies) <= set(live), (bookies, live)
            for n in nodes:
                assert _status(n)["underReplicated"] == [], _status(n)
        eventually(restored, timeout=120, interval=1)

        # Every copy of every sealed ledger, read from its own bookie, is whole and the same.
        records = _ledgers(etcd, prefix)
        live = _members(etcd, prefix)
        topic_of = {}
        for value in etcd.items(f"{prefix}/topics/id/").values():
            record = json.loads(value[1:])
            topic_of[record["id"]] = record["name"]
        for lid in sealed:
            r = records[lid]
            count = r["seal"]["entry_count"]
            copies = [_read_copy(live[b], topic_of[r["topic_id"]], lid, count)
                      for b in [r["bookie"], *r["replicas"]]]
            assert all(c == copies[0] for c in copies), lid
            assert sum(len(p) for _, p in copies[0]) == r["seal"]["size_bytes"]
            # A lost writer's place (and its offload) went to the new copy.
            if before.get(lid, {}).get("bookie") == old:
                assert r["bookie"] == new, r
        assert written_by_victim
        assert any(before[lid]["bookie"] == old for lid in before)
        copied = sum(_status(n)["copiesMade"] for n in nodes)
        assert _status(victim)["copiesMade"] >= len(sealed), "the new bookie took the copies"
        assert _metric(nodes, "ledgerlake_ledgers_rereplicated_total") == copied
        assert _metric(nodes, "ledgerlake_ledgers_under_replicated") == 0

        # And consumers read every message, in order, from earliest.
        for t in topics:
            assert _read_all(client, t, len(sent[t])) == sent[t]
    finally:
        client.close()
