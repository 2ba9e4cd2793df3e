"""Retention (Pulsar's namespace `retention` policy) applied to the log and the lake, with real
parts: the official Python client produces and consumes, the service offloads to a local-disk
warehouse with the SQLite catalog, to a real S3 server with a real PostgreSQL catalog, and to
that S3 server's Iceberg REST catalog; PyIceberg reads the table back. Consumed ledgers beyond
the limit leave the log; the table drops their files in a `delete` snapshot; after the grace
(`lake.removed_file_grace`), during which the earlier snapshots still read every row, older
snapshots are expired and the files are deleted.
Unconsumed messages are never removed; consumers and SQL see the topic start later. With the
lake disabled, the same policy applies to the log alone."""
import time
import uuid

import pulsar
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from lake import http, offload_and_wait, stats, topic_path

GRACE_S = 20
FAST = {"LEDGERLAKE_LAKE__CHECK_INTERVAL": "100ms", "LEDGERLAKE_LEDGER__ROLLOVER_ENTRIES": "20",
        "LEDGERLAKE_BROKER__CURSOR_PERSIST_INTERVAL": "100ms",
        "LEDGERLAKE_BROKER__RETENTION_CHECK_INTERVAL": "100ms",
        "LEDGERLAKE_LAKE__REMOVED_FILE_GRACE": f"{GRACE_S}s"}
NS = "admin/v2/namespaces/public/default"


def offload_status(svc, topic):
    status, body = http("GET", f"{svc.http}/admin/v2/{topic_path(topic)}/offload")
    assert status == 200, body
    return body


def wait_for(what, check, timeout=60):
    deadline = time.time() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def produce(client, topic, first, n):
    p = client.create_producer(topic, batching_enabled=False)
    for i in range(first, first + n):
        p.send(f"m{i}".encode())
    p.close()


def receive(consumer, n):
    out = []
    for _ in range(n):
        m = consumer.receive(timeout_millis=20000)
        consumer.acknowledge(m)
        out.append(m)
    return out


def consumers_start_after_the_expired(client, topic, first_ledger):
    """After m0..m39 expired (m0..m49 acked by `slow`): a new subscription gets m40..m99,
    starting in `first_ledger`; `slow` resumes at m50."""
    fresh = client.subscribe(topic, "fresh", initial_position=pulsar.InitialPosition.Earliest)
    got = receive(fresh, 60)
    assert [m.data() for m in got] == [f"m{i}".encode() for i in range(40, 100)]
    assert got[0].message_id().ledger_id() == first_ledger
    slow = client.subscribe(topic, "slow")
    assert slow.receive(timeout_millis=20000).data() == b"m50"
    slow.close()
    fresh.close()


def restart_and_read_first(svc, topic, expected):
    """A restart keeps what retention did: a reader from the earliest gets `expected` first."""
    assert svc.stop() == 0
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    r = client.create_reader(topic, pulsar.MessageId.earliest)
    assert r.read_next(timeout_millis=20000).data() == expected
    client.close()
    assert svc.stop() == 0


def the_table(svc, topic, catalog_of):
    """The topic's stats, its catalog (PyIceberg), the table's identifier and the table."""
    st = stats(svc, topic)
    catalog = catalog_of(st)
    ident = tuple(st["lake"]["namespace"]) + (st["lake"]["tableName"],)
    return st, catalog, ident, catalog.load_table(ident)


def data_files(table):
    return set(table.inspect.files().column("file_path").to_pylist())


def test_deleted_ledgers_are_looked_at_for_retention_only_where_it_is_finite(make_service):
    """Ledgers deleted locally stay in that state for good (the lake holds them), so the
    offload scheduler lists them for retention only every `broker.retention_check_interval`
    (here an hour), at once when the namespaces with a finite retention change, and visits
    only tables of those namespaces. Before, once any namespace had a finite retention, every
    tick (100 ms here) listed every deleted ledger and visited every table holding one."""
    svc = make_service(dict(FAST, LEDGERLAKE_BROKER__RETENTION_CHECK_INTERVAL="1h"))
    svc.start()
    svc.create_namespace("public/finite")
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    kept = f"persistent://public/default/kept-{uuid.uuid4().hex[:6]}"
    goes = f"persistent://public/finite/goes-{uuid.uuid4().hex[:6]}"
    for ns in ("public/default", "public/finite"):
        assert http("PUT", f"{svc.http}/admin/v2/namespaces/{ns}/offloadDeletionLagMs", "0")[0] == 204
    for topic in (kept, goes):
        produce(client, topic, 0, 40)  # two full ledgers, rolled at 20 entries
        offload_and_wait(svc, topic)
        wait_for("every full ledger deleted locally", lambda: all(
            l["ledger"]["state"] in ("deleted", "open")
            for l in stats(svc, topic)["ledgers"] if l["ledger"]["entry_count"] > 0))
    # Retention becomes finite in one namespace: its table is looked at at once, though the
    # check interval is an hour, and its (unconsumed: no subscription) ledgers expire.
    assert http("POST", f"{svc.http}/admin/v2/namespaces/public/finite/retention",
                '{"retentionTimeInMinutes": 0, "retentionSizeInMB": -1}')[0] == 204
    # (An expired ledger leaves the topic's list of ledgers.)
    wait_for("the finite namespace's ledgers expired", lambda: not [
        l for l in stats(svc, goes)["ledgers"] if l["ledger"]["entry_count"] > 0], timeout=30)
    # The other namespace keeps everything: its table is not visited tick after tick.
    runs = offload_status(svc, kept)["runs"]
    time.sleep(3)  # 30 ticks
    assert offload_status(svc, kept)["runs"] == runs
    states = [l["ledger"]["state"] for l in stats(svc, kept)["ledgers"]
              if l["ledger"]["entry_count"] > 0]
    assert states and set(states) == {"deleted"}, states
    client.close()


def test_retention_policy_endpoint(make_service):
    svc = make_service(FAST)
    svc.start()
    url = f"{svc.http}/{NS}/retention"
    assert http("GET", url) == (200, {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
    assert http("POST", url, '{"retentionTimeInMinutes": 60, "retentionSizeInMB": 10}')[0] == 204
    assert http("GET", url) == (200, {"retentionTimeInMinutes": 60, "retentionSizeInMB": 10})
    status, body = http("POST", url, '{"retentionTimeInMinutes": -5, "retentionSizeInMB": 1}')
    assert status == 400, body
    status, body = http("POST", url, "sixty")
    assert status == 400 and "retentionTimeInMinutes" in body["reason"], body
    assert http("DELETE", url)[0] == 204
    assert http("GET", url) == (200, {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
    assert svc.stop() == 0


def local_lake(make_service, tmp):
    svc = make_service(FAST)
    svc.start()

    def catalog(st):
        return SqlCatalog(st["lake"]["catalog"], uri=f"sqlite:///{svc.data_dir}/data/catalog.db",
                          warehouse="")

    def stored(location):
        import os
        path = location.removeprefix("file:").removeprefix("//")
        return {"file:" + os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs}

    return svc, catalog, stored


def s3_postgres_lake(make_service, s3_server, postgres):
    uri = postgres.create_database(f"ret_{uuid.uuid4().hex[:8]}")
    prefix = f"ret-{uuid.uuid4().hex[:8]}"
    svc = make_service(dict(FAST, LEDGERLAKE_LAKE__CATALOG__URI=uri,
                            **s3_server.service_env(prefix)))
    svc.start()
    fs = s3_server.filesystem()

    def catalog(st):
        return SqlCatalog(st["lake"]["catalog"],
                          uri=uri.replace("postgres://", "postgresql+psycopg2://"),
                          warehouse=f"s3://warehouse/{prefix}", **s3_server.pyiceberg_props())

    def stored(location):
        from pyarrow.fs import FileSelector
        base = location.removeprefix("s3://")
        infos = fs.get_file_info(FileSelector(base, recursive=True, allow_not_found=True))
        return {"s3://" + i.path for i in infos if i.is_file}

    return svc, catalog, stored


def s3_rest_lake(make_service, s3_server):
    svc = make_service(dict(FAST, **s3_server.rest_service_env()))
    svc.start()
    fs = s3_server.filesystem()

    def catalog(st):
        return s3_server.rest_catalog()

    def stored(location):
        from pyarrow.fs import FileSelector
        base = location.removeprefix("s3://")
        infos = fs.get_file_info(FileSelector(base, recursive=True, allow_not_found=True))
        return {"s3://" + i.path for i in infos if i.is_file}

    return svc, catalog, stored


@pytest.mark.parametrize("where", ["local-sqlite", "s3-postgres", "s3-rest"])
def test_retention_removes_consumed_ledgers_from_log_and_lake(make_service, tmp_path, where,
                                                               request):
    if where == "local-sqlite":
        svc, catalog_of, stored = local_lake(make_service, tmp_path)
    elif where == "s3-rest":
        svc, catalog_of, stored = s3_rest_lake(make_service, request.getfixturevalue("s3_server"))
    else:
        svc, catalog_of, stored = s3_postgres_lake(
            make_service, request.getfixturevalue("s3_server"),
            request.getfixturevalue("postgres"))
    assert http("PUT", f"{svc.http}/{NS}/offloadDeletionLagMs", "0")[0] == 204
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    topic = f"persistent://public/default/kept-{uuid.uuid4().hex[:6]}"
    slow = client.subscribe(topic, "slow", initial_position=pulsar.InitialPosition.Earliest)
    # Two commits: ledgers of m0..m39, then ledgers of m40..m99 (20 entries per ledger).
    produce(client, topic, 0, 40)
    offload_and_wait(svc, topic)
    produce(client, topic, 40, 60)
    offload_and_wait(svc, topic)
    st, catalog, ident, table = the_table(svc, topic, catalog_of)
    assert len(table.scan().to_arrow()) == 100
    files_before = data_files(table)
    ledgers_before = [l["ledger"]["id"] for l in st["ledgers"]]
    wait_for("local copies deleted", lambda: all(
        l["ledger"]["state"] in ("deleted", "open") for l in stats(svc, topic)["ledgers"]))

    # Everything is older than 0 minutes, but nothing is consumed: nothing goes.
    assert http("POST", f"{svc.http}/{NS}/retention",
                '{"retentionTimeInMinutes": 0, "retentionSizeInMB": -1}')[0] == 204
    runs = offload_status(svc, topic)["runs"]
    wait_for("three passes", lambda: offload_status(svc, topic)["runs"] >= runs + 3)
    assert offload_status(svc, topic)["retention"]["expiredLedgers"] == 0
    assert len(catalog.load_table(ident).scan().to_arrow()) == 100

    # The slow subscription consumes m0..m49: the two ledgers of m0..m39 are wholly consumed.
    got = receive(slow, 50)
    assert [m.data() for m in got] == [f"m{i}".encode() for i in range(50)]
    slow.close()
    status = wait_for("retention removed files", lambda: (
        lambda s: s if s["retention"]["removedFiles"] > 0 else None)(offload_status(svc, topic)))
    assert status["retention"]["expiredLedgers"] == 2, status
    assert status["retention"]["removedRows"] == 40, status
    assert status["retention"]["lastError"] == "", status
    assert status["status"] == "SUCCESS", status

    # Within the grace: the `delete` snapshot is current, and a reader of the snapshot before
    # it (planned before the removal) still reads every row: no file is gone yet.
    table = catalog.load_table(ident)
    removal = table.current_snapshot()
    assert removal.summary.operation.value == "delete", removal.summary
    assert time.time() * 1000 < removal.timestamp_ms + GRACE_S * 1000 / 2, \
        "the removal was seen too late to check its grace"
    before = table.scan(snapshot_id=removal.parent_snapshot_id).to_arrow()
    assert len(before) == 100
    assert len(table.metadata.snapshots) > 1
    assert (files_before - data_files(table)) <= stored(table.metadata.location + "/data")
    assert time.time() * 1000 < removal.timestamp_ms + GRACE_S * 1000, \
        "the check outlasted the grace"

    # After it: m40..m99 only, older snapshots expired, files deleted; not before the grace.
    table = wait_for("the removal finished", lambda: (
        lambda t: t if len(t.metadata.snapshots) == 1 else None)(catalog.load_table(ident)))
    assert time.time() * 1000 >= removal.timestamp_ms + GRACE_S * 1000
    rows = table.scan().to_arrow().sort_by([("ledger_id", "ascending"),
                                            ("entry_id", "ascending")]).to_pylist()
    assert [r["payload"] for r in rows] == [f"m{i}".encode() for i in range(40, 100)]
    assert table.current_snapshot().summary.operation.value == "delete"
    assert "ledgerlake.watermark" in table.current_snapshot().summary.additional_properties
    assert len(table.metadata.snapshots) == 1, table.metadata.snapshots
    files_after = data_files(table)
    removed = files_before - files_after
    assert removed and files_after < files_before
    on_storage = stored(table.metadata.location + "/data")
    assert not (removed & on_storage), removed & on_storage
    assert files_after <= on_storage

    # The log: the expired ledgers are gone from the topic.
    ledgers = [l["ledger"]["id"] for l in stats(svc, topic)["ledgers"]]
    assert ledgers == ledgers_before[2:], (ledgers, ledgers_before)

    # Consumers: a new subscription starts at m40 (from the lake); `slow` resumes at m50.
    consumers_start_after_the_expired(client, topic, ledgers[0])

    # SQL sees what the lake and the log still hold.
    status, body = http("POST", f"{svc.http}/sql",
                        f'SELECT count(*) AS n, min(ledger_id) AS lo FROM "{topic.split("/")[-1]}"')
    assert status == 200, body
    assert body == [{"n": 60, "lo": ledgers[0]}], body

    client.close()
    restart_and_read_first(svc, topic, b"m40")


def test_retention_without_a_lake_expires_consumed_ledgers_from_the_log(make_service):
    """`lake.enabled = false`: no offload engine, the log alone keeps to the policy."""
    svc = make_service({"LEDGERLAKE_LAKE__ENABLED": "false",
                        "LEDGERLAKE_BROKER__RETENTION_CHECK_INTERVAL": "100ms",
                        "LEDGERLAKE_LEDGER__ROLLOVER_ENTRIES": "20",
                        "LEDGERLAKE_BROKER__CURSOR_PERSIST_INTERVAL": "100ms"})
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    topic = f"persistent://public/default/nolake-{uuid.uuid4().hex[:6]}"
    slow = client.subscribe(topic, "slow", initial_position=pulsar.InitialPosition.Earliest)
    produce(client, topic, 0, 100)
    before = stats(svc, topic)
    ledgers_before = [l["ledger"]["id"] for l in before["ledgers"]]
    assert len(ledgers_before) >= 5, ledgers_before

    # Everything is older than 0 minutes, but nothing is consumed: nothing goes.
    assert http("POST", f"{svc.http}/{NS}/retention",
                '{"retentionTimeInMinutes": 0, "retentionSizeInMB": -1}')[0] == 204
    time.sleep(1.5)  # ≥ 10 passes
    assert [l["ledger"]["id"] for l in stats(svc, topic)["ledgers"]] == ledgers_before

    # m0..m49 consumed: the two ledgers of m0..m39 are wholly consumed and expire.
    got = receive(slow, 50)
    assert [m.data() for m in got] == [f"m{i}".encode() for i in range(50)]
    slow.close()
    wait_for("two ledgers expired", lambda: [
        l["ledger"]["id"] for l in stats(svc, topic)["ledgers"]] == ledgers_before[2:])
    after = stats(svc, topic)
    assert after["entries"] == 60, after
    assert 0 < after["storageSize"] < before["storageSize"], (after, before)
    time.sleep(0.5)  # more passes change nothing: m40..m49 share a ledger with unconsumed m50
    assert [l["ledger"]["id"] for l in stats(svc, topic)["ledgers"]] == ledgers_before[2:]

    # A new subscription starts at m40, the slow one resumes at m50.
    consumers_start_after_the_expired(client, topic, ledgers_before[2])
    client.close()
    restart_and_read_first(svc, topic, b"m40")


def test_old_snapshots_expire_by_the_tables_history_properties(make_service, tmp_path):
    """Every offload commit adds a snapshot; those older than the table's
    `history.expire.max-snapshot-age-ms` expire (keeping `min-snapshots-to-keep`), at most one
    expiry per 8 expirable snapshots. No row is lost and nothing is committed twice."""
    svc, catalog_of, _ = local_lake(make_service, tmp_path)
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    topic = f"persistent://public/default/history-{uuid.uuid4().hex[:6]}"
    produce(client, topic, 0, 1)
    offload_and_wait(svc, topic)
    _, catalog, ident, table = the_table(svc, topic, catalog_of)
    with table.transaction() as tx:
        tx.set_properties({"history.expire.max-snapshot-age-ms": "1",
                           "history.expire.min-snapshots-to-keep": "2"})
    counts = []
    for i in range(1, 11):
        produce(client, topic, i, 1)
        offload_and_wait(svc, topic)
        counts.append(len(catalog.load_table(ident).metadata.snapshots))
    # Snapshots 1..9 are kept (fewer than 8 expirable beyond the newest 2); the 10th commit
    # makes 8 expirable and they go; the 11th adds one.
    assert counts == [2, 3, 4, 5, 6, 7, 8, 9, 2, 3], counts
    table = catalog.load_table(ident)
    assert "ledgerlake.watermark" in table.current_snapshot().summary.additional_properties
    rows = table.scan().to_arrow().sort_by([("ledger_id", "ascending"),
                                            ("entry_id", "ascending")]).to_pylist()
    assert [r["payload"] for r in rows] == [f"m{i}".encode() for i in range(11)]

    # After a restart, nothing is committed again (the watermark survived the expiry).
    client.close()
    assert svc.stop() == 0
    svc.start()
    offload_and_wait(svc, topic)
    assert len(catalog.load_table(ident).scan().to_arrow()) == 11
    assert svc.stop() == 0
