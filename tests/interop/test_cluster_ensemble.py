"""Ensemble changes (issue 19, slice 3; ADR 0016): four nodes on one etcd, the namespace's
persistence policy 3/3/2. A replica killed while its ledger takes writes is replaced in that
ledger's ensemble by the fourth node: the ledger does not roll, the new bookie gets every
earlier entry from the writer and every later one, and it alone can serve the whole ledger. When the bookie put in its place fails while it
catches up, another one takes the place."""
import os
import signal
import uuid

import pulsar

from conftest import eventually
from test_cluster_ownership import _cluster as start_cluster
from test_cluster_replication import (_bookie_id, _cluster, _http, _ledgers, _metric, _owner,
                                      _read_all)

# LedgerState discriminants as etcd stores them.
OPEN, SEALED = 1, 2


def _replaced(etcd, prefix, ledger, swap, writer):
    """`ledger` (its record when it was opened) is still open, its topic has no other ledger,
    its record lists `swap[1]` in `swap[0]`'s place, and its writer counted one replacement."""
    old, new = swap
    after = _ledgers(etcd, prefix)
    now = after[ledger["id"]]
    assert now["state"] == OPEN, "the ledger did not roll"
    assert [i for i, r in after.items() if r["topic_id"] == ledger["topic_id"]] \
        == [ledger["id"]], "no other ledger was opened for the topic"
    assert now["replicas"] == [_bookie_id(new) if b == _bookie_id(old) else b
                               for b in ledger["replicas"]], now
    assert _metric(writer, 'ledgerlake_ensemble_changes_total{outcome="replaced"}') == 1


def test_a_replica_killed_mid_ledger_is_replaced_in_its_ensemble(etcd, make_service):
    prefix, nodes = _cluster(etcd, make_service, "ensemble", n=4)
    ns = f"{nodes[0].http}/admin/v2/namespaces/public/default/persistence"
    assert _http("POST", ns, {"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 3,
                              "bookkeeperAckQuorum": 2,
                              "managedLedgerMaxMarkDeleteRate": 0.0})[0] == 204
    topic = f"persistent://public/default/ensemble-{uuid.uuid4().hex[:6]}"
    path = "/admin/v2/persistent/public/default/" + topic.rsplit("/", 1)[1]
    client = pulsar.Client("pulsar://" + ",".join(f"127.0.0.1:{n.pulsar_port}" for n in nodes),
                           operation_timeout_seconds=60)
    sent = [f"m{i}" for i in range(300)]
    try:
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=60000)
        for body in sent[:150]:
            producer.send(body.encode())
        (writer,) = _owner(etcd, prefix, topic, nodes)
        before = {i: r for i, r in _ledgers(etcd, prefix).items() if r["state"] == OPEN}
        assert len(before) == 1, before
        (ledger,) = before.values()
        assert ledger["bookie"] == _bookie_id(writer)
        by_bookie = {_bookie_id(n): n for n in nodes}
        killed, kept = (by_bookie[b] for b in ledger["replicas"])
        (spare,) = [n for n in nodes if n not in (writer, killed, kept)]

        # A replica dies mid-ledger: the producer goes on, and the same ledger, still open,
        # lists the spare in the dead replica's place.
        killed.stop(signal.SIGKILL)
        for body in sent[150:]:
            producer.send(body.encode())
        # The change runs in the background of the writes: the record first, then the
        # catch-up, then the metric.
        eventually(lambda: _replaced(etcd, prefix, ledger, (killed, spare), writer), timeout=30)
        assert _read_all(client, topic, len(sent)) == sent

        # Sealed, the ledger lists the spare as a complete copy.
        status, body = _http("PUT", f"{writer.http}{path}/unload")
        assert status == 204, body
        producer.close()

        def sealed():
            record = _ledgers(etcd, prefix)[ledger["id"]]
            assert record["state"] == SEALED and record["seal"]["entry_count"] == len(sent)
            assert _bookie_id(spare) in record["replicas"], record
        eventually(sealed, timeout=30)

        # The spare alone serves the whole ledger, the entries it got from the writer's copy
        # included: every other node is gone.
        writer.stop(signal.SIGKILL)
        kept.stop(signal.SIGKILL)
        alone = pulsar.Client(spare.url, operation_timeout_seconds=60)
        try:
            def all_read():
                assert _read_all(alone, topic, len(sent)) == sent
            eventually(all_read, timeout=60, interval=2)
        finally:
            alone.close()
    finally:
        client.close()


def test_a_replacement_that_fails_while_catching_up_is_replaced_in_turn(etcd, make_service):
    """The only spare is frozen (SIGSTOP: it is still listed, takes connections and answers
    nothing) when a replica dies: the writer puts it in the dead replica's place, its
    catch-up fails, and a node started meanwhile takes the place in the same ledger."""
    prefix, nodes = _cluster(etcd, make_service, "ensemble-again", n=4)
    ns = f"{nodes[0].http}/admin/v2/namespaces/public/default/persistence"
    assert _http("POST", ns, {"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 3,
                              "bookkeeperAckQuorum": 2})[0] == 204
    topic = f"persistent://public/default/again-{uuid.uuid4().hex[:6]}"
    client = pulsar.Client("pulsar://" + ",".join(f"127.0.0.1:{n.pulsar_port}" for n in nodes),
                           operation_timeout_seconds=60)
    sent = [f"m{i}" for i in range(300)]
    frozen = None
    try:
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=60000)
        for body in sent[:150]:
            producer.send(body.encode())
        (writer,) = _owner(etcd, prefix, topic, nodes)
        (ledger,) = [r for r in _ledgers(etcd, prefix).values() if r["state"] == OPEN]
        by_bookie = {_bookie_id(n): n for n in nodes}
        killed, kept = (by_bookie[b] for b in ledger["replicas"])
        (frozen,) = [n for n in nodes if n not in (writer, killed, kept)]

        os.kill(frozen.proc.pid, signal.SIGSTOP)
        killed.stop(signal.SIGKILL)
        # These sends meet the dead replica: the frozen node, the only other bookie listed,
        # is put in its place.
        for body in sent[150:160]:
            producer.send(body.encode())
        (late,) = start_cluster(etcd, make_service, prefix, n=1)
        for body in sent[160:]:
            producer.send(body.encode())

        eventually(lambda: _replaced(etcd, prefix, ledger, (killed, late), writer),
                   timeout=90, interval=1)
        with open(writer.log_path) as f:
            assert "failed; trying another" in f.read(), "the frozen node was not tried first"
        assert _metric(writer, 'ledgerlake_ensemble_changes_total{outcome="not_replaced"}') == 0
        # Read through the writer: a lookup on the frozen node would wait forever.
        reading = pulsar.Client(writer.url, operation_timeout_seconds=60)
        try:
            assert _read_all(reading, topic, len(sent)) == sent
        finally:
            reading.close()
    finally:
        client.close()
        if frozen is not None and frozen.proc is not None:
            os.kill(frozen.proc.pid, signal.SIGCONT)
            frozen.stop(signal.SIGKILL)
