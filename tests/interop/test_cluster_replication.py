"""Quorum-replicated ledgers (issue 19, slice 3): three nodes on one etcd, the namespace's
persistence policy 3/3/2. Every ledger is written to three bookies and acknowledged by two;
a replica killed mid-stream does not stop the producer; after the writer's node is killed too,
the one node left serves every acknowledged message from its own copies."""
import json
import os
import signal
import urllib.error
import urllib.request
import uuid

import pulsar

from conftest import eventually
from test_cluster_ownership import _cluster as start_cluster, _owners

def _http(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, method=method, data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            return r.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _cluster(etcd, make_service, name, n=3):
    """`n` started nodes on one etcd prefix, each with a bookie listener; (prefix, nodes)."""
    prefix = f"/{name}-{uuid.uuid4().hex[:6]}"
    return prefix, start_cluster(etcd, make_service, prefix, n=n)


def _ledgers(etcd, prefix):
    """Every ledger record in etcd, by id."""
    out = {}
    for key, value in etcd.items(f"{prefix}/ledgers/").items():
        assert value[0] == 1, "ledger records are format 1"
        record = json.loads(value[1:])
        out[record["id"]] = record
    return out


def _owner(etcd, prefix, topic, nodes):
    owner = _owners(etcd, prefix).get(topic)
    return [n for n in nodes if f"127.0.0.1:{n.http_port}" == owner]


def _bookie_id(node):
    with open(os.path.join(node.data_dir, "data", "ledger", "bookie-id")) as f:
        return f.read().split()[-1]


def _read_all(client, topic, n):
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    try:
        while len(got) < n:
            got.append(reader.read_next(timeout_millis=30000).data().decode())
    finally:
        reader.close()
    return got


def test_ledgers_survive_losing_a_replica_and_then_the_writer(etcd, make_service):
    prefix, nodes = _cluster(etcd, make_service, "repl")
    ns = f"{nodes[0].http}/admin/v2/namespaces/public/default/persistence"
    # 3/3/2 is taken and read back (striping: test_cluster_striping.py).
    policy = {"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 3, "bookkeeperAckQuorum": 2,
              "managedLedgerMaxMarkDeleteRate": 0.0}
    assert _http("POST", ns, policy)[0] == 204
    assert _http("GET", ns) == (200, policy)

    topic = f"persistent://public/default/repl-{uuid.uuid4().hex[:6]}"
    path = "/admin/v2/persistent/public/default/" + topic.rsplit("/", 1)[1]
    client = pulsar.Client("pulsar://" + ",".join(f"127.0.0.1:{n.pulsar_port}" for n in nodes),
                           operation_timeout_seconds=60)
    try:
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=60000)
        for i in range(100):
            producer.send(f"m{i}".encode())
        (writer,) = _owner(etcd, prefix, topic, nodes)
        others = [n for n in nodes if n is not writer]
        ledgers = _ledgers(etcd, prefix)
        first = max(ledgers.values(), key=lambda r: r["id"])
        assert first["bookie"] == _bookie_id(writer)
        assert sorted(first["replicas"]) == sorted(_bookie_id(n) for n in others)
        assert first["ack_quorum"] == 2

        # A replica dies: acknowledgements go on with the writer and the other replica.
        others[0].stop(signal.SIGKILL)
        for i in range(100, 200):
            producer.send(f"m{i}".encode())
        assert _read_all(client, topic, 200) == [f"m{i}" for i in range(200)]
        # No bookie is left outside the ensemble to take the dead one's place: it rolled.
        assert _metric(writer, 'ledgerlake_ensemble_changes_total{outcome="not_replaced"}') >= 1
        assert _metric(writer, 'ledgerlake_ensemble_changes_total{outcome="replaced"}') == 0

        # Seal everything, then lose the writer: the last node serves every message from its
        # own copies (nothing was offloaded).
        status, body = _http("PUT", f"{writer.http}{path}/unload")
        assert status == 204, body
        survivor = others[1]
        sealed = [r for r in _ledgers(etcd, prefix).values() if r.get("seal")
                  and r["seal"]["entry_count"] > 0]
        assert sum(r["seal"]["entry_count"] for r in sealed) == 200
        assert all(_bookie_id(survivor) in r["replicas"] for r in sealed), sealed

        def copies_sealed():
            reps = os.listdir(os.path.join(survivor.data_dir, "data", "ledger", "replicas"))
            assert {f"{r['id']}.rep" for r in sealed} <= set(reps), reps
        eventually(copies_sealed, timeout=30)
        producer.close()
        writer.stop(signal.SIGKILL)
        alone = pulsar.Client(survivor.url, operation_timeout_seconds=60)
        try:
            def all_read():
                assert _read_all(alone, topic, 200) == [f"m{i}" for i in range(200)]
            eventually(all_read, timeout=60, interval=2)
        finally:
            alone.close()
    finally:
        client.close()


# 10 rounds in the test command, 50 in the long mode (LL_SOAK=1); LL_KILL_ROUNDS overrides both.
ROUNDS = int(os.environ.get("LL_KILL_ROUNDS")
             or (50 if os.environ.get("LL_SOAK", "0") not in ("", "0") else 10))


def test_killing_the_writer_loses_no_acknowledged_message(etcd, make_service):
    """SIGKILL the owner (and writer) of a busy topic, round after round (ROUNDS: 10, 50 with
    LL_SOAK=1): the next owner fences the open ledger on its replicas, ends it where its ack
    quorum guarantees every acknowledged entry, and the producer goes on there; with
    deduplication on, every acknowledged message is read exactly once, in order."""
    prefix, nodes = _cluster(etcd, make_service, "kill")
    dedup = f"{nodes[0].http}/admin/v2/namespaces/public/default/deduplication"
    assert _http("POST", dedup, True)[0] == 204
    topic = f"persistent://public/default/kill-{uuid.uuid4().hex[:6]}"
    client = pulsar.Client("pulsar://" + ",".join(f"127.0.0.1:{n.pulsar_port}" for n in nodes),
                           operation_timeout_seconds=60)
    sent = []
    try:
        producer = client.create_producer(topic, producer_name="killed-rounds",
                                          batching_enabled=False, send_timeout_millis=60000)
        for round_ in range(ROUNDS):
            for i in range(20):
                body = f"r{round_}-{i}"
                producer.send(body.encode())
                sent.append(body)
            (owner,) = _owner(etcd, prefix, topic, nodes)
            owner.stop(signal.SIGKILL)
            # Acknowledged after the kill: the next owner took the ledger over.
            body = f"r{round_}-after"
            producer.send(body.encode())
            sent.append(body)
            owner.start()
        got = _read_all(client, topic, len(sent))
        assert got == sent
        # Nothing more than what was sent: a reader that waits finds no further message.
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        try:
            seen = [reader.read_next(timeout_millis=30000).data().decode() for _ in sent]
            assert seen == sent
            assert not reader.has_message_available()
        finally:
            reader.close()
        taken = 0
        for n in nodes:
            with urllib.request.urlopen(f"{n.http}/metrics", timeout=30) as r:
                for line in r.read().decode().splitlines():
                    if line.startswith("ledgerlake_ledgers_taken_over_total "):
                        taken += float(line.split()[1])
        assert taken >= 1, "the killed writers' open ledgers were taken over"
    finally:
        client.close()


def send_numbered(producer, sent, label, n):
    """Sends `label-0` … `label-(n-1)` synchronously, appending each to `sent`."""
    for i in range(n):
        sent.append(f"{label}-{i}")
        producer.send(sent[-1].encode())


def send_to_an_owner(etcd, prefix, nodes, topic, label, token=None):
    """A client of every node (with `token`), a producer of `topic` that sent `label-0` …
    `label-99` synchronously, those bodies, and the node that owns the topic."""
    auth = {"authentication": pulsar.AuthenticationToken(token)} if token else {}
    client = pulsar.Client("pulsar://" + ",".join(f"127.0.0.1:{n.pulsar_port}" for n in nodes),
                           operation_timeout_seconds=60, **auth)
    try:
        producer = client.create_producer(topic, batching_enabled=False,
                                          send_timeout_millis=60000)
        sent = []
        send_numbered(producer, sent, label, 100)
        (owner,) = _owner(etcd, prefix, topic, nodes)
    except BaseException:
        client.close()
        raise
    return client, producer, sent, owner


def kill_owner_and_read_all(etcd, prefix, client, producer, topic, owner, sent):
    """SIGKILLs `owner` (the topic's owner, id `host:http_port`), sends 20 more, checks another
    node owns the topic and that every message in `sent` is read once, in order, from
    earliest."""
    owner_id = f"127.0.0.1:{owner.http_port}"
    owner.stop(signal.SIGKILL)
    send_numbered(producer, sent, "after", 20)
    assert _owners(etcd, prefix)[topic] != owner_id
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    try:
        got = [reader.read_next(timeout_millis=30000).data().decode() for _ in sent]
    finally:
        reader.close()
    assert got == sent


def _metric(node, name):
    with urllib.request.urlopen(f"{node.http}/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


def test_a_killed_owner_is_found_gone_before_its_lease_runs_out(etcd, make_service):
    """With a session TTL of 120 s, the lease cannot be what moves the topic: the survivors
    find the killed owner's listeners refusing, end its session, and the next send (30 s
    timeout) is acknowledged by the new owner. Every acknowledged message is read once."""
    prefix = f"/gone-{uuid.uuid4().hex[:6]}"
    nodes = start_cluster(etcd, make_service, prefix, n=3,
                          env={"LEDGERLAKE_METADATA__SESSION_TTL": "120s"})
    topic = f"persistent://public/default/gone-{uuid.uuid4().hex[:6]}"
    client = pulsar.Client("pulsar://" + ",".join(f"127.0.0.1:{n.pulsar_port}" for n in nodes),
                           operation_timeout_seconds=30)
    sent = []
    try:
        producer = client.create_producer(topic, batching_enabled=False,
                                          send_timeout_millis=30000)
        send_numbered(producer, sent, "before", 50)
        (owner,) = _owner(etcd, prefix, topic, nodes)
        owner.stop(signal.SIGKILL)
        send_numbered(producer, sent, "after", 50)
        survivors = [n for n in nodes if n is not owner]
        (new_owner,) = _owner(etcd, prefix, topic, survivors)
        assert new_owner is not owner
        members = etcd.items(f"{prefix}/cluster/nodes/")
        assert not any(k.endswith(f"127.0.0.1:{owner.http_port}") for k in members), \
            "the killed node's registration is gone long before its lease could expire"
        assert sum(_metric(n, "ledgerlake_peer_sessions_ended_total") for n in survivors) >= 1
        assert _read_all(client, topic, len(sent)) == sent
    finally:
        client.close()


def test_a_cluster_killed_at_once_seals_what_it_left_open_without_a_client(etcd, make_service):
    """Every node SIGKILLed at once with replicated ledgers open (a power cut), then started
    again one after another. Each bookie is live again, so no node takes over another's open
    ledger as orphaned; each node, at start, takes over the topics its own previous process
    left open, with no client asking. Every such ledger ends sealed, and every acknowledged
    message is read once, in order."""
    prefix, nodes = _cluster(etcd, make_service, "cut")
    topics = [f"persistent://public/default/cut-{uuid.uuid4().hex[:6]}-{i}" for i in range(6)]
    client = pulsar.Client("pulsar://" + ",".join(f"127.0.0.1:{n.pulsar_port}" for n in nodes),
                           operation_timeout_seconds=60)
    sent = {}
    try:
        for t in topics:
            producer = client.create_producer(t, batching_enabled=False,
                                              send_timeout_millis=60000)
            send_numbered(producer, sent.setdefault(t, []), "m", 20)
        left_open = {r["id"] for r in _ledgers(etcd, prefix).values()
                     if r["state"] == 1 and r["replicas"]}
        assert len(left_open) == len(topics), _ledgers(etcd, prefix)
        writers = [r["bookie"] for r in _ledgers(etcd, prefix).values() if r["id"] in left_open]
    finally:
        client.close()
    for n in nodes:
        n.stop(signal.SIGKILL)
    # The node writing the most of them starts first, alone: no other node runs to see its
    # old registration go, so only its own start can seal what it left open.
    nodes.sort(key=lambda n: -writers.count(_bookie_id(n)))
    assert writers.count(_bookie_id(nodes[0])) >= 1
    for n in nodes:
        n.start()

    def sealed():
        still = [r for r in _ledgers(etcd, prefix).values()
                 if r["id"] in left_open and r["state"] == 1]
        assert not still, still
    eventually(sealed, timeout=60, interval=1)
    client = pulsar.Client("pulsar://" + ",".join(f"127.0.0.1:{n.pulsar_port}" for n in nodes),
                           operation_timeout_seconds=60)
    try:
        for t in topics:
            assert _read_all(client, t, 20) == sent[t]
    finally:
        client.close()
