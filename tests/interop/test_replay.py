"""Transparent replay with the official Python client: ranges offloaded to the lake and deleted
locally are consumed as if nothing had moved (same ids, bytes, keys, properties and times),
including encrypted and chunked messages, seeks by publish time into the lake, Shared
subscriptions and cumulative acks across the seam, a reader racing an offload, and a table
whose files an outside engine (PyIceberg) rewrote."""
import os
import random
import subprocess
import time
import uuid

import pulsar
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from conftest import Sends
from lake import http, offload_and_wait, stats, topic_path, wait_acknowledged

FAST = {
    "LEDGERLAKE_LAKE__CHECK_INTERVAL": "100ms",
    "LEDGERLAKE_LEDGER__ROLLOVER_ENTRIES": "500",
}


def set_policy(svc, name, value):
    status, body = http("PUT", f"{svc.http}/admin/v2/namespaces/public/default/{name}", str(value))
    assert status == 204, body


def wait_all_deleted(svc, topic, timeout=300):
    """Waits until every ledger of the topic with entries, but the open one, is deleted locally."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        ledgers = stats(svc, topic)["ledgers"]
        left = [l["ledger"] for l in ledgers
                if l["ledger"]["entry_count"] > 0 and l["ledger"]["state"] not in ("deleted", "open")]
        if not left:
            return sum(1 for l in ledgers if l["ledger"]["state"] == "deleted")
        time.sleep(0.2)
    raise AssertionError(f"ledgers not deleted: {left}")


def produce(client, topic, n, seed=1):
    """`n` messages: a tenth unbatched, the rest batched with LZ4 then ZSTD; keys on two thirds,
    properties on all, event times on half. Returns what the producer recorded, in id order."""
    rng = random.Random(seed)
    kinds = [(False, pulsar.CompressionType.NONE, n // 10),
             (True, pulsar.CompressionType.LZ4, (n - n // 10) // 2)]
    kinds.append((True, pulsar.CompressionType.ZSTD, n - sum(k[2] for k in kinds)))
    sent = []
    for batched, codec, count in kinds:
        producer = client.create_producer(
            topic, batching_enabled=batched, batching_max_messages=200,
            batching_max_publish_delay_ms=5, compression_type=codec,
            max_pending_messages=5000, block_if_queue_full=True)
        base = len(sent)
        sends = Sends()
        for i in range(count):
            k = base + i
            payload = f"{k}:{rng.getrandbits(64):x}:{'ü' * (k % 4)}".encode()
            key = f"key-{k % 97}" if k % 3 else None
            props = {"k": str(k), "codec": str(codec)}
            event = 1_700_000_000_000 + k if k % 2 == 0 else 0
            kwargs = dict(properties=props)
            if key:
                kwargs["partition_key"] = key
            if event:
                kwargs["event_timestamp"] = event
            producer.send_async(payload, sends.callback(), **kwargs)
            sent.append([None, payload, key, props, event or None])
        for i, mid in enumerate(sends.check(producer, count, timeout=120)):
            sent[base + i][0] = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
        producer.close()
    sent.sort(key=lambda s: s[0])
    return sent


def seen(m):
    mid = m.message_id()
    return [(mid.ledger_id(), mid.entry_id(), mid.batch_index()), m.data(),
            m.partition_key() or None, dict(m.properties()), m.event_timestamp() or None]


def consume(client, topic, sub, n, svc=None, **kwargs):
    """`n` messages from the earliest, acknowledged; each with its publish time appended. With
    `svc`, a stall prints the subscription's stats (what the broker waits on)."""
    consumer = client.subscribe(topic, sub, initial_position=pulsar.InitialPosition.Earliest,
                                receiver_queue_size=5000, **kwargs)
    out = []
    while len(out) < n:
        try:
            m = consumer.receive(timeout_millis=60000)
        except pulsar.Timeout:
            if svc is not None:
                st = stats(svc, topic)
                print(f"stalled after {len(out)} of {n} messages; subscription:",
                      st["subscriptions"].get(sub), "replay:", st["replay"])
            raise
        out.append(seen(m) + [m.publish_timestamp()])
        if len(out) % 1000 == 0 or len(out) == n:
            consumer.acknowledge_cumulative(m)
    consumer.close()
    return out


def drain(consumer):
    """The messages a consumer has now (acknowledged), without waiting long for more."""
    out = []
    while True:
        try:
            m = consumer.receive(timeout_millis=10)
        except pulsar.Timeout:
            return out
        consumer.acknowledge(m)
        out.append(m)


def pulsar_rs_dump():
    """The pulsar-rs consumer built next to the service binary (examples/pulsar_rs_dump.rs)."""
    path = os.path.join(os.path.dirname(os.environ["LL_TEST_BIN"]), "examples", "pulsar_rs_dump")
    assert os.path.exists(path), f"{path} missing: cargo test --no-run builds it"
    return path


def as_line(s, publish):
    """A message as pulsar_rs_dump prints it."""
    (ledger, entry, batch_index), data, key, props, event = s
    props = ";".join(sorted(f"{k}={v}" for k, v in props.items()))
    return f"{ledger},{entry},{batch_index},{data.hex()},{key or ''},{props},{publish}," \
           f"{event or ''}\n"


def restart(svc):
    assert svc.stop() == 0, open(svc.log_path).read()[-4000:]
    svc.start()


def test_million_messages_replay_identically_after_restart(make_service):
    n = int(os.environ.get("LL_REPLAY_MESSAGES", "1000000"))
    svc = make_service(FAST)
    svc.start()
    set_policy(svc, "offloadDeletionLagMs", 0)
    client = pulsar.Client(svc.url, operation_timeout_seconds=60)
    topic = f"persistent://public/default/million-{uuid.uuid4().hex[:6]}"
    sent = produce(client, topic, n)
    tail = 500
    status = offload_and_wait(svc, topic, timeout=900)
    assert status["status"] == "SUCCESS", status
    deleted = wait_all_deleted(svc, topic, timeout=900)
    assert deleted >= 2, deleted
    client.close()
    restart(svc)
    client = pulsar.Client(svc.url, operation_timeout_seconds=60)
    # A local tail after the lake range.
    p = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
    sends = Sends()
    for i in range(tail):
        p.send_async(f"tail-{i}".encode(), sends.callback())
    sends.check(p, tail)
    p.close()
    got = consume(client, topic, "replay", n + tail, svc=svc)
    published = [g.pop() for g in got]
    assert got[:n] == sent, "lake replay differs from what was produced"
    assert [g[1] for g in got[n:]] == [f"tail-{i}".encode() for i in range(tail)]
    assert published == sorted(published), "publish times are in id order"
    # The same with pulsar-rs (the Rust client), line for line.
    dump = os.path.join(svc.data_dir, "pulsar-rs.txt")
    subprocess.run([pulsar_rs_dump(), svc.url, topic, "replay-rs", str(n + tail), dump],
                   check=True, timeout=900)
    with open(dump) as f:
        for i, (line, g, pub) in enumerate(zip(f, got, published)):
            assert line == as_line(g, pub), (i, line, as_line(g, pub))
    assert i == n + tail - 1
    st = stats(svc, topic)
    assert st["replay"]["entriesFromLake"] > 0, st["replay"]
    sub = st["subscriptions"]["replay"]
    assert sub["msgBacklog"] == 0 and sub["lastReadTier"] == "local", sub
    client.close()
    assert svc.stop() == 0


def _keys(d):
    priv, pub = os.path.join(d, "private.pem"), os.path.join(d, "public.pem")
    subprocess.run(["openssl", "genrsa", "-out", priv, "2048"], check=True, capture_output=True)
    subprocess.run(["openssl", "rsa", "-in", priv, "-pubout", "-out", pub], check=True,
                   capture_output=True)
    return pulsar.CryptoKeyReader(pub, priv)


def test_encrypted_and_chunked_messages_replay_from_the_lake(make_service, tmp_path):
    svc = make_service(dict(FAST, LEDGERLAKE_BROKER__MAX_MESSAGE_SIZE="64KiB"))
    svc.start()
    set_policy(svc, "offloadDeletionLagMs", 0)
    keys = _keys(str(tmp_path))
    client = pulsar.Client(svc.url, operation_timeout_seconds=60)
    enc_topic = f"persistent://public/default/enc-{uuid.uuid4().hex[:6]}"
    chunk_topic = f"persistent://public/default/chunk-{uuid.uuid4().hex[:6]}"
    enc = client.create_producer(enc_topic, encryption_key="k1", crypto_key_reader=keys,
                                 batching_enabled=True, batching_max_messages=10,
                                 compression_type=pulsar.CompressionType.LZ4,
                                 block_if_queue_full=True)
    enc_sent = [f"secret {i} {'s' * (i % 50)}".encode() for i in range(300)]
    sends = Sends()
    for i, m in enumerate(enc_sent):
        enc.send_async(m, sends.callback(), properties={"i": str(i)}, partition_key=f"k{i % 5}")
    sends.check(enc, len(enc_sent))
    chunker = client.create_producer(chunk_topic, chunking_enabled=True, batching_enabled=False,
                                     compression_type=pulsar.CompressionType.ZSTD)
    rng = random.Random(7)
    chunk_sent = [bytes(rng.getrandbits(8) for _ in range(150_000 + i * 1000)) for i in range(5)]
    chunk_sent += [f"small {i}".encode() for i in range(5)]
    for i, m in enumerate(chunk_sent):
        chunker.send(m, properties={"i": str(i)})

    def read(topic, n, **kw):
        consumer = client.subscribe(topic, f"s-{uuid.uuid4().hex[:4]}",
                                    initial_position=pulsar.InitialPosition.Earliest, **kw)
        out = []
        for _ in range(n):
            m = consumer.receive(timeout_millis=60000)
            out.append((str(m.message_id()), m.data(), dict(m.properties()),
                        m.partition_key(), m.publish_timestamp()))
            consumer.acknowledge(m)
        consumer.close()
        return out

    enc_local = read(enc_topic, len(enc_sent), crypto_key_reader=keys)
    chunk_local = read(chunk_topic, len(chunk_sent))
    assert [x[1] for x in enc_local] == enc_sent
    assert [x[1] for x in chunk_local] == chunk_sent
    for topic in (enc_topic, chunk_topic):
        assert offload_and_wait(svc, topic)["status"] == "SUCCESS"
        assert wait_all_deleted(svc, topic) >= 1
    client.close()
    restart(svc)
    client = pulsar.Client(svc.url, operation_timeout_seconds=60)
    assert read(enc_topic, len(enc_sent), crypto_key_reader=keys) == enc_local
    assert read(chunk_topic, len(chunk_sent)) == chunk_local
    for topic in (enc_topic, chunk_topic):
        assert stats(svc, topic)["replay"]["entriesFromLake"] > 0
    client.close()
    assert svc.stop() == 0


def test_seek_shared_cumulative_and_rewritten_files(make_service, s3_server):
    prefix = f"replay-{uuid.uuid4().hex[:8]}"
    svc = make_service(dict(s3_server.service_env(prefix), **FAST))
    svc.start()
    set_policy(svc, "offloadDeletionLagMs", 0)
    client = pulsar.Client(svc.url, operation_timeout_seconds=60)
    topic = f"persistent://public/default/seam-{uuid.uuid4().hex[:6]}"
    sent = produce(client, topic, 30_000, seed=3)
    before = consume(client, topic, "before", len(sent))
    assert offload_and_wait(svc, topic)["status"] == "SUCCESS"
    assert wait_all_deleted(svc, topic) >= 5
    # A local tail after the lake range.
    p = client.create_producer(topic, batching_enabled=False)
    tail = [f"tail-{i}".encode() for i in range(200)]
    for m in tail:
        p.send(m)
    total = len(sent) + len(tail)

    # Seek by publish time into the middle of the lake.
    everything = consume(client, topic, "all", total)
    assert [g[:5] for g in everything[:len(sent)]] == [b[:5] for b in before]
    middle = everything[len(sent) // 2]
    target = middle[5]
    consumer = client.subscribe(topic, "seeker", initial_position=pulsar.InitialPosition.Latest)
    consumer.seek(target)
    m = consumer.receive(timeout_millis=60000)
    first = next(i for i, g in enumerate(everything) if g[5] >= target)
    # The first message at or after the time; a batch is delivered whole.
    want = everything[first][0]
    got = seen(m)[0]
    assert (got[0], got[1]) == (want[0], want[1]), (got, want)
    # Seek by message id to an unbatched message in the lake: the C++ client then receives the
    # message after it (as on a local range, see test_seek.py).
    at = next(i for i in range(len(sent) // 20, len(sent)) if everything[i][0][2] == -1)
    lake_id = everything[at][0]
    consumer.seek(pulsar.MessageId(-1, lake_id[0], lake_id[1], -1))
    m = consumer.receive(timeout_millis=60000)
    assert seen(m)[0] == everything[at + 1][0]
    consumer.close()

    # Shared subscription across the seam: every message exactly once among two consumers.
    c1 = client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared,
                          initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=100)
    c2 = client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared,
                          initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=100)
    ids = []
    while len(ids) < total:
        for c in (c1, c2):
            ids.extend(seen(m)[0] for m in drain(c))
    assert sorted(ids) == sorted(g[0] for g in everything)
    c1.close()
    c2.close()

    # Cumulative ack inside the lake range (at the end of a batch: without batch-index acks a
    # partly acknowledged batch is redelivered whole, as in Pulsar), then resume after a reconnect.
    cut = next(i for i in range(len(sent) // 3, len(sent))
               if everything[i][0][:2] != everything[i + 1][0][:2])
    c = client.subscribe(topic, "cumulative", initial_position=pulsar.InitialPosition.Earliest,
                         receiver_queue_size=100)
    for i in range(cut + 1):
        m = c.receive(timeout_millis=60000)
    c.acknowledge_cumulative(m)
    c.close()
    wait_acknowledged(svc, topic, "cumulative", everything[cut][0][:2])
    c = client.subscribe(topic, "cumulative", receiver_queue_size=100)
    m = c.receive(timeout_millis=60000)
    assert seen(m)[0] == everything[cut + 1][0]
    c.close()

    # An outside engine rewrites the table's files (same rows, another layout) and deletes the
    # old ones (as expiring the old snapshots would): replay is the same, from the new files (a
    # table handle replay still holds fails on the old files and is reloaded).
    st = stats(svc, topic)
    catalog = SqlCatalog(st["lake"]["catalog"], uri=f"sqlite:///{svc.data_dir}/data/catalog.db",
                         warehouse=f"s3://warehouse/{prefix}", **s3_server.pyiceberg_props())
    table = catalog.load_table(tuple(st["lake"]["namespace"]) + (st["lake"]["tableName"],))
    old_files = set(table.inspect.files().column("file_path").to_pylist())
    rows = table.scan().to_arrow()
    order = list(range(rows.num_rows))
    random.Random(5).shuffle(order)
    table.overwrite(rows.take(order))
    table = catalog.load_table(tuple(st["lake"]["namespace"]) + (st["lake"]["tableName"],))
    new_files = set(table.inspect.files().column("file_path").to_pylist())
    assert new_files and not (new_files & old_files)
    fs = s3_server.filesystem()
    for f in old_files:
        fs.delete_file(f.split("://", 1)[1])
    again = consume(client, topic, "after-rewrite", total)
    assert [g[:5] for g in again] == [g[:5] for g in everything]
    assert [g[5] for g in again] == [g[5] for g in everything]
    client.close()
    assert svc.stop() == 0


def test_reader_started_while_its_range_is_offloaded(make_service):
    svc = make_service(FAST)
    svc.start()
    set_policy(svc, "offloadThreshold", -1)
    set_policy(svc, "offloadDeletionLagMs", 0)
    client = pulsar.Client(svc.url, operation_timeout_seconds=60)
    topic = f"persistent://public/default/race-{uuid.uuid4().hex[:6]}"
    sent = produce(client, topic, 40_000, seed=9)
    reader = client.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=50)
    got = []
    for _ in range(500):
        got.append(seen(reader.read_next(timeout_millis=60000)))
    url = f"{svc.http}/admin/v2/{topic_path(topic)}/offload"
    status, body = http("PUT", url)
    assert status == 200, body
    # Keep reading once the reader's own ledger is gone locally, while later ones still move.
    deadline = time.time() + 120
    while not any(l["ledger"]["state"] == "deleted" for l in stats(svc, topic)["ledgers"]):
        assert time.time() < deadline, "no ledger was deleted"
        time.sleep(0.05)
    while len(got) < len(sent):
        got.append(seen(reader.read_next(timeout_millis=60000)))
        if len(got) % 500 == 0:
            time.sleep(0.01)  # slow enough for the seam to move underneath
    assert got == sent
    assert wait_all_deleted(svc, topic) >= 5
    assert stats(svc, topic)["replay"]["entriesFromLake"] > 0
    reader.close()
    client.close()
    assert svc.stop() == 0


def test_key_shared_redelivery_and_last_message_id_from_the_lake(make_service):
    svc = make_service(FAST)
    svc.start()
    set_policy(svc, "offloadDeletionLagMs", 0)
    client = pulsar.Client(svc.url, operation_timeout_seconds=60)
    topic = f"persistent://public/default/ks-{uuid.uuid4().hex[:6]}"
    sent = produce(client, topic, 20_000, seed=11)
    assert offload_and_wait(svc, topic)["status"] == "SUCCESS"
    assert wait_all_deleted(svc, topic) >= 2
    client.close()
    restart(svc)  # nothing in the tail cache: everything comes from the lake
    client = pulsar.Client(svc.url, operation_timeout_seconds=60)

    # GET_LAST_MESSAGE_ID / hasMessageAvailable when the last entry is only in the lake.
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert reader.has_message_available()
    got = []
    while reader.has_message_available():
        got.append(seen(reader.read_next(timeout_millis=60000)))
    assert got == sent
    reader.close()

    # Key_Shared: each key on one consumer, in order; every message once.
    consumers = [client.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared,
                                  initial_position=pulsar.InitialPosition.Earliest,
                                  receiver_queue_size=20) for _ in range(2)]
    by_consumer = [[], []]
    while sum(map(len, by_consumer)) < len(sent):
        for i, c in enumerate(consumers):
            for m in drain(c):
                by_consumer[i].append(seen(m))
    assert sorted(s[0] for s in by_consumer[0] + by_consumer[1]) == [s[0] for s in sent]
    # A key moves at most once (when the second consumer joined): each consumer's run of a
    # key is in order, and one run ends before the other begins. As in Pulsar, this holds for
    # entries routed by the key: unbatched messages here (a default batch mixes keys and is
    # routed as one; producers use key-based batching for Key_Shared).
    keys = {s[2] for s in sent if s[2] is not None}
    for key in keys:
        runs = [[s[0] for s in msgs if s[2] == key and s[0][2] == -1] for msgs in by_consumer]
        for ids in runs:
            assert ids == sorted(ids), f"key {key} out of order"
        if all(runs):
            assert max(runs[0]) < min(runs[1]) or max(runs[1]) < min(runs[0]), \
                f"key {key} interleaved between consumers"
    for c in consumers:
        c.close()

    # Redelivery of unacknowledged lake messages: the same messages again, counted.
    c = client.subscribe(topic, "redeliver", consumer_type=pulsar.ConsumerType.Shared,
                         initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=50)
    first = [c.receive(timeout_millis=60000) for _ in range(300)]
    c.redeliver_unacknowledged_messages()
    want = {seen(m)[0]: seen(m) for m in first}
    again = {}
    while not want.keys() <= again.keys():
        m = c.receive(timeout_millis=60000)
        if m.redelivery_count() > 0:
            again[seen(m)[0]] = seen(m)
    assert {k: again[k] for k in want} == want
    c.close()
    client.close()
    assert svc.stop() == 0


def test_partitioned_topic_replays_each_partition(make_service):
    svc = make_service(FAST)
    svc.start()
    set_policy(svc, "offloadDeletionLagMs", 0)
    name = f"parts-{uuid.uuid4().hex[:6]}"
    status, _ = http("PUT", f"{svc.http}/admin/v2/persistent/public/default/{name}/partitions", "3")
    assert status in (200, 204)
    topic = f"persistent://public/default/{name}"
    client = pulsar.Client(svc.url, operation_timeout_seconds=60)
    p = client.create_producer(topic, batching_enabled=True, batching_max_messages=20,
                               message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
                               block_if_queue_full=True)
    sends = Sends()
    for i in range(3000):
        p.send_async(f"p{i}".encode(), sends.callback(), partition_key=f"k{i % 31}")
    sends.check(p, 3000)
    before = sorted((str(m[0]), m[1]) for m in
                    ((s[0], s[1]) for s in consume(client, topic, "before", 3000)))
    assert offload_and_wait(svc, topic)["status"] == "SUCCESS"
    for i in range(3):
        assert wait_all_deleted(svc, f"{topic}-partition-{i}") >= 1
    client.close()
    restart(svc)
    client = pulsar.Client(svc.url, operation_timeout_seconds=60)
    after = consume(client, topic, "after", 3000)
    assert sorted((str(s[0]), s[1]) for s in after) == before
    # Ids carry their partition: each partition's messages come from its own ledgers.
    assert stats(svc, f"{topic}-partition-0")["replay"]["entriesFromLake"] > 0
    client.close()
    assert svc.stop() == 0


def test_batch_index_acks_on_lake_messages(make_service):
    svc = make_service(FAST)
    svc.start()
    set_policy(svc, "offloadDeletionLagMs", 0)
    topic = f"persistent://public/default/bia-{uuid.uuid4().hex[:6]}"
    client = pulsar.Client(svc.url, operation_timeout_seconds=60)
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=5,
                                      batching_max_publish_delay_ms=1000, block_if_queue_full=True)
    sends = Sends()
    for i in range(20):
        producer.send_async(f"m{i}".encode(), sends.callback())
    sends.check(producer, 20)
    assert offload_and_wait(svc, topic)["status"] == "SUCCESS"
    assert wait_all_deleted(svc, topic) >= 1
    consumer = client.subscribe(topic, "bia", consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest,
                                batch_index_ack_enabled=True, receiver_queue_size=5)
    msgs = [consumer.receive(timeout_millis=60000) for _ in range(5)]
    assert [m.data() for m in msgs] == [f"m{i}".encode() for i in range(5)]
    for m in msgs[:3]:
        consumer.acknowledge(m)
    time.sleep(1.5)  # grouped acks reach the broker; the cursor is saved every second
    client.close()
    restart(svc)
    client = pulsar.Client(svc.url, operation_timeout_seconds=60)
    consumer = client.subscribe(topic, "bia", consumer_type=pulsar.ConsumerType.Shared,
                                batch_index_ack_enabled=True)
    rest = [consumer.receive(timeout_millis=60000).data() for _ in range(17)]
    assert sorted(rest[:2]) == [b"m3", b"m4"]
    assert rest[2:] == [f"m{i}".encode() for i in range(5, 20)]
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=500)
    client.close()
    assert svc.stop() == 0
