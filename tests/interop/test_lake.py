"""Offload to Iceberg end to end with real parts: the official Python client produces, the
service offloads to a real S3 server (SeaweedFS) with the SQLite catalog and with a real
PostgreSQL catalog, and PyIceberg and DuckDB read back exactly what was produced."""
import hashlib
import os
import uuid

import pulsar
import pyarrow.parquet as pq
import pytest
from pulsar.schema import Array, AvroSchema, Integer, JsonSchema, Record, String
from pyiceberg.catalog.sql import SqlCatalog

from lake import (duckdb_ids, http, lake_rows, offload_and_wait, produce_mixed, read_all,
                  stats)


def load_table(catalog_uri, warehouse, props, st):
    catalog = SqlCatalog(st["lake"]["catalog"], uri=catalog_uri, warehouse=warehouse, **props)
    return catalog.load_table(tuple(st["lake"]["namespace"]) + (st["lake"]["tableName"],))


def check_round_trip(svc, client, topic, catalog_uri, warehouse, props, fs, per_kind,
                     catalog=None):
    n = produce_mixed(client, topic, per_kind)
    produced = read_all(client, topic, n)
    status = offload_and_wait(svc, topic)
    assert status["status"] == "SUCCESS", status
    assert status["firstUnoffloadedMessage"] is None, status
    st = stats(svc, topic)
    assert st["lake"]["tableExists"] and st["lake"]["snapshotId"], st
    assert st["lake"]["offloadLagBytes"] == 0
    if catalog is not None:
        table = catalog.load_table(tuple(st["lake"]["namespace"]) + (st["lake"]["tableName"],))
    else:
        table = load_table(catalog_uri, warehouse, props, st)
    rows, raw = lake_rows(table)
    assert rows.keys() == produced.keys()
    for k, want in produced.items():
        assert rows[k] == want, (k, rows[k], want)
    # DuckDB reads the committed data files and agrees row for row.
    from_duck = sorted(duckdb_ids(table, fs))
    from_iceberg = sorted((r["ledger_id"], r["entry_id"], r["batch_index"],
                           hashlib.md5(r["payload"]).hexdigest()) for r in raw)
    assert from_duck == from_iceberg
    # Each producer numbered its messages 0, 1, 2, … and the lake keeps those sequence ids.
    by_producer = {}
    for r in sorted(raw, key=lambda r: (r["ledger_id"], r["entry_id"], r["batch_index"])):
        by_producer.setdefault(r["producer_name"], []).append(r["sequence_id"])
    assert len(by_producer) == n // per_kind
    for name, seqs in by_producer.items():
        assert seqs == list(range(per_kind)), (name, seqs[:10])
    return table


def test_offload_to_s3_with_sqlite_catalog(make_service, s3_server):
    prefix = f"lake-{uuid.uuid4().hex[:8]}"
    svc = make_service(s3_server.service_env(prefix))
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    topic = f"persistent://public/default/orders-{uuid.uuid4().hex[:6]}"
    catalog_uri = f"sqlite:///{svc.data_dir}/data/catalog.db"
    table = check_round_trip(svc, client, topic, catalog_uri, f"s3://warehouse/{prefix}",
                             s3_server.pyiceberg_props(), s3_server.filesystem(), 200)
    assert table.metadata.location.startswith(f"s3://warehouse/{prefix}/public/default/")
    # Partitioned by day of publish_time, sorted by message id, ZSTD Parquet.
    assert [f.name for f in table.spec().fields] == ["publish_day"]
    assert [table.schema().find_column_name(f.source_id) for f in table.sort_order().fields] == \
        ["ledger_id", "entry_id", "batch_index"]
    snap = table.current_snapshot()
    assert "ledgerlake.watermark" in snap.summary.additional_properties
    assert "ledgerlake.ranges" in snap.summary.additional_properties
    # Every column chunk is ZSTD; sequence ids are delta-encoded, payloads skip dictionaries.
    fs = s3_server.filesystem()
    for f in table.inspect.files().column("file_path").to_pylist():
        with fs.open_input_file(f.split("://", 1)[1]) as src:
            meta = pq.ParquetFile(src).metadata
        for g in range(meta.num_row_groups):
            cols = {meta.row_group(g).column(c).path_in_schema: meta.row_group(g).column(c)
                    for c in range(meta.num_columns)}
            assert {c.compression for c in cols.values()} == {"ZSTD"}
            assert "DELTA_BINARY_PACKED" in cols["sequence_id"].encodings
            assert "RLE_DICTIONARY" not in cols["sequence_id"].encodings
            assert "RLE_DICTIONARY" not in cols["payload"].encodings
    client.close()
    assert svc.stop() == 0


def test_offload_with_postgres_catalog(make_service, s3_server, postgres):
    db = f"cat_{uuid.uuid4().hex[:8]}"
    uri = postgres.create_database(db)
    prefix = f"pg-{uuid.uuid4().hex[:8]}"
    env = dict(s3_server.service_env(prefix), LEDGERLAKE_LAKE__CATALOG__URI=uri)
    svc = make_service(env)
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    svc.create_namespace("acme/eu-west")
    topic = f"persistent://acme/eu-west/clicks-{uuid.uuid4().hex[:6]}"
    pg_uri = uri.replace("postgres://", "postgresql+psycopg2://")
    check_round_trip(svc, client, topic, pg_uri, f"s3://warehouse/{prefix}",
                     s3_server.pyiceberg_props(), s3_server.filesystem(), 60)
    client.close()
    assert svc.stop() == 0


def test_offload_with_rest_catalog(make_service, s3_server):
    """SeaweedFS's Iceberg REST catalog (OAuth2 client credentials), read back by PyIceberg's
    REST catalog."""
    svc = make_service(s3_server.rest_service_env())
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    topic = f"persistent://public/default/rest-{uuid.uuid4().hex[:6]}"
    check_round_trip(svc, client, topic, None, None, None, s3_server.filesystem(), 40,
                     catalog=s3_server.rest_catalog())
    client.close()
    assert svc.stop() == 0


class Customer(Record):
    name = String()
    city = String()


class Order(Record):
    id = Integer()
    key = String()
    tags = Array(String())
    customer = Customer()


class OrderV2(Record):
    id = Integer()
    key = String()
    tags = Array(String())
    customer = Customer()
    channel = String(required_default=True)


@pytest.mark.parametrize("schema_type", [JsonSchema, AvroSchema])
def test_typed_columns_evolution_and_bad_payloads(make_service, schema_type):
    svc = make_service()
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    topic = f"persistent://public/default/typed-{uuid.uuid4().hex[:6]}"
    p1 = client.create_producer(topic, schema=schema_type(Order))
    for i in range(5):
        p1.send(Order(id=i, key=f"k{i}", tags=["a", str(i)],
                      customer=Customer(name=f"c{i}", city="Oslo")))
    # Bytes that do not decode against the schema still land, flagged.
    raw = client.create_producer(topic)
    raw.send(b"\xffnot a valid payload")
    offload_and_wait(svc, topic)
    st = stats(svc, topic)
    catalog_uri = f"sqlite:///{svc.data_dir}/data/catalog.db"
    table = load_table(catalog_uri, "", {}, st)
    names = [f.name for f in table.schema().fields]
    # `key` collides with the envelope column and becomes `value_key`.
    assert names[-4:] == ["id", "value_key", "tags", "customer"], names
    assert "channel" not in names
    rows = table.scan().to_arrow().to_pylist()
    good = sorted((r for r in rows if r["decode_error"] is None), key=lambda r: r["id"])
    assert [(r["id"], r["value_key"], r["tags"], r["customer"]) for r in good] == [
        (i, f"k{i}", ["a", str(i)], {"name": f"c{i}", "city": "Oslo"}) for i in range(5)]
    bad = [r for r in rows if r["decode_error"] is not None]
    assert len(bad) == 1 and bad[0]["payload"] == b"\xffnot a valid payload"
    assert bad[0]["id"] is None and bad[0]["customer"] is None
    assert st["lake"]["badPayloads"] == 1

    # A compatible schema change adds its column; old rows read it as null.
    p2 = client.create_producer(topic, schema=schema_type(OrderV2))
    p2.send(OrderV2(id=9, key="k9", tags=[], customer=Customer(name="z", city="Rome"),
                    channel="web"))
    offload_and_wait(svc, topic)
    table = load_table(catalog_uri, "", {}, stats(svc, topic))
    assert [f.name for f in table.schema().fields][-1] == "channel"
    rows = table.scan().to_arrow().to_pylist()
    assert len(rows) == 7
    assert {r["id"]: r["channel"] for r in rows if r["id"] is not None} == \
        {0: None, 1: None, 2: None, 3: None, 4: None, 9: "web"}
    client.close()
    assert svc.stop() == 0


@pytest.mark.parametrize("failpoint", ["offload.before_commit", "offload.after_commit",
                                       "offload.before_mark"])
def test_crash_at_each_step_is_exactly_once(make_service, failpoint):
    env = {"LL_FAILPOINTS": failpoint, "LEDGERLAKE_LAKE__ORPHAN_FILE_AGE": "0s",
           "LEDGERLAKE_LAKE__POLICY_DEFAULTS__OFFLOAD_THRESHOLD_BYTES": "-1"}
    svc = make_service(env)
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    topic = f"persistent://public/default/crash-{uuid.uuid4().hex[:6]}"
    n = produce_mixed(client, topic, 50)
    produced = read_all(client, topic, n)
    client.close()
    url = f"{svc.http}/admin/v2/persistent/public/default/{topic.rsplit('/', 1)[1]}/offload"
    assert http("PUT", url)[0] == 200
    svc.proc.wait(timeout=120)
    assert svc.proc.returncode != 0, "the failpoint did not fire"
    assert failpoint in open(svc.log_path).read()

    # Restart without the failpoint: the next offload finishes the job exactly once.
    svc.env.pop("LL_FAILPOINTS")
    svc.start()
    status = offload_and_wait(svc, topic)
    assert status["status"] == "SUCCESS", status
    assert status["firstUnoffloadedMessage"] is None
    st = stats(svc, topic)
    catalog_uri = f"sqlite:///{svc.data_dir}/data/catalog.db"
    table = load_table(catalog_uri, "", {}, st)
    rows, _ = lake_rows(table)
    assert rows.keys() == produced.keys()
    for k, want in produced.items():
        assert rows[k] == want
    # Every ledger is recorded offloaded, and no unreferenced data file is left.
    states = {l["ledger"]["state"] for l in st["ledgers"] if l["ledger"]["entry_count"]}
    assert states <= {"offloaded", "open"}, st["ledgers"]
    referenced = {f[len("file:"):] for f in table.inspect.files().column("file_path").to_pylist()}
    data_dir = table.metadata.location[len("file:"):] + "/data"
    on_disk = {os.path.join(dp, f) for dp, _, fs in os.walk(data_dir) for f in fs}
    assert on_disk == referenced, on_disk ^ referenced
    assert svc.stop() == 0
