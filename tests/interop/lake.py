"""Helpers of the lake tests: produce with the official client, trigger and wait for an offload
through the admin API, and read the table back with PyIceberg and DuckDB."""
import json
import os
import tempfile
import time
import urllib.request

import pulsar

from conftest import Sends, eventually


def http(method, url, body=None):
    req = urllib.request.Request(url, data=body.encode() if body is not None else None,
                                 method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read().decode()
            return r.status, (json.loads(text) if text else None)
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        return e.code, (json.loads(text) if text else None)


def topic_path(topic):
    """`persistent://t/ns/x` → `persistent/t/ns/x` for admin URLs."""
    return "persistent/" + topic.split("://", 1)[1]


def offload_and_wait(svc, topic, timeout=180):
    """Requests an offload of everything so far and waits for the pass after the request."""
    url = f"{svc.http}/admin/v2/{topic_path(topic)}/offload"
    status, body = http("PUT", url)
    assert status == 200, body
    ticket = body["request"]
    deadline = time.time() + timeout
    while time.time() < deadline:
        _, s = http("GET", url)
        if s["completedRequest"] >= ticket:
            return s
        time.sleep(0.1)
    raise AssertionError(f"offload of {topic} did not finish: {s}")


def stats(svc, topic):
    status, body = http("GET", f"{svc.http}/admin/v2/{topic_path(topic)}/stats")
    assert status == 200, body
    return body


def table_of(svc, topic):
    """The embedded SQL catalog of `svc`, the identifier of `topic`'s lake table and its
    location."""
    from pyiceberg.catalog.sql import SqlCatalog
    st = stats(svc, topic)
    catalog = SqlCatalog(st["lake"]["catalog"], uri=f"sqlite:///{svc.data_dir}/data/catalog.db",
                         warehouse="")
    ident = tuple(st["lake"]["namespace"]) + (st["lake"]["tableName"],)
    return catalog, ident, catalog.load_table(ident).metadata.location


def wait_acknowledged(svc, topic, sub, through, timeout=30):
    """Waits until the broker has the entries of subscription `sub` up to `through` (ledger,
    entry) acknowledged: its oldest unacknowledged entry (admin stats) comes after that."""
    def check():
        s = stats(svc, topic)["subscriptions"][sub]
        ledger, entry = s["markDeleteNext"].split(":")
        assert (int(ledger), int(entry)) > tuple(through), (s, through)
    eventually(check, timeout)


COMPRESSIONS = [pulsar.CompressionType.NONE, pulsar.CompressionType.LZ4,
                pulsar.CompressionType.ZLib, pulsar.CompressionType.ZSTD,
                pulsar.CompressionType.SNAPPY]


def produce_mixed(client, topic, per_kind=200):
    """Unbatched messages, then batched ones with every codec; keys, properties, event times."""
    n = 0
    for i, compression in enumerate([None] + COMPRESSIONS):
        batched = compression is not None
        producer = client.create_producer(
            topic, batching_enabled=batched, batching_max_messages=50,
            batching_max_publish_delay_ms=5, block_if_queue_full=True,
            compression_type=compression or pulsar.CompressionType.NONE)
        sends = Sends()
        for j in range(per_kind):
            payload = f"m{n}-{'ü' * (j % 5)}-{'x' * (j % 37)}".encode()
            kwargs = dict(properties={"n": str(n), "kind": str(i)}, event_timestamp=1_700_000_000_000 + n)
            if j % 3:
                kwargs["partition_key"] = f"key-{j % 11}"
            if batched:
                producer.send_async(payload, sends.callback(), **kwargs)
            else:
                producer.send(payload, **kwargs)
            n += 1
        sends.check(producer, per_kind if batched else 0)
        producer.close()
    return n


def read_all(client, topic, expected):
    """Every message of the topic as a consumer sees it: id → fields."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    out = {}
    while len(out) < expected:
        m = reader.read_next(timeout_millis=10000)
        mid = m.message_id()
        out[(mid.ledger_id(), mid.entry_id(), mid.batch_index())] = {
            "payload": m.data(),
            "key": m.partition_key() or None,
            "properties": dict(m.properties()),
            "publish_ms": m.publish_timestamp(),
            "event_ms": m.event_timestamp() or None,
        }
    reader.close()
    return out


def lake_rows(table):
    """The table's rows as id → fields, with the same shapes as `read_all`."""
    rows = table.scan().to_arrow().to_pylist()
    out = {}
    for r in rows:
        k = (r["ledger_id"], r["entry_id"], r["batch_index"])
        assert k not in out, f"duplicate row {k}"
        out[k] = {
            "payload": r["payload"],
            "key": r["key"],
            "properties": dict(r["properties"] or []),
            "publish_ms": int(r["publish_time"].timestamp() * 1000 + 0.5),
            "event_ms": int(r["event_time"].timestamp() * 1000 + 0.5) if r["event_time"] else None,
        }
    return out, rows


def duckdb_ids(table, fs=None):
    """(ledger, entry, batch index, md5(payload)) of every row, read by DuckDB from the data
    files the manifests list (never by globbing the warehouse)."""
    import duckdb
    files = table.inspect.files().column("file_path").to_pylist()
    assert files, "table has no data files"
    with tempfile.TemporaryDirectory() as d:
        local = []
        for i, f in enumerate(files):
            if f.startswith("file:"):
                local.append(f[len("file:"):])
            else:
                path = f.split("://", 1)[1]
                dst = os.path.join(d, f"{i}.parquet")
                with fs.open_input_stream(path) as src, open(dst, "wb") as out:
                    out.write(src.read())
                local.append(dst)
        con = duckdb.connect()
        rows = con.execute(
            "SELECT ledger_id, entry_id, batch_index, md5(payload) FROM read_parquet(?)",
            [local]).fetchall()
        con.close()
    return rows
