"""`ledgerlake verify` (issue 20) against a running service: a healthy topic passes with its
messages in every tier (lake only, lake and log, log only), with and without `--deep`; then
the lake is broken the ways a bad engine or a lost disk breaks it — every row appended again
by an outside engine (PyIceberg), a data file deleted — and verify names each duplicate, the
missing file and the gap it leaves, and exits non-zero."""
import json
import os
import subprocess
import uuid

import pulsar
from pyiceberg.catalog.sql import SqlCatalog

from conftest import _binary
from lake import offload_and_wait, produce_mixed, stats
from test_replay import set_policy, wait_all_deleted

FAST = {
    "LEDGERLAKE_LAKE__CHECK_INTERVAL": "100ms",
    "LEDGERLAKE_LEDGER__ROLLOVER_ENTRIES": "50",
}


def verify(svc, *args):
    return subprocess.run([_binary(), "verify", "--url", svc.http, *args],
                          capture_output=True, text=True, timeout=300)


def verify_json(svc, *args):
    r = verify(svc, "--json", *args)
    return r.returncode, json.loads(r.stdout), r


def table_of(svc, topic):
    st = stats(svc, topic)
    catalog = SqlCatalog(st["lake"]["catalog"], uri=f"sqlite:///{svc.data_dir}/data/catalog.db",
                         warehouse="")
    return catalog.load_table(tuple(st["lake"]["namespace"]) + (st["lake"]["tableName"],))


def healthy_topic(svc, client, name, deleted=True):
    """A topic with offloaded ledgers (deleted locally unless `deleted` is false), then
    messages only in the log."""
    topic = f"persistent://public/default/{name}-{uuid.uuid4().hex[:6]}"
    lake = produce_mixed(client, topic, per_kind=40)
    offload_and_wait(svc, topic)
    if deleted:
        wait_all_deleted(svc, topic)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(30):
        producer.send(f"tail-{i}".encode())
    producer.close()
    return topic, lake, 30


def test_a_healthy_topic_passes_in_every_tier(make_service):
    svc = make_service(FAST)
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    # Offloaded ledgers still in the log too: both tiers are read and compared, payloads
    # (unbatched, and batches under every codec) included.
    topic, lake, local = healthy_topic(svc, client, "verify-ok", deleted=False)
    code, doc, r = verify_json(svc, "--deep", topic)
    assert code == 0 and doc["clean"], r.stdout + r.stderr
    (report,) = doc["topics"]
    assert report["deep"] and report["findings"] == []
    (part,) = report["partitions"]
    assert part["rows_lake"] == lake
    assert part["messages_local"] == lake + local
    assert part["ledgers"] >= 2 and report["files_read"] >= 1

    # Then only in the lake (local copies deleted), the tail only in the log.
    set_policy(svc, "offloadDeletionLagMs", 0)
    wait_all_deleted(svc, topic)
    r = verify(svc, topic)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ok   " + topic), r.stdout
    code, doc, r = verify_json(svc, "--deep", topic)
    assert code == 0 and doc["clean"], r.stdout + r.stderr
    (part,) = doc["topics"][0]["partitions"]
    assert part["rows_lake"] == lake
    assert part["messages_local"] == local

    # --all walks tenants, namespaces and topics (partitions folded into their topic).
    client.create_producer("persistent://public/default/verify-parts-partition-0").close()
    code, doc, r = verify_json(svc, "--all")
    assert code == 0, r.stdout + r.stderr
    assert topic in {t["topic"] for t in doc["topics"]}

    missing = verify(svc, "persistent://public/default/no-such-topic")
    assert missing.returncode != 0 and "not found" in missing.stdout + missing.stderr
    client.close()


def test_duplicates_missing_files_and_gaps_are_named(make_service):
    svc = make_service(FAST)
    svc.start()
    set_policy(svc, "offloadDeletionLagMs", 0)
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)

    # An outside engine appends every row again: each message is a duplicate, in two files.
    topic, lake, _ = healthy_topic(svc, client, "verify-dup")
    table = table_of(svc, topic)
    before = set(table.inspect.files().column("file_path").to_pylist())
    table.append(table.scan().to_arrow())
    code, doc, r = verify_json(svc, topic)
    assert code == 1 and not doc["clean"], r.stdout + r.stderr
    found = doc["topics"][0]["findings"]
    dups = [f for f in found if f["kind"] == "duplicate"]
    assert len(dups) == lake, [f for f in found if f["kind"] != "duplicate"][:5]
    assert all(f["copies"] == 2 and len(f["files"]) == 2 for f in dups)
    assert {f["files"][0] for f in dups} | {f["files"][1] for f in dups} > before
    text = verify(svc, topic)
    assert text.returncode == 1 and text.stdout.startswith("FAIL " + topic)
    assert "duplicate: partition -1 ledger" in text.stdout

    # A data file lost: the file is named, and so are the messages that were only in it.
    topic, lake, _ = healthy_topic(svc, client, "verify-lost")
    files = table_of(svc, topic).inspect.files().column("file_path").to_pylist()
    lost = files[0]
    os.remove(lost[len("file:"):] if lost.startswith("file:") else lost)
    code, doc, r = verify_json(svc, topic)
    assert code == 1, r.stdout + r.stderr
    found = doc["topics"][0]["findings"]
    assert {"kind": "missing_file", "path": lost} in [
        {"kind": f["kind"], "path": f.get("path")} for f in found]
    gaps = [f for f in found if f["kind"] == "gap"]
    assert gaps and all(f["tier"] == "lake" for f in gaps), found
    deleted = {l["ledger"]["id"] for l in stats(svc, topic)["ledgers"]
               if l["ledger"]["state"] == "deleted"}
    assert {g["ledger"] for g in gaps} <= deleted
    client.close()
