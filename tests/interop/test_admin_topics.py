"""The admin API scripts use (issue 18), driven over HTTP with Pulsar's paths and JSON while
the official Python client produces and consumes: topics, subscriptions created at a position,
skip / clear / expire / reset, peek and examine with Pulsar's headers, lastMessageId,
internalStats with each ledger's tier, partitioned-stats and unload."""
import json
import subprocess
import urllib.request

import pulsar

from conftest import _binary, eventually
from lake import offload_and_wait
from test_tenancy import admin_cli, admin_ok, call

NS = "/persistent/public/default"


def raw(svc, path):
    """GET returning (status, headers, body bytes)."""
    req = urllib.request.Request(f"{svc.http}/admin/v2{path}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def backlog(svc, topic, sub):
    return call(svc, "GET", f"{NS}/{topic}/stats")[1]["subscriptions"][sub]["msgBacklog"]


def test_topics_subscriptions_and_messages(fresh_service):
    svc = fresh_service
    svc.start()
    assert call(svc, "PUT", f"{NS}/adm")[0] == 204
    assert call(svc, "PUT", f"{NS}/adm")[0] == 409
    # As Pulsar: a partitioned topic cannot take the name of a non-partitioned one.
    assert call(svc, "PUT", f"{NS}/adm/partitions", {"partitions": 2})[0] == 409
    assert call(svc, "GET", f"{NS}/adm/partitions") == (200, {"partitions": 0})
    assert "persistent://public/default/adm" in call(svc, "GET", NS)[1]
    assert call(svc, "GET", f"{NS}/adm/lastMessageId")[1]["entryId"] == -1
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    producer = client.create_producer("persistent://public/default/adm", batching_enabled=False)
    for i in range(10):
        producer.send(f"m{i}".encode(), properties={"k": f"v{i}"}, partition_key=f"key{i}")
    last = call(svc, "GET", f"{NS}/adm/lastMessageId")[1]
    assert last["entryId"] == 9 and last["partitionIndex"] == -1, last

    # A subscription created at the earliest position, then moved about by the admin API.
    earliest = {"ledgerId": -1, "entryId": -1, "partitionIndex": -1}
    assert call(svc, "PUT", f"{NS}/adm/subscription/audit", earliest)[0] == 204
    assert call(svc, "PUT", f"{NS}/adm/subscription/audit", earliest)[0] == 409
    assert call(svc, "PUT", f"{NS}/adm/subscription/tail")[0] == 204  # latest
    assert call(svc, "GET", f"{NS}/adm/subscriptions") == (200, ["audit", "tail"])
    assert backlog(svc, "adm", "audit") == 10
    assert backlog(svc, "adm", "tail") == 0
    status, headers, body = raw(svc, f"{NS}/adm/subscription/audit/position/1")
    assert (status, body) == (200, b"m0"), (status, body)
    assert headers["X-Pulsar-PROPERTY-k"] == "v0"
    assert headers["X-Pulsar-partition-key"] == "key0"
    assert headers["X-Pulsar-Message-ID"].endswith(":0:-1"), headers
    assert raw(svc, f"{NS}/adm/subscription/audit/position/11")[0] == 404
    assert call(svc, "POST", f"{NS}/adm/subscription/audit/skip/3")[0] == 204
    assert backlog(svc, "adm", "audit") == 7
    assert raw(svc, f"{NS}/adm/subscription/audit/position/1")[2] == b"m3"
    assert raw(svc, f"{NS}/adm/examinemessage?initialPosition=earliest&messagePosition=2")[2] \
        == b"m1"
    assert raw(svc, f"{NS}/adm/examinemessage?initialPosition=latest&messagePosition=1")[2] \
        == b"m9"
    # Reset by message id, then by time.
    fifth = {"ledgerId": last["ledgerId"], "entryId": 5}
    assert call(svc, "POST", f"{NS}/adm/subscription/audit/resetcursor", fifth)[0] == 204
    assert backlog(svc, "adm", "audit") == 5
    assert raw(svc, f"{NS}/adm/subscription/audit/position/1")[2] == b"m5"
    assert call(svc, "POST", f"{NS}/adm/subscription/audit/resetcursor/0")[0] == 204
    assert backlog(svc, "adm", "audit") == 10
    # A Shared consumer joins the subscription the admin API made and reads from its cursor.
    consumer = client.subscribe("persistent://public/default/adm", "audit",
                                consumer_type=pulsar.ConsumerType.Shared)
    got = [consumer.receive(timeout_millis=10_000).data() for _ in range(10)]
    assert sorted(got) == sorted(f"m{i}".encode() for i in range(10))
    # Each consumer's stats, an array as in Pulsar (`pulsar-admin topics stats` parses one).
    [c] = call(svc, "GET", f"{NS}/adm/stats")[1]["subscriptions"]["audit"]["consumers"]
    assert c["consumerName"] == consumer.consumer_name(), c
    assert c["address"].startswith("/127.0.0.1:"), c
    assert c["clientVersion"].startswith("Pulsar"), c  # what the client's CONNECT says
    assert (c["msgOutCounter"], c["unackedMessages"]) == (10, 10), c
    assert c["availablePermits"] == 1000 - 10, c  # the receiver queue's FLOW, less the 10
    assert c["blockedConsumerOnUnackedMsgs"] is False, c
    assert c["connectedSince"].endswith("Z"), c
    # Each producer's stats (Pulsar's `publishers` array): who it is and what it appended.
    [p] = call(svc, "GET", f"{NS}/adm/stats")[1]["publishers"]
    assert p["producerName"] == producer.producer_name(), p
    assert (p["accessMode"], p["msgInCounter"]) == ("Shared", 10), p
    assert p["msgRateIn"] > 0 and p["averageMsgSize"] > 0, p
    assert p["address"].startswith("/127.0.0.1:"), p
    assert p["clientVersion"].startswith("Pulsar") and p["connectedSince"].endswith("Z"), p
    # Deleting a subscription with a consumer needs force.
    assert call(svc, "DELETE", f"{NS}/adm/subscription/audit")[0] == 412
    assert call(svc, "DELETE", f"{NS}/adm/subscription/audit?force=true")[0] == 204
    # As with Pulsar, the disconnected client reconnects and subscribes again, re-creating the
    # subscription (at latest) whenever its reconnect lands: close it, then drop what it made.
    consumer.close()
    assert call(svc, "DELETE", f"{NS}/adm/subscription/audit")[0] in (204, 404)
    assert call(svc, "GET", f"{NS}/adm/subscriptions") == (200, ["tail"])
    # Expire and clear-backlog.
    assert call(svc, "PUT", f"{NS}/adm/subscription/old", earliest)[0] == 204
    assert call(svc, "POST", f"{NS}/adm/subscription/old/expireMessages/3600")[0] == 204
    assert backlog(svc, "adm", "old") == 10, "nothing is an hour old"
    assert call(svc, "POST", f"{NS}/adm/all_subscription/expireMessages/0")[0] == 204
    assert backlog(svc, "adm", "old") == 0
    producer.send(b"m10")
    assert call(svc, "POST", f"{NS}/adm/subscription/tail/skip_all")[0] == 204
    assert backlog(svc, "adm", "tail") == 0
    assert call(svc, "POST", f"{NS}/adm/subscription/nope/skip/1")[0] == 404
    assert call(svc, "GET", f"{NS}/missing/subscriptions")[0] == 404
    # internalStats: each ledger with its tier, before and after offload.
    internal = call(svc, "GET", f"{NS}/adm/internalStats")[1]
    assert internal["numberOfEntries"] == 11, internal
    assert {l["tier"] for l in internal["ledgers"]} == {"local"}, internal
    assert set(internal["cursors"]) == {"old", "tail"}, internal
    offload_and_wait(svc, "persistent://public/default/adm")
    internal = call(svc, "GET", f"{NS}/adm/internalStats")[1]
    tiers = [l["tier"] for l in internal["ledgers"] if l["entries"] > 0]
    assert "offloaded" in tiers or "lake" in tiers, internal
    # Peek and examine read whichever tier holds the entry.
    assert raw(svc, f"{NS}/adm/examinemessage?initialPosition=earliest&messagePosition=1")[2] \
        == b"m0"
    producer.close()
    client.close()


def test_partitioned_stats_and_unload(fresh_service):
    svc = fresh_service
    svc.start()
    assert call(svc, "PUT", f"{NS}/parts/partitions", {"partitions": 2})[0] == 204
    assert call(svc, "GET", f"{NS}/parts/partitions") == (200, {"partitions": 2})
    # A subscription made before any producer: it exists on every partition.
    earliest = {"ledgerId": -1, "entryId": -1}
    assert call(svc, "PUT", f"{NS}/parts/subscription/early", earliest)[0] == 204
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    topic = "persistent://public/default/parts"
    consumer = client.subscribe(topic, "s")
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(20):
        producer.send(f"{i}".encode(), partition_key=str(i))
    status, stats = call(svc, "GET", f"{NS}/parts/partitioned-stats?perPartition=true")
    assert status == 200 and stats["metadata"] == {"partitions": 2}, stats
    assert stats["msgInCounter"] == 20, stats
    assert sorted(stats["partitions"]) == [f"{topic}-partition-0", f"{topic}-partition-1"]
    assert sum(p["msgInCounter"] for p in stats["partitions"].values()) == 20
    # Subscriptions keyed by name, summed over the partitions (as Pulsar's client expects).
    assert stats["subscriptions"]["early"]["msgBacklog"] == 20, stats["subscriptions"]
    # The consumer of a partitioned topic is one per partition, each listed (as in Pulsar).
    consumers = stats["subscriptions"]["s"]["consumers"]
    assert len(consumers) == 2 and {c["consumerName"] for c in consumers} == \
        {consumer.consumer_name()}, consumers
    # So is the producer: one per partition (the C++ client leaves each partition's producer
    # to be named by the broker), its appends counted on each.
    publishers = stats["publishers"]
    assert len(publishers) == 2 and producer.producer_name() in \
        {p["producerName"] for p in publishers}, publishers
    assert sorted(p["msgInCounter"] for p in publishers) == sorted(
        p["msgInCounter"] for p in stats["partitions"].values()), publishers
    for name, one in stats["partitions"].items():
        [p] = one["publishers"]
        assert p["msgInCounter"] == one["msgInCounter"], (name, p)
    # An exclusive producer says so; a closed one is no longer listed.
    alone = client.create_producer("persistent://public/default/alone",
                                   access_mode=pulsar.ProducerAccessMode.Exclusive)
    alone.send(b"x")
    [p] = call(svc, "GET", f"{NS}/alone/stats")[1]["publishers"]
    assert (p["accessMode"], p["msgInCounter"]) == ("Exclusive", 1), p
    alone.close()
    # CLOSE_PRODUCER is answered once the owner has the removal queued: listed until it runs.
    eventually(lambda: call(svc, "GET", f"{NS}/alone/stats")[1]["publishers"] == [], timeout=10)
    assert call(svc, "POST", f"{NS}/parts/subscription/early/resetcursor",
                {"ledgerId": 1, "entryId": 0})[0] == 405
    assert call(svc, "POST", f"{NS}/parts/subscription/early/skip/5")[0] == 204
    assert call(svc, "GET", f"{NS}/parts/partitioned-stats")[1]["subscriptions"]["early"][
        "msgBacklog"] == 10, "5 skipped on each of the two partitions"
    assert call(svc, "GET", f"{NS}/parts/partitioned-stats?perPartition=false")[1][
        "partitions"] == {}
    assert call(svc, "GET", f"{NS}/nope/partitioned-stats")[0] == 404
    got = {consumer.receive(timeout_millis=10_000).data() for _ in range(20)}
    # Unload: clients are disconnected, reconnect, and carry on where they were.
    assert call(svc, "PUT", f"{NS}/parts/unload")[0] == 204
    for i in range(20, 30):
        producer.send(f"{i}".encode(), partition_key=str(i))

    def rest():
        while len(got) < 30:
            msg = consumer.receive(timeout_millis=10_000)
            got.add(msg.data())
            consumer.acknowledge(msg)
        return got

    assert eventually(rest, timeout=60) == {f"{i}".encode() for i in range(30)}
    assert call(svc, "PUT", f"{NS}/missing/unload")[0] == 404
    producer.close()
    consumer.close()
    client.close()


def test_admin_cli_topic_verbs_and_top(fresh_service):
    """`ledgerlake admin topics …` (pulsar-admin's verbs, tables and --json) and
    `ledgerlake top --once / --json` against a service the Python client is producing to."""
    svc = fresh_service
    svc.start()
    ok = admin_ok(svc)
    topic = "persistent://public/default/cli"
    ok("topics", "create", topic)
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(5):
        producer.send(f"c{i}".encode(), properties={"n": str(i)})
    ok("topics", "create-subscription", topic, "-s", "audit", "-m", "earliest")
    assert ok("topics", "subscriptions", topic) == "audit\n"
    peeked = json.loads(ok("topics", "peek-messages", topic, "-s", "audit", "-n", "10", "--json"))
    assert [m["payload"] for m in peeked] == [f"c{i}" for i in range(5)], peeked
    assert peeked[2]["properties"] == {"n": "2"}
    table = ok("topics", "peek-messages", topic, "-s", "audit", "-n", "1")
    assert "--- message 1 ---" in table and "c0" in table, table
    assert json.loads(ok("topics", "examine-message", topic, "-i", "latest", "--json"))[0][
        "payload"] == "c4"
    ok("topics", "skip", topic, "-s", "audit", "-n", "2")
    assert json.loads(ok("topics", "peek-messages", topic, "-s", "audit", "--json"))[0][
        "payload"] == "c2"
    ok("topics", "reset-cursor", topic, "-s", "audit", "-t", "1h")
    assert json.loads(ok("topics", "stats", topic, "--json"))["subscriptions"]["audit"][
        "msgBacklog"] == 5
    ok("topics", "clear-backlog", topic, "-s", "audit")
    assert json.loads(ok("topics", "stats", topic, "--json"))["subscriptions"]["audit"][
        "msgBacklog"] == 0
    ok("topics", "expire-messages", topic, "--all-subscriptions", "-t", "1s")
    last = json.loads(ok("topics", "last-message-id", topic, "--json"))
    assert last["entryId"] == 4
    internal = json.loads(ok("topics", "stats-internal", topic, "--json"))
    assert internal["numberOfEntries"] == 5 and "audit" in internal["cursors"], internal
    ok("topics", "create-partitioned-topic", "persistent://public/default/cli-p", "-p", "2")
    ok("topics", "update-partitioned-topic", "persistent://public/default/cli-p", "-p", "3")
    parts = json.loads(ok("topics", "partitioned-stats", "persistent://public/default/cli-p",
                          "--json"))
    assert parts["metadata"] == {"partitions": 3}, parts
    refused = admin_cli(svc, "topics", "unsubscribe", "persistent://public/default/nope", "-s", "x")
    assert refused.returncode != 0 and "404" in refused.stderr, refused.stderr
    ok("topics", "unsubscribe", topic, "-s", "audit")
    ok("topics", "unload", topic)
    # top: the topic the producer writes to is there, with its rate.
    producer.send(b"after unload")
    top = subprocess.run([_binary(), "top", "--url", svc.http, "--once"], capture_output=True,
                         text=True, timeout=60)
    assert top.returncode == 0 and topic in top.stdout and "TOPIC" in top.stdout, top
    rows = json.loads(subprocess.run([_binary(), "top", "--url", svc.http, "--json"],
                                     capture_output=True, text=True, timeout=60,
                                     check=True).stdout)
    assert topic in [r["topic"] for r in rows], rows
    producer.close()
    client.close()


def test_unloads_while_a_producer_sends_flat_out_store_each_message_once(fresh_service):
    """Unloaded again and again while a producer keeps hundreds of SENDs in flight: every
    message is acknowledged and the topic holds each exactly once, in order. (A CLOSE_PRODUCER
    that overtook a SEND_RECEIPT made the client resend a message that was stored.)"""
    svc = fresh_service
    svc.start()
    topic = "persistent://public/default/unload-flat-out"
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    try:
        producer = client.create_producer(topic, batching_enabled=False,
                                          max_pending_messages=2000, block_if_queue_full=True)
        failures = []

        def sent(result, _msg_id):
            if result != pulsar.Result.Ok:
                failures.append(result)

        n = 0
        for _ in range(8):
            for _ in range(500):
                producer.send_async(str(n).encode(), sent)
                n += 1
            assert call(svc, "PUT", f"{NS}/unload-flat-out/unload")[0] == 204
        producer.flush()
        assert failures == []
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        got = [int(reader.read_next(timeout_millis=20000).data()) for _ in range(n)]
        assert got == list(range(n))
        assert not reader.has_message_available()
    finally:
        client.close()


def test_a_producer_opens_the_ledger_and_an_unused_one_is_discarded(fresh_service):
    """The topic's ledger is opened when a producer registers, so the first send does not wait
    for it; a ledger opened for a producer that sent nothing is discarded when the topic
    unloads, not sealed and offloaded."""
    svc = fresh_service
    svc.start()
    topic = "persistent://public/default/ahead"
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)

    def ledgers():
        internal = call(svc, "GET", f"{NS}/ahead/internalStats")[1]
        return [(l["ledgerId"], l["entries"], l["state"]) for l in internal["ledgers"]]

    producer = client.create_producer(topic, batching_enabled=False)
    [(opened, entries, state)] = ledgers()
    assert (entries, state) == (0, "open")
    assert producer.send(b"m0").ledger_id() == opened
    producer.close()
    assert call(svc, "PUT", f"{NS}/ahead/unload")[0] == 204
    producer = client.create_producer(topic, batching_enabled=False)
    [first, (unused, entries, state)] = ledgers()
    assert first == (opened, 1, "sealed")
    assert unused > opened and (entries, state) == (0, "open")
    producer.close()
    assert call(svc, "PUT", f"{NS}/ahead/unload")[0] == 204
    assert ledgers() == [(opened, 1, "sealed")]
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert reader.read_next(timeout_millis=10000).data() == b"m0"
    assert not reader.has_message_available()
    client.close()
