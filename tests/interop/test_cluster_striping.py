"""Striped ledgers (issue 19, ADR 0017): four nodes on one etcd, the namespace's persistence
policy 4/3/2. Each entry goes to the writer's bookie and to two of the three others in turn,
so each replica holds two thirds of a ledger, read back over the bookie protocol itself. The
writer's node is SIGKILLed: the next owner seals the ledger from the stripes (no bookie holds
it whole), the producer goes on, and every acknowledged message is read back from earliest,
merged from the stripes, and a seek by publish time on the next owner finds an entry its
own stripe lacks. A fifth node joins: autorecovery rebuilds a whole copy there, read
back from that bookie and found identical to what was sent."""
import signal
import uuid

import pulsar

from bookiewire import served
from conftest import _free_port, eventually
from test_cluster_autorecovery import _members, _status
from test_cluster_replication import _bookie_id, _http, _ledgers, _owner, _read_all

ENV = {"LEDGERLAKE_METADATA__SESSION_TTL": "3s", "LEDGERLAKE_LAKE__ENABLED": "false",
       "LEDGERLAKE_AUTORECOVERY__DELAY": "3s"}
VACANT = "-"


def _node(etcd, make_service, prefix, env=ENV):
    return make_service(env=env, args=["--metadata-url", etcd.url(prefix),
                                       "--bookie-addr", f"127.0.0.1:{_free_port()}"])


def _striped(etcd, make_service, prefix, env, count, policy):
    """`count` nodes on one etcd prefix, the default namespace's persistence policy set to
    `policy`: the nodes, that policy's admin URL, and a client with all of them in its
    service URL."""
    nodes = [_node(etcd, make_service, prefix, env) for _ in range(count)]
    for n in nodes:
        n.start()
    ns = f"{nodes[0].http}/admin/v2/namespaces/public/default/persistence"
    status, body = _http("POST", ns, policy)
    assert status == 204, body
    client = pulsar.Client("pulsar://" + ",".join(f"127.0.0.1:{n.pulsar_port}" for n in nodes),
                           operation_timeout_seconds=60)
    return nodes, ns, client


def _publish_times(client, topic, n):
    """The publish times of the first `n` messages of `topic`, in order."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    try:
        return [reader.read_next(timeout_millis=30000).publish_timestamp() for _ in range(n)]
    finally:
        reader.close()


def test_a_striped_ledger_survives_losing_its_writer_and_gets_a_whole_copy_back(etcd,
                                                                              make_service):
    prefix = f"/striped-{uuid.uuid4().hex[:6]}"
    policy = {"bookkeeperEnsemble": 4, "bookkeeperWriteQuorum": 3, "bookkeeperAckQuorum": 2,
              "managedLedgerMaxMarkDeleteRate": 0.0}
    nodes, ns, client = _striped(etcd, make_service, prefix, ENV, 4, policy)
    # A write quorum of 1 below the ensemble would leave the replicas nothing: refused, and
    # the policy in force stays.
    status, body = _http("POST", ns, {"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 1,
                                      "bookkeeperAckQuorum": 1})
    assert status == 400, body
    assert _http("GET", ns) == (200, policy)

    topic = f"persistent://public/default/striped-{uuid.uuid4().hex[:6]}"
    spare = None
    try:
        producer = client.create_producer(topic, batching_enabled=False,
                                          send_timeout_millis=60000)
        sent = [f"m{i}" for i in range(300)]
        for body in sent:
            producer.send(body.encode())
        (writer,) = _owner(etcd, prefix, topic, nodes)
        others = [n for n in nodes if n is not writer]
        first = max(_ledgers(etcd, prefix).values(), key=lambda r: r["id"])
        assert first["bookie"] == _bookie_id(writer)
        assert sorted(first["replicas"]) == sorted(_bookie_id(n) for n in others)
        assert (first["stripe_width"], first["ack_quorum"]) == (2, 2), first

        # The writer's node dies with the ledger open; the producer goes on on the next owner.
        writer.stop(signal.SIGKILL)
        more = [f"m{i}" for i in range(300, 400)]
        for body in more:
            producer.send(body.encode())
        sent += more
        assert _read_all(client, topic, 400) == sent

        # The next owner sealed the ledger from the stripes: every acknowledged entry, every
        # replica in its place, and no bookie holding it whole.
        sealed = _ledgers(etcd, prefix)[first["id"]]
        assert sealed.get("seal"), sealed
        assert sealed["seal"]["entry_count"] == 300
        assert (sealed["bookie"], sealed["replicas"]) == (VACANT, first["replicas"]), sealed
        # Each replica holds exactly its stripe: entry e goes to the two replica places from
        # e mod 3 on, so place p holds the entries with e mod 3 in {p, p - 1}.
        live = _members(etcd, prefix)
        for place, bookie in enumerate(sealed["replicas"]):
            held = served(live[bookie], topic, sealed["id"], 300)
            want = [e for e in range(300) if e % 3 in (place, (place - 1) % 3)]
            assert sorted(held) == want, (place, sorted(held)[:12])
            assert all(held[e][1].endswith(sent[e].encode()) for e in held)

        # A seek by publish time on the next owner, to an entry its own stripe lacks: the
        # ledger is searched by reading entries (merged from the stripes), never by the
        # stripe's index, which has no publish time for the entries other replicas hold.
        (owner,) = _owner(etcd, prefix, topic, others)
        place = sealed["replicas"].index(_bookie_id(owner))
        times = _publish_times(client, topic, 300)
        target = next(e for e in range(100, 300)
                      if e % 3 == (place + 1) % 3 and times[e - 1] < times[e])
        seeker = client.subscribe(topic, f"seek-{uuid.uuid4().hex[:6]}",
                                  initial_position=pulsar.InitialPosition.Earliest)
        seeker.seek(times[target])
        assert seeker.receive(timeout_millis=30000).data().decode() == sent[target]
        seeker.close()

        # A fifth node joins: autorecovery rebuilds the whole copy there (the writer's place
        # is filled first), checked against the seal the takeover computed.
        spare = _node(etcd, make_service, prefix)
        spare.start()
        spare_id = _bookie_id(spare)

        def rebuilt():
            r = _ledgers(etcd, prefix)[first["id"]]
            assert (r["bookie"], r["replicas"]) == (spare_id, first["replicas"]), r
            # Checked against the seal; its last segment is the new bookie's journal's.
            def same(seal):
                return {k: v for k, v in seal.items() if k != "last_segment"}
            assert same(r["seal"]) == same(sealed["seal"])
        eventually(rebuilt, timeout=120, interval=1)
        copy = served(_members(etcd, prefix)[spare_id], topic, sealed["id"], 300)
        assert sorted(copy) == list(range(300))
        assert all(copy[e][1].endswith(sent[e].encode()) for e in copy)
        assert sum(len(b) for _, b in copy.values()) == sealed["seal"]["size_bytes"]

        def audited():
            for n in [*others, spare]:
                assert all(u["ledger"] != first["id"] for u in _status(n)["underReplicated"])
        eventually(audited, timeout=60, interval=1)
        producer.close()
    finally:
        client.close()
    # Read again through a new client: every message once, in order.
    again = pulsar.Client(others[0].url, operation_timeout_seconds=60)
    try:
        assert _read_all(again, topic, 400) == sent
    finally:
        again.close()
    if spare is not None:
        spare.stop()


def test_with_no_bookie_to_rebuild_on_the_first_replica_offloads_the_ledger(etcd, make_service,
                                                                            s3_server, postgres):
    """Three nodes, 3/2/2, sharing one lake. The writer's node is SIGKILLed: no node is left
    outside the ensemble to rebuild a whole copy on, so the ledger stays striped, read by
    merging the stripes; the first replica's node offloads it from the stripes, and the lake
    then holds every acknowledged message once, as consumers replay it."""
    from pyiceberg.catalog.sql import SqlCatalog
    from lake import lake_rows, read_all, stats

    uri = postgres.create_database(f"cat_{uuid.uuid4().hex[:8]}")
    prefix = f"striped-lake-{uuid.uuid4().hex[:6]}"
    env = dict(s3_server.service_env(prefix), LEDGERLAKE_LAKE__CATALOG__URI=uri,
               LEDGERLAKE_METADATA__SESSION_TTL="3s", LEDGERLAKE_AUTORECOVERY__DELAY="3s")
    nodes, _, client = _striped(etcd, make_service, f"/{prefix}", env, 3,
                                {"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 2,
                                 "bookkeeperAckQuorum": 2})
    name = f"striped-lake-{uuid.uuid4().hex[:6]}"
    topic = f"persistent://public/default/{name}"
    try:
        producer = client.create_producer(topic, batching_enabled=False,
                                          send_timeout_millis=60000)
        sent = [f"s{i}" for i in range(200)]
        for body in sent:
            producer.send(body.encode())
        (writer,) = _owner(etcd, f"/{prefix}", topic, nodes)
        first = max(_ledgers(etcd, f"/{prefix}").values(), key=lambda r: r["id"])
        assert first["stripe_width"] == 1 and len(first["replicas"]) == 2, first
        writer.stop(signal.SIGKILL)
        more = [f"s{i}" for i in range(200, 300)]
        for body in more:
            producer.send(body.encode())
        sent += more
        producer.close()
        sealed = _ledgers(etcd, f"/{prefix}")[first["id"]]
        assert (sealed["bookie"], sealed["seal"]["entry_count"]) == (VACANT, 200), sealed
        survivors = [n for n in nodes if n is not writer]
        (owner,) = _owner(etcd, f"/{prefix}", topic, survivors)
        path = "/admin/v2/persistent/public/default/" + name
        status, body = _http("PUT", f"{owner.http}{path}/offload")
        assert status == 200, body

        # The offload request seals the open ledger too: every ledger with entries reaches
        # the lake (the striped one by the first replica's node), and the table then holds
        # every message once, with the ids consumers saw.
        def offloaded():
            records = _ledgers(etcd, f"/{prefix}")
            assert records[first["id"]]["state"] >= 3, records[first["id"]]
            held = [r for r in records.values() if r["state"] != 1 and r.get("seal")
                    and r["seal"]["entry_count"]]
            assert sum(r["seal"]["entry_count"] for r in held) == 300, records
            assert all(r["state"] >= 3 for r in held), held
        eventually(offloaded, timeout=120, interval=1)
        st = stats(owner, topic)
        catalog = SqlCatalog(st["lake"]["catalog"],
                             uri=uri.replace("postgres://", "postgresql+psycopg2://"),
                             warehouse=f"s3://warehouse/{prefix}", **s3_server.pyiceberg_props())

        def in_the_lake():
            table = catalog.load_table(tuple(st["lake"]["namespace"]) +
                                       (st["lake"]["tableName"],))
            rows, _ = lake_rows(table)
            assert {k: v["payload"] for k, v in rows.items()} == \
                {k: v["payload"] for k, v in produced.items()}
        # The owner's view follows what the other node offloaded; then a reader from earliest
        # replays every message once, in order, the striped ledger from the lake (before this
        # change, the lake stream took an offloaded ledger another bookie holds as local, and the
        # reader retried "deleted locally" for good).
        def recorded():
            _, internal = _http("GET", f"{owner.http}{path}/internalStats")
            held = [l for l in internal["ledgers"] if l["entries"] > 0]
            assert held and all(l["offloaded"] for l in held), internal["ledgers"]
        eventually(recorded, timeout=60)
        produced = read_all(client, topic, 300)
        assert [v["payload"].decode() for _, v in sorted(produced.items())] == sent
        eventually(in_the_lake, timeout=60, interval=1)
    finally:
        client.close()
