"""A namespace whose lake table layout is `shared` (issue 22): all its topics in one Iceberg
table, `__topics`, with a `topic` column it is partitioned by. One offload pass commits many
topics at once; replay from the lake, SQL over lake and tail, verify, retention and topic
deletion each stay exact per topic; PyIceberg reads the one table."""
import json
import os
import re
import subprocess
import time
import uuid

import pulsar
from pyiceberg.catalog.sql import SqlCatalog

from conftest import Sends, _binary, eventually
from lake import http, offload_and_wait, stats
from test_replay import wait_all_deleted
from test_sql import psql, psql_rows

FAST = {
    "LEDGERLAKE_LAKE__CHECK_INTERVAL": "100ms",
    "LEDGERLAKE_BROKER__RETENTION_CHECK_INTERVAL": "100ms",
    "LEDGERLAKE_LEDGER__ROLLOVER_ENTRIES": "20",
}


def policy(svc, ns, name, value, expect=204):
    status, body = http("PUT", f"{svc.http}/admin/v2/namespaces/{ns}/{name}", value)
    assert status == expect, body
    return body


def produce(client, topic, n):
    """`n` messages, alternately unbatched and in batches; returns (id, payload) in id order."""
    sent = []
    for batched in (False, True):
        producer = client.create_producer(topic, batching_enabled=batched,
                                          batching_max_messages=7,
                                          batching_max_publish_delay_ms=5)
        sends = Sends()
        count = n // 2 if not batched else n - n // 2
        base = len(sent)
        for i in range(count):
            payload = f"{topic}#{base + i}".encode()
            producer.send_async(payload, sends.callback(), properties={"i": str(base + i)})
            sent.append([None, payload])
        for i, mid in enumerate(sends.check(producer, count, timeout=60)):
            sent[base + i][0] = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
        producer.close()
    sent.sort(key=lambda s: s[0])
    return sent


def read_all(client, topic, n):
    consumer = client.subscribe(topic, f"read-{uuid.uuid4().hex[:6]}",
                                initial_position=pulsar.InitialPosition.Earliest)
    out = []
    while len(out) < n:
        m = consumer.receive(timeout_millis=60000)
        mid = m.message_id()
        out.append([(mid.ledger_id(), mid.entry_id(), mid.batch_index()), m.data()])
        consumer.acknowledge(m)
    consumer.close()
    return out


def shared_table(svc, ns):
    catalog = SqlCatalog("ledgerlake", uri=f"sqlite:///{svc.data_dir}/data/catalog.db",
                         warehouse="")
    return catalog.load_table(tuple(ns.split("/")) + ("__topics",))


def verify_json(svc, topic):
    r = subprocess.run([_binary(), "verify", "--url", svc.http, "--json", "--deep", topic],
                       capture_output=True, text=True, timeout=300)
    return r.returncode, json.loads(r.stdout), r


def shared_namespace(make_service, ns, **env):
    """A service of its own with namespace `ns` in the shared layout."""
    svc = make_service(dict(FAST, **env))
    svc.start()
    svc.create_namespace(ns)
    policy(svc, ns, "lakeTableLayout", "shared")
    return svc


def test_many_topics_share_one_table_and_stay_exact(make_service):
    ns = "public/many"
    svc = shared_namespace(make_service, ns, LEDGERLAKE_LAKE__REMOVED_FILE_GRACE="5s")
    # No offload while producing: the pass that starts afterwards finds every topic's sealed
    # ledgers at once.
    policy(svc, ns, "offloadThreshold", "-1")
    policy(svc, ns, "offloadDeletionLagMs", "0")
    assert http("GET", f"{svc.http}/admin/v2/namespaces/{ns}/lakeTableLayout") == (200, "shared")
    policy(svc, ns, "lakeTableLayout", "hourly", expect=400)

    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    names = [f"t{i}" for i in range(10)] + ["with-dash", "parts-partition-0", "parts-partition-1"]
    sent = {}
    for i, name in enumerate(names):
        sent[name] = produce(client, f"persistent://{ns}/{name}", 41 + 3 * i)
    # The layout cannot change under existing topics.
    policy(svc, ns, "lakeTableLayout", "per-topic", expect=409)

    policy(svc, ns, "offloadThreshold", "0")
    for name in names:
        offload_and_wait(svc, f"persistent://{ns}/{name}")
        lake = stats(svc, f"persistent://{ns}/{name}")["lake"]
        assert lake["tableName"] == "__topics" and lake["namespace"] == ["public", "many"], lake

    # One table holds every topic, each row tagged with its topic; a commit carried many.
    table = shared_table(svc, ns)
    assert [f.name for f in table.spec().fields] == ["topic", "publish_day"]
    rows = table.scan(selected_fields=("topic", "partition", "ledger_id", "entry_id")).to_arrow()
    counts, expected = {}, {}
    for topic in rows.column("topic").to_pylist():
        counts[topic] = counts.get(topic, 0) + 1
    for name, messages in sent.items():
        base = name.split("-partition-")[0]
        expected[base] = expected.get(base, 0) + len(messages)
    assert counts == expected
    per_commit = []
    for snap in table.snapshots():
        ranges = (snap.summary.additional_properties.get("ledgerlake.ranges") or "")
        per_commit.append(len({r.rsplit(":", 3)[0] for r in ranges.split(",") if r}))
    assert max(per_commit) >= 5, per_commit
    # A topic's metadata tables show only its own files; snapshot summaries (every topic's
    # ranges) are not shown per topic.
    parts = psql_rows(svc, 'SELECT partition FROM many."t3$files"')
    assert parts and all(p[0].startswith("topic=t3/") for p in parts), parts
    refused = psql(svc, 'SELECT count(*) FROM many."t3$snapshots"')
    assert refused.returncode != 0 and "share one lake table" in refused.stderr, refused
    # One topic's scan plans only its own files.
    plan = list(table.scan(row_filter="topic == 't3'").plan_files())
    assert plan and all(t.file.partition[0] == "t3" for t in plan)

    # Local copies deleted: consumers read every topic back from the lake, same ids and bytes.
    for name in names:
        topic = f"persistent://{ns}/{name}"
        wait_all_deleted(svc, topic)
        assert read_all(client, topic, len(sent[name])) == sent[name], name

    # SQL: lake plus a live tail, per topic, with the topic column.
    producer = client.create_producer(f"persistent://{ns}/t3", batching_enabled=False)
    for i in range(5):
        producer.send(f"tail-{i}".encode())
    producer.close()
    assert psql_rows(svc, "SELECT count(*), count(DISTINCT topic), min(topic) FROM many.t3") == [
        [str(len(sent["t3"]) + 5), "1", "t3"]]
    assert psql_rows(svc, 'SELECT count(*) FROM many."with-dash"') == [[str(len(sent["with-dash"]))]]
    assert psql_rows(svc, "SELECT partition, count(*) FROM many.parts GROUP BY 1 ORDER BY 1") == [
        ["0", str(len(sent["parts-partition-0"]))], ["1", str(len(sent["parts-partition-1"]))]]

    # verify compares each topic's log with its own rows of the shared table.
    for name in ("t3", "parts"):
        code, doc, r = verify_json(svc, f"persistent://{ns}/{name}")
        assert code == 0 and doc["clean"], r.stdout + r.stderr
        lake_rows = sum(p["rows_lake"] for p in doc["topics"][0]["partitions"])
        expected = sum(len(v) for n, v in sent.items() if n.split("-partition-")[0] == name)
        assert lake_rows == expected, doc

    # Deleting a topic removes its rows; the table and the other topics stay. The removal is
    # bounded by a ledger id at or above every ledger of the topic.
    files = shared_table(svc, ns).inspect.files().select(["file_path", "partition"]).to_pylist()
    t0_files = {f["file_path"].removeprefix("file://").removeprefix("file:")
                for f in files if f["partition"]["topic"] == "t0"}
    assert t0_files and all(os.path.exists(f) for f in t0_files), files
    status, body = http("DELETE", f"{svc.http}/admin/v2/persistent/{ns}/t0")
    assert status == 204, body
    # The removal is committed; its files stay for the grace (5 s here).
    assert all(os.path.exists(f) for f in t0_files)
    with open(svc.log_path) as f:
        bounds = [int(m.group(1)) for m in re.finditer(
            rf"topic deleted.*?persistent://{ns}/t0\b.*?last_ledger=(\d+)", f.read())]
    assert bounds and bounds[-1] >= max(mid[0] for mid, _ in sent["t0"]), bounds

    def t0_gone():
        t = shared_table(svc, ns)
        left = t.scan(selected_fields=("topic",)).to_arrow().column("topic").to_pylist()
        assert "t0" not in left and left.count("t1") == len(sent["t1"])
    eventually(t0_gone, 60)

    # After the grace the finisher expires the snapshots before the removal and deletes t0's
    # files, not earlier; the other topics' files stay.
    def t0_files_gone():
        assert not any(os.path.exists(f) for f in t0_files)
        return time.time() * 1000
    gone_at = eventually(t0_files_gone, 60)
    t = shared_table(svc, ns)
    oldest = min(t.metadata.snapshots, key=lambda s: s.sequence_number)
    assert oldest.summary.operation.value == "delete", t.metadata.snapshots
    assert gone_at >= oldest.timestamp_ms + 5000, "deleted within the grace"
    kept = t.inspect.files().column("file_path").to_pylist()
    assert kept and all(os.path.exists(f.removeprefix("file://").removeprefix("file:"))
                        for f in kept)
    client.close()


def test_retention_in_a_shared_table_removes_only_the_expired_topics_files(make_service):
    ns = "public/kept"
    svc = shared_namespace(make_service, ns)
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    held = f"persistent://{ns}/held"
    free = f"persistent://{ns}/free"
    # A durable subscription that acknowledges nothing holds `held`'s data back.
    client.subscribe(held, "slow", initial_position=pulsar.InitialPosition.Earliest).close()
    # Ledger ids interleave between the two topics, and each topic's ledgers go in one file
    # (offload held until the end): `free`'s file spans ledger ids of `held` that stay.
    policy(svc, ns, "offloadThreshold", "-1")
    sent_held = []
    for _ in range(3):
        sent_held += produce(client, held, 45)
        produce(client, free, 45)
    policy(svc, ns, "offloadThreshold", "0")
    offload_and_wait(svc, held)
    offload_and_wait(svc, free)
    status, body = http("POST", f"{svc.http}/admin/v2/namespaces/{ns}/retention",
                        '{"retentionTimeInMinutes": 0, "retentionSizeInMB": -1}')
    assert status == 204, body

    def only_held_left():
        t = shared_table(svc, ns)
        # A scan planned on the snapshot before the removal reads files the removal dropped:
        # they stay for the grace (`lake.removed_file_grace`, 10 minutes by default).
        topics = t.scan(selected_fields=("topic",)).to_arrow().column("topic").to_pylist()
        assert "free" not in topics and topics.count("held") == len(sent_held), topics
    eventually(only_held_left, 120)
    assert read_all(client, held, len(sent_held)) == sent_held
    client.close()


def test_a_topic_whose_ledgers_cannot_be_read_does_not_hold_back_its_namespace(make_service):
    """One topic's unreadable ledgers (the disk under them fails: a failpoint keyed by topic)
    fail that topic alone: the shared table's other topics are committed without it, it rests
    before it is tried again (not at every pass), and it catches up once its ledgers read
    again (a restart without the fault) with every message intact."""
    ns = "public/iso"
    svc = make_service(dict(FAST, LL_FAILPOINTS="ledger.read@public/iso/bad=error"))
    svc.start()
    svc.create_namespace(ns)
    policy(svc, ns, "lakeTableLayout", "shared")
    policy(svc, ns, "offloadThreshold", "-1")
    good, bad = f"persistent://{ns}/good", f"persistent://{ns}/bad"
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    sent_good = produce(client, good, 45)
    sent_bad = produce(client, bad, 45)
    client.close()
    policy(svc, ns, "offloadThreshold", "0")
    offload_and_wait(svc, good)

    def lake_topics():
        t = shared_table(svc, ns)
        return t.scan(selected_fields=("topic",)).to_arrow().column("topic").to_pylist()

    def bad_failed_alone():
        topics = lake_topics()
        assert topics.count("good") == len(sent_good) and "bad" not in topics, topics
        _, st = http("GET", f"{svc.http}/admin/v2/persistent/{ns}/bad/offload")
        assert st["status"] == "ERROR" and "failpoint ledger.read" in st["lastError"], st
    eventually(bad_failed_alone, 60)

    def good_succeeded():
        # Between `bad`'s tries (a try shows every topic of its pass as running meanwhile).
        _, st = http("GET", f"{svc.http}/admin/v2/persistent/{ns}/good/offload")
        assert st["status"] == "SUCCESS" and st["lastError"] == "", st
    eventually(good_succeeded, 10)

    # The failing topic rests (5 s, then longer) instead of failing every pass (100 ms here).
    def failures():
        with open(svc.log_path) as f:
            return f.read().count("a ledger of the topic could not be read")
    before = failures()
    time.sleep(3)
    assert before >= 1 and failures() - before <= 1, (before, failures())
    # Tried again after its rest, it fails alone again, and the other topic's status stays
    # what its last commit made it.
    seen = failures()
    eventually(lambda: failures() > seen, 90)
    eventually(good_succeeded, 10)
    # A request for the failing topic completes (it does not keep its pass looping), with
    # the error in its status.
    st = offload_and_wait(svc, bad, timeout=60)
    assert st["status"] == "ERROR" and "failpoint ledger.read" in st["lastError"], st

    # Readable again, it catches up; nothing was lost or doubled.
    svc.stop()
    del svc.env["LL_FAILPOINTS"]
    svc.start()
    offload_and_wait(svc, bad)
    topics = lake_topics()
    assert (topics.count("good"), topics.count("bad")) == (len(sent_good), len(sent_bad)), topics
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    assert read_all(client, bad, len(sent_bad)) == sent_bad
    assert read_all(client, good, len(sent_good)) == sent_good
    client.close()
