"""Differential SQL: ledgerlake's answers (through the real `psql` and HTTP `POST /sql`) against
DuckDB's over the SAME committed Iceberg tables, for a hand-written corpus and a few hundred
seeded generated queries; and a live-tail check against what the producer had acknowledged.

The data: `events` (raw JSON-ish payloads from a batched and an unbatched producer: keys with
NULLs, empty strings and non-ASCII, properties, event times over three days, a few payloads
that are not JSON), `sales` (a JSON schema, three partitions: typed columns of every primitive
kind, a struct, a list and a map) and `users` (an Avro schema), each produced in phases with
an offload after each phase (so several data files), everything offloaded before DuckDB reads.
`readings` (a JSON schema) is left half in the lake, half only in the log: the live-tail test
checks it against the acknowledged sends, and the generated queries also run on it against
DuckDB over ledgerlake's own unfiltered read of it (so its filters, pushed down to the lake scan
and to the live tail, are checked too).

DuckDB reads the tables with `read_parquet` over the data files of the current snapshot as
PyIceberg lists them (`sqlgen.DuckSide`): DuckDB's own Iceberg reader needs the `iceberg` and
`avro` extensions, which cannot be downloaded here and are not published on PyPI for the
pinned duckdb 2.0.1 (`duckdb-ext-iceberg` stops at 1.4.4, `duckdb-extension-iceberg` at 1.5.5).

Environment: `LL_SQL_GEN_QUERIES` (default 300) generated queries, `LL_SQL_GEN_SEED` (an
integer, or `random`; default fixed) the generator's seed, printed with every failure.
"""
import datetime
import json
import os
import random
import re
import time

import pulsar
import pytest
from pulsar.schema import (Array, AvroSchema, Boolean, Double, Float, Integer, JsonSchema, Long,
                           Map, Record, String)

from conftest import Sends, Service, _binary
from lake import http, offload_and_wait, stats, topic_path
from sqlgen import (DuckSide, Generator, Ledgerlake, Query, QueryError, Col, Spec, check_many,
                    compare, profile)

FAST = {"LEDGERLAKE_LAKE__CHECK_INTERVAL": "100ms"}
EVENTS_PHASES = (1000, 1000, 1000)
SALES_PHASES = (900, 900)
USERS = 40
TAIL_LAKE, TAIL_LOG = 1200, 800
REGIONS = ["eu", "us", "ap", "sa"]


# ----------------------------------------------------------------------------- the data

class Customer(Record):
    cid = Integer()
    tier = String()


class Sale(Record):
    amount = Integer()
    price = Double()
    qty = Long()
    ratio = Float()
    weight = Double()
    region = String()
    active = Boolean()
    note = String()
    customer = Customer()
    tags = Array(String())
    attrs = Map(String())


class User(Record):
    name = String()
    age = Integer()
    score = Double()
    country = String()
    vip = Boolean()


class Reading(Record):
    device = String()
    value = Integer()
    temp = Double()


def event_key(i):
    if i % 9 == 0:
        return None
    if i % 50 == 1:
        return ""
    if i % 11 == 2:
        return f"ключ-{i % 5}"
    if i % 13 == 3:
        return f"日本-{i % 3}"
    return f"user-{i % 23}"


def event_message(i):
    """(payload, send kwargs) of events message `i`."""
    kwargs = {}
    key = event_key(i)
    if key is not None:
        kwargs["partition_key"] = key
    if i % 10:
        props = {"region": REGIONS[i % 4], "n": str(i),
                 "tier": "gold" if i % 7 == 0 else "std"}
        if i % 13 == 0:
            props["flag"] = ""
        kwargs["properties"] = props
    if i % 6:
        # Three days around 2023-11-15, to the millisecond.
        kwargs["event_timestamp"] = 1_699_990_000_000 + (i * 7919 % 250_000) * 1000 + i % 1000
    if i % 41 == 0:
        return f"plain text {i} ü".encode(), kwargs
    doc = {"i": i, "user": f"u{i % 37}", "amount": (i * 37) % 1000 - 200,
           "price": ((i * 13) % 1000) / 8, "ok": i % 3 == 0,
           "tags": [f"t{i % 4}", f"t{i % 5}"][: 1 + i % 2],
           "nested": {"a": i % 5, "b": f"x{i % 4}"}}
    if i % 4 == 0:
        doc["opt"] = None
    if i % 5 == 0:
        doc["embedded"] = json.dumps({"z": i % 3, "w": f"e{i % 2}"})
    elif i % 4 == 1:
        doc["opt"] = f"o{i % 3}"
    return json.dumps(doc, ensure_ascii=i % 2 == 0).encode(), kwargs


def sale(i):
    return Sale(amount=i, price=((i * 7) % 500) * 1.25 - 100, qty=i * 1_000_003,
                ratio=(i % 17) / 3, weight=(i % 17) / 3, region=[*REGIONS, None][i % 5],
                active=i % 3 == 0,
                note=None if i % 4 == 0 else ("" if i % 4 == 1 else f"n{i % 10}"),
                customer=None if i % 9 == 0 else Customer(cid=i % 7,
                                                          tier="gold" if i % 5 == 0 else "std"),
                tags=[f"t{i % 3}", "x"][: 1 + i % 2], attrs={"a": str(i % 4)} if i % 6 else {})


def reading(i):
    return Reading(device=f"dev-{i % 7}", value=(i * 31) % 997 - 300, temp=(i % 50) / 4)


def quiet_client(svc):
    return pulsar.Client(svc.url, operation_timeout_seconds=30,
                         logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))


def produce_events(client, first, count):
    topic = "persistent://public/default/events"
    batched = client.create_producer(topic, batching_enabled=True, batching_max_messages=50,
                                     batching_max_publish_delay_ms=5, block_if_queue_full=True,
                                     compression_type=pulsar.CompressionType.LZ4)
    single = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
    sends = {id(batched): Sends(), id(single): Sends()}
    counts = {id(batched): 0, id(single): 0}
    for i in range(first, first + count):
        p = single if i % 3 == 0 else batched
        payload, kwargs = event_message(i)
        p.send_async(payload, sends[id(p)].callback(), **kwargs)
        counts[id(p)] += 1
    for p in (batched, single):
        sends[id(p)].check(p, counts[id(p)])
        p.close()


def produce_records(client, topic, schema, make, first, count, key=None, **opts):
    p = client.create_producer(topic, schema=schema, block_if_queue_full=True,
                               batching_enabled=True, batching_max_messages=40,
                               batching_max_publish_delay_ms=5, **opts)
    sends = Sends()
    for i in range(first, first + count):
        kwargs = {"event_timestamp": 1_700_000_000_000 + i * 1000}
        k = key(i) if key else None
        if k is not None:
            kwargs["partition_key"] = k
        p.send_async(make(i), sends.callback(), **kwargs)
    sends.check(p, count)
    p.close()


def offload_all(svc, topics):
    """Requests an offload of every topic, then waits for each."""
    for t in topics:
        status, body = http("PUT", f"{svc.http}/admin/v2/{topic_path(t)}/offload")
        assert status == 200, body
    for t in topics:
        offload_and_wait(svc, t)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """One service; `events`, `sales`, `users` fully offloaded; DuckDB over their tables;
    `readings` half in the lake and half only in the log."""
    d = tmp_path_factory.mktemp("sqldiff")
    svc = Service(_binary(), str(d), env=FAST)
    svc.start()
    duck = None
    try:
        status, body = http(
            "PUT", f"{svc.http}/admin/v2/persistent/public/default/sales/partitions", "3")
        assert status in (200, 204), body
        client = quiet_client(svc)
        events = "persistent://public/default/events"
        sales = "persistent://public/default/sales"
        users = "persistent://public/default/users"
        first = 0
        for phase, n in enumerate(EVENTS_PHASES):
            produce_events(client, first, n)
            first += n
            topics = [events]
            if phase < len(SALES_PHASES):
                s0 = sum(SALES_PHASES[:phase])
                produce_records(client, sales, JsonSchema(Sale), sale, s0, SALES_PHASES[phase],
                                key=lambda i: f"user-{i % 23}" if i % 8 else None)
                topics.append(sales)
            if phase == 0:
                produce_records(client, users, AvroSchema(User),
                                lambda j: User(name=f"u{j}", age=18 + j * 7 % 60,
                                               score=None if j % 10 == 3 else j * 2.5,
                                               country=["NO", "DE", "JP", None][j % 4],
                                               vip=j % 5 == 0),
                                0, USERS, key=lambda j: f"u{j}")
                topics.append(users)
            offload_all(svc, topics)
        readings_lake = produce_readings(client, 0, TAIL_LAKE)
        readings_offload = offload_and_wait(svc, READINGS)
        readings_log = produce_readings(client, TAIL_LAKE, TAIL_LOG)
        client.close()

        from pyiceberg.catalog.sql import SqlCatalog
        catalog = SqlCatalog("ledgerlake", uri=f"sqlite:///{d}/data/catalog.db", warehouse="")
        tables = {name: catalog.load_table(("public", "default", name))
                  for name in ("events", "sales", "users")}
        duck = DuckSide(tables)
        ll = Ledgerlake(svc)
        # `readings` (half of it only in the log) as ledgerlake reads it whole: the generated
        # queries' filters, pushed down to the lake scan and the live tail, must select from
        # it what DuckDB selects from this copy (the whole table is checked against the
        # acknowledged sends by test_live_tail_matches_acknowledged_sends).
        duck.con.register("readings_copy", ll.http("SELECT * FROM readings"))
        duck.con.execute("CREATE VIEW readings AS SELECT * FROM readings_copy")
        # Everything is in the lake: DuckDB (which reads only the lake) and ledgerlake (lake
        # and tail) count what was produced.
        produced = {"events": sum(EVENTS_PHASES), "sales": sum(SALES_PHASES), "users": USERS}
        for name, n in produced.items():
            assert duck.run(f"SELECT count(*) FROM {name}") == [(n,)], name
            assert ll.run(f"SELECT count(*) FROM {name}", ("http",))[1]["http"] == [(n,)], name
        yield {"svc": svc, "ll": ll, "duck": duck, "catalog": catalog,
               "readings": (readings_lake, readings_log, readings_offload),
               "lits": literals(duck)}
    finally:
        if duck is not None:
            duck.close()
        code = svc.stop()
        assert code == 0, open(svc.log_path).read()[-4000:]


READINGS = "persistent://public/default/readings"


def produce_readings(client, first, count):
    """Readings `first..first+count` from a batched and an unbatched producer; returns the
    acknowledged ones as (i, key)."""
    acked = []
    batched = client.create_producer(READINGS, schema=JsonSchema(Reading),
                                     batching_enabled=True, batching_max_messages=25,
                                     batching_max_publish_delay_ms=5, block_if_queue_full=True)
    single = client.create_producer(READINGS, schema=JsonSchema(Reading),
                                    batching_enabled=False, block_if_queue_full=True)
    sends = {id(batched): Sends(), id(single): Sends()}
    sent = {id(batched): [], id(single): []}
    for i in range(first, first + count):
        p = single if i % 4 == 0 else batched
        key = None if i % 10 == 0 else f"dev-{i % 7}"
        kwargs = {"partition_key": key} if key else {}
        p.send_async(reading(i), sends[id(p)].callback(), **kwargs)
        sent[id(p)].append((i, key))
    for p in (batched, single):
        sends[id(p)].check(p, len(sent[id(p)]))  # every send acknowledged
        acked += sent[id(p)]
        p.close()
    return acked


def literals(duck):
    """Data-dependent literals for the corpus (publish times, ledger ids)."""
    lits = {}
    ledgers = [r[0] for r in duck.run("SELECT DISTINCT ledger_id FROM events ORDER BY 1")]
    assert len(ledgers) >= 3, ledgers
    lits["L1"], lits["L2"], lits["L3"] = ledgers[0], ledgers[len(ledgers) // 2], ledgers[-1]
    pts = [r[0][1] for r in duck.run(
        "SELECT DISTINCT publish_time FROM events ORDER BY 1")]

    def ts(us):
        dt = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc) + \
            datetime.timedelta(microseconds=us)
        return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    lits["pt_min"] = ts(pts[0])
    lits["pt_q1"] = ts(pts[len(pts) // 4])
    lits["pt_mid"] = ts(pts[len(pts) // 2])
    lits["pt_max"] = ts(pts[-1])
    lits["pt_mid_naive"] = lits["pt_mid"].replace("T", " ").rstrip("Z")
    return lits


# ----------------------------------------------------------------------------- the corpus

IDS = "ledger_id, entry_id, batch_index"
# Payload as text: DataFusion casts binary to UTF-8; DuckDB's decode() does (its CAST would
# escape non-ASCII bytes). The J* macros (sqlgen.DuckSide) give functions-json's semantics.
LLP = "CAST(payload AS VARCHAR)"


def q(name, ll, duck=None, ordered=False):
    return Query(name, ll, duck, ordered)


CORPUS = [
    # --- aggregates without GROUP BY
    q("agg-counts", "SELECT count(*), count(key), count(event_time), count(payload), "
      "count(entry_metadata), count(message_metadata), count(ordering_key) FROM events"),
    q("agg-id-ranges", "SELECT min(ledger_id), max(ledger_id), min(entry_id), max(entry_id), "
      "min(batch_index), max(batch_index), min(batch_size), max(batch_size), min(partition), "
      "max(partition) FROM events"),
    q("agg-times", "SELECT min(publish_time), max(publish_time), min(event_time), "
      "max(event_time) FROM events"),
    q("agg-sequence", "SELECT sum(sequence_id), avg(sequence_id), min(sequence_id), "
      "max(sequence_id), count(DISTINCT sequence_id) FROM events"),
    q("agg-typed", "SELECT sum(amount), avg(price), min(ratio), max(ratio), sum(qty), "
      "sum(price), stddev_samp(price), var_pop(price), min(region), max(note) FROM sales"),
    q("agg-filter-clause", "SELECT count(*) FILTER (WHERE active), "
      "count(*) FILTER (WHERE NOT active), sum(amount) FILTER (WHERE region = 'eu'), "
      "count(*) FILTER (WHERE note IS NULL) FROM sales"),
    q("agg-bool", "SELECT bool_and(active), bool_or(active), bool_and(amount >= 0), "
      "bool_or(vip) FROM sales, (SELECT bool_or(vip) AS vip FROM users) u"),
    q("agg-string-minmax-unicode", "SELECT min(key), max(key), min(producer_name) < "
      "max(producer_name) FROM events"),
    q("agg-median-float", "SELECT median(price), median(ratio) FROM sales"),
    # An even count of integers: the mean of the two middle values.
    q("agg-median-int", "SELECT median(amount) FROM sales"),
    q("agg-percentile-cont", "SELECT percentile_cont(0.25) WITHIN GROUP (ORDER BY price) "
      "FROM sales"),
    q("agg-string-agg-ordered", "SELECT string_agg(DISTINCT country, ',' ORDER BY country) "
      "FROM users"),
    q("agg-empty-input", "SELECT count(*), sum(amount), min(amount), avg(price), "
      "max(publish_time), count(DISTINCT key) FROM sales WHERE amount < 0"),
    # --- GROUP BY
    q("group-key", "SELECT key, count(*), sum(sequence_id) FROM events GROUP BY key"),
    q("group-properties-multi", "SELECT properties['region'], properties['tier'], count(*), "
      "min(ledger_id) FROM events GROUP BY properties['region'], properties['tier']"),
    q("group-partition", "SELECT partition, count(*), sum(amount), min(key), max(key) "
      "FROM sales GROUP BY partition"),
    q("group-struct-key", "SELECT customer, count(*), sum(amount) FROM sales GROUP BY customer"),
    q("group-struct-field-and-col", "SELECT customer['tier'], region, count(*) FROM sales "
      "GROUP BY customer['tier'], region"),
    q("group-list-key", "SELECT tags, count(*) FROM sales GROUP BY tags"),
    q("group-having", "SELECT key, count(*) FROM events GROUP BY key HAVING count(*) > 100"),
    q("group-hour", "SELECT date_trunc('hour', event_time) AS h, count(*) FROM events "
      "GROUP BY date_trunc('hour', event_time)"),
    q("group-rollup", "SELECT region, active, count(*), sum(amount) FROM sales "
      "GROUP BY ROLLUP (region, active)"),
    q("group-cube", "SELECT customer['tier'], active, count(*) FROM sales "
      "GROUP BY CUBE (customer['tier'], active)"),
    q("group-ordered-limit", "SELECT key, count(*) AS n FROM events WHERE key IS NOT NULL "
      "GROUP BY key ORDER BY n DESC, key LIMIT 5", ordered=True),
    q("group-coalesce-null-key", "SELECT coalesce(key, '<none>') AS k, count(*) FROM events "
      "GROUP BY coalesce(key, '<none>')"),
    # --- DISTINCT in every form
    q("distinct-count", "SELECT count(DISTINCT key), count(DISTINCT properties['region']), "
      "count(DISTINCT producer_name) FROM events"),
    q("distinct-count-tuple", "SELECT count(DISTINCT (key, properties['region'])) FROM events"),
    q("distinct-count-tuple-ids", "SELECT count(*), count(DISTINCT (ledger_id, entry_id, "
      "batch_index)) FROM events"),
    q("distinct-count-tuple-nulls", "SELECT count(DISTINCT (key, event_time)), "
      "count(DISTINCT (note, region)) FROM events, (SELECT note, region FROM sales "
      "WHERE amount < 50) s WHERE events.ledger_id = {L1} AND events.entry_id < 2"),
    q("distinct-count-struct-col", "SELECT count(DISTINCT customer) FROM sales"),
    q("distinct-count-list-col", "SELECT count(DISTINCT tags) FROM sales"),
    q("distinct-count-map-col-alone", "SELECT count(DISTINCT properties) FROM events"),
    q("distinct-count-map-col-beside", "SELECT count(*), count(DISTINCT properties) "
      "FROM events"),
    q("distinct-count-typed-map", "SELECT count(DISTINCT attrs) FROM sales"),
    q("distinct-count-grouped", "SELECT properties['region'], count(DISTINCT key), "
      "count(DISTINCT (key, batch_index >= 0)) FROM events GROUP BY properties['region']"),
    q("distinct-multi-col", "SELECT DISTINCT key, properties['region'] FROM events"),
    q("distinct-struct", "SELECT DISTINCT customer FROM sales"),
    q("distinct-on", "SELECT DISTINCT ON (key) key, sequence_id, ledger_id FROM events "
      f"ORDER BY key, publish_time, {IDS}", ordered=True),
    q("distinct-subquery-count", "SELECT count(*) FROM (SELECT DISTINCT key, partition "
      "FROM sales) t"),
    q("distinct-sum", "SELECT sum(DISTINCT amount % 10), avg(DISTINCT ratio) FROM sales"),
    # --- joins between topics
    q("join-payload-user",
      "SELECT u.country, count(*), sum(u.age) FROM events e JOIN users u "
      "ON json_get_str(CAST(e.payload AS VARCHAR), 'user') = u.name GROUP BY u.country",
      "SELECT u.country, count(*), sum(u.age) FROM events e JOIN users u "
      "ON jstr(e.payload, '$.user') = u.name GROUP BY u.country"),
    q("join-left-users",
      f"SELECT u.name, count(e.ledger_id) FROM users u LEFT JOIN events e "
      f"ON json_get_str(CAST(e.payload AS VARCHAR), 'user') = u.name GROUP BY u.name",
      "SELECT u.name, count(e.ledger_id) FROM users u LEFT JOIN events e "
      "ON jstr(e.payload, '$.user') = u.name GROUP BY u.name"),
    q("join-key", "SELECT e.key, count(*), sum(s.amount) FROM events e JOIN sales s "
      "ON e.key = s.key GROUP BY e.key"),
    q("join-full-outer", "SELECT coalesce(a.key, b.key) AS k, a.n AS en, b.n AS sn FROM "
      "(SELECT key, count(*) AS n FROM events GROUP BY key) a FULL OUTER JOIN "
      "(SELECT key, count(*) AS n FROM sales GROUP BY key) b ON a.key = b.key"),
    q("join-semi", "SELECT count(*) FROM events WHERE key IN "
      "(SELECT key FROM sales WHERE region = 'eu')"),
    q("join-anti", "SELECT count(*) FROM events e WHERE NOT EXISTS "
      "(SELECT 1 FROM sales s WHERE s.key = e.key)"),
    q("join-self-ids", f"SELECT count(*) FROM events a JOIN events b ON a.ledger_id = "
      "b.ledger_id AND a.entry_id = b.entry_id AND a.batch_index = b.batch_index"),
    q("join-same-column-names", "SELECT a.key, b.key, count(*) FROM events a JOIN sales b "
      "ON a.key = b.key WHERE b.amount < 30 GROUP BY a.key, b.key"),
    q("join-union-all", "SELECT k, count(*) FROM (SELECT key AS k FROM events UNION ALL "
      "SELECT key FROM sales UNION ALL SELECT name FROM users) t GROUP BY k"),
    # --- window functions
    q("window-row-number", "SELECT key, sequence_id, row_number() OVER (PARTITION BY key "
      f"ORDER BY {IDS}) FROM events WHERE ledger_id = {{L2}}"),
    q("window-running-sum", "SELECT partition, amount, sum(amount) OVER (PARTITION BY region "
      "ORDER BY amount ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) FROM sales"),
    q("window-lag-lead", "SELECT amount, lag(amount) OVER (ORDER BY amount), "
      "lead(price, 2) OVER (ORDER BY amount) FROM sales"),
    q("window-rank", "SELECT amount, rank() OVER (ORDER BY price DESC), "
      "dense_rank() OVER (PARTITION BY region ORDER BY ratio), ntile(4) OVER (ORDER BY amount) "
      "FROM sales"),
    q("window-first-last", "SELECT amount, first_value(price) OVER w, last_value(price) OVER w "
      "FROM sales WINDOW w AS (PARTITION BY customer['cid'] ORDER BY amount ROWS BETWEEN "
      "2 PRECEDING AND 2 FOLLOWING)"),
    q("window-count-partition", "SELECT key, count(*) OVER (PARTITION BY key) FROM events "
      "WHERE ledger_id = {L1}"),
    q("window-over-aggregate", "SELECT key, count(*), rank() OVER (ORDER BY count(*) DESC) "
      "FROM events GROUP BY key"),
    # --- properties (map) access
    q("props-filter", "SELECT count(*) FROM events WHERE properties['region'] = 'eu'"),
    q("props-missing-key", "SELECT count(*) FROM events WHERE properties['nope'] IS NULL"),
    q("props-empty-value", "SELECT count(*), count(properties['flag']) FROM events "
      "WHERE properties['flag'] = ''"),
    q("props-cast-sum", "SELECT sum(CAST(properties['n'] AS BIGINT)) FROM events"),
    q("props-cardinality", "SELECT cardinality(properties), count(*) FROM events "
      "GROUP BY cardinality(properties)"),
    q("props-map-keys", f"SELECT map_keys(properties) FROM events ORDER BY {IDS} LIMIT 20",
      ordered=True),
    q("props-whole-map", f"SELECT properties FROM events WHERE ledger_id = {{L3}} "
      f"ORDER BY {IDS} LIMIT 30", ordered=True),
    # --- JSON functions on payloads
    q("json-str-group", f"SELECT json_get_str({LLP}, 'user') AS u, count(*) FROM events "
      "GROUP BY 1", "SELECT jstr(payload, '$.user') AS u, count(*) FROM events GROUP BY 1"),
    q("json-int-sum", f"SELECT sum(json_get_int({LLP}, 'i')), "
      f"min(json_get_int({LLP}, 'i')), count(json_get_int({LLP}, 'i')) FROM events",
      "SELECT sum(jint(payload, '$.i')), min(jint(payload, '$.i')), "
      "count(jint(payload, '$.i')) FROM events"),
    q("json-float-avg", f"SELECT avg(json_get_float({LLP}, 'price')), "
      f"max(json_get_float({LLP}, 'i')) FROM events",
      "SELECT avg(jfloat(payload, '$.price')), max(jfloat(payload, '$.i')) FROM events"),
    q("json-bool", f"SELECT json_get_bool({LLP}, 'ok'), count(*) FROM events GROUP BY 1",
      "SELECT jbool(payload, '$.ok'), count(*) FROM events GROUP BY 1"),
    q("json-nested", f"SELECT json_get_int({LLP}, 'nested', 'a') AS a, "
      f"json_get_str({LLP}, 'nested', 'b') AS b, count(*) FROM events GROUP BY 1, 2",
      "SELECT jint(payload, '$.nested.a') AS a, jstr(payload, '$.nested.b') AS b, count(*) "
      "FROM events GROUP BY 1, 2"),
    q("json-array-index", f"SELECT json_get_str({LLP}, 'tags', 1), count(*) FROM events "
      "GROUP BY 1", "SELECT jstr(payload, '$.tags[1]'), count(*) FROM events GROUP BY 1"),
    q("json-length", f"SELECT json_length({LLP}, 'tags'), count(*) FROM events GROUP BY 1",
      "SELECT json_array_length(jdoc(payload), '$.tags'), count(*) FROM events GROUP BY 1"),
    # json_contains is false (not NULL) on a payload that is not JSON.
    q("json-contains", f"SELECT json_contains({LLP}, 'opt'), count(*) FROM events GROUP BY 1",
      "SELECT coalesce(json_exists(jdoc(payload), '$.opt'), false), count(*) FROM events "
      "GROUP BY 1"),
    q("json-int-negative", f"SELECT json_get_int({LLP}, 'amount') < 0, count(*) FROM events "
      "GROUP BY 1", "SELECT jint(payload, '$.amount') < 0, count(*) FROM events GROUP BY 1"),
    q("json-float-negative", f"SELECT min(json_get_float({LLP}, 'amount')) FROM events",
      "SELECT min(jfloat(payload, '$.amount')) FROM events"),
    # A JSON string holding JSON, read by chaining ->> (the inner value is text, then parsed).
    q("json-embedded-as-text", f"SELECT json_get_str({LLP}, 'embedded') AS e, count(*) "
      "FROM events GROUP BY 1", "SELECT jstr(payload, '$.embedded') AS e, count(*) FROM events "
      "GROUP BY 1"),
    q("json-null-value", f"SELECT count(*) FROM events WHERE json_contains({LLP}, 'opt') "
      f"AND json_get_str({LLP}, 'opt') IS NULL",
      "SELECT count(*) FROM events WHERE json_exists(jdoc(payload), '$.opt') "
      "AND jstr(payload, '$.opt') IS NULL"),
    q("json-arrow-operator", f"SELECT {LLP} ->> 'user', count(*) FROM events GROUP BY 1",
      "SELECT jdoc(payload) ->> 'user', count(*) FROM events GROUP BY 1"),
    # Integers from 10^18 up to i64::MAX.
    q("json-int-large", "SELECT json_get_int('{{\"a\": 1234567890123456789}}', 'a')",
      "SELECT CAST(json_extract('{{\"a\": 1234567890123456789}}', '$.a') AS BIGINT)"),
    # json_get's value (a union) on every surface: psql, HTTP Arrow and HTTP JSON.
    q("json-get-union", f"SELECT json_get({LLP}, 'i') AS v FROM events ORDER BY {IDS} LIMIT 5",
      f"SELECT jint(payload, '$.i') AS v FROM events ORDER BY {IDS} LIMIT 5", ordered=True),
    q("json-not-json", f"SELECT count(*) FROM events WHERE json_get_int({LLP}, 'i') IS NULL",
      "SELECT count(*) FROM events WHERE jint(payload, '$.i') IS NULL"),
    q("json-schema-payload-matches-typed", f"SELECT count(*) FROM sales WHERE "
      f"json_get_int({LLP}, 'amount') = amount AND json_get_str({LLP}, 'customer', 'tier') "
      "IS NOT DISTINCT FROM customer['tier']",
      "SELECT count(*) FROM sales WHERE jint(payload, '$.amount') = amount AND "
      "jstr(payload, '$.customer.tier') IS NOT DISTINCT FROM customer['tier']"),
    # --- typed columns (JSON and Avro schemas)
    q("typed-sales-rows", "SELECT amount, price, qty, ratio, region, active, note, customer, "
      "tags, attrs, schema_version, decode_error FROM sales ORDER BY amount", ordered=True),
    q("typed-users-rows", "SELECT name, age, score, country, vip, key FROM users "
      "ORDER BY name", ordered=True),
    q("typed-struct-field-filter", "SELECT count(*), sum(amount) FROM sales "
      "WHERE customer['cid'] = 3 AND customer['tier'] = 'std'"),
    q("typed-list-functions", "SELECT tags[1], array_length(tags), count(*) FROM sales "
      "GROUP BY 1, 2"),
    q("typed-list-has", "SELECT count(*) FROM sales WHERE array_has(tags, 'x')"),
    q("typed-map-access", "SELECT attrs['a'], count(*) FROM sales GROUP BY 1"),
    q("typed-float32", "SELECT ratio, count(*) FROM sales GROUP BY ratio"),
    q("typed-avro-null-double", "SELECT count(score), sum(score), avg(age) FROM users"),
    # --- time functions and ranges
    q("time-trunc-day", "SELECT date_trunc('day', event_time), count(*) FROM events GROUP BY 1"),
    q("time-part-hour", "SELECT date_part('hour', event_time), count(*) FROM events "
      "GROUP BY 1"),
    q("time-extract-epoch", "SELECT min(extract(epoch FROM event_time)), "
      "max(date_part('epoch', publish_time)) FROM events"),
    q("time-dow", "SELECT extract(dow FROM event_time), count(*) FROM events GROUP BY 1"),
    q("time-cast-date", "SELECT CAST(event_time AS DATE), count(*) FROM events GROUP BY 1"),
    q("time-range-string", "SELECT count(*) FROM events WHERE event_time >= "
      "'2023-11-15T00:00:00Z' AND event_time < '2023-11-16T12:30:00.5Z'"),
    q("time-range-tz-literal", "SELECT count(*) FROM events WHERE event_time < "
      "TIMESTAMPTZ '2023-11-15 06:00:00+00'"),
    q("time-range-naive-literal", "SELECT count(*) FROM events WHERE event_time < "
      "TIMESTAMP '2023-11-15 06:00:00'"),
    q("time-range-offset-literal", "SELECT count(*) FROM events WHERE event_time < "
      "'2023-11-15T08:00:00+02:00'"),
    q("time-between-ms-edges", "SELECT count(*) FROM events WHERE event_time BETWEEN "
      "'2023-11-14T19:26:40.000Z' AND '2023-11-15T19:26:40.999Z'"),
    q("time-from-millis", "SELECT count(*) FROM events WHERE event_time >= "
      "to_timestamp_millis(1700050000000)",
      "SELECT count(*) FROM events WHERE event_time >= make_timestamptz(1700050000000000)"),
    q("time-bin", "SELECT date_bin(INTERVAL '15 minutes', event_time) AS b, count(*) "
      "FROM events GROUP BY 1",
      "SELECT time_bucket(INTERVAL '15 minutes', event_time) AS b, count(*) FROM events "
      "GROUP BY 1"),
    q("time-interval-arith", "SELECT count(*) FROM events WHERE event_time + INTERVAL '1 day' "
      "< '2023-11-16T00:00:00Z'"),
    q("time-publish-range", "SELECT count(*) FROM events WHERE publish_time >= '{pt_q1}' "
      "AND publish_time <= '{pt_mid}'"),
    q("time-publish-naive", "SELECT count(*) FROM events WHERE publish_time > "
      "TIMESTAMP '{pt_mid_naive}'"),
    q("time-publish-edges", "SELECT count(*) FILTER (WHERE publish_time = '{pt_max}'), "
      "count(*) FILTER (WHERE publish_time > '{pt_max}'), "
      "count(*) FILTER (WHERE publish_time < '{pt_min}') FROM events"),
    # --- filters on pushed-down columns
    q("push-ledger-eq", "SELECT count(*), min(entry_id), max(entry_id) FROM events "
      "WHERE ledger_id = {L2}"),
    q("push-ledger-range", "SELECT count(*) FROM events WHERE ledger_id > {L1} "
      "AND ledger_id <= {L3}"),
    q("push-ledger-in-not", "SELECT count(*) FROM events WHERE ledger_id IN ({L1}, {L3}) "
      "OR NOT (ledger_id <> {L2})"),
    q("push-entry-between", "SELECT count(*), sum(batch_size) FROM events "
      "WHERE entry_id BETWEEN 5 AND 20"),
    q("push-entry-batch", f"SELECT {IDS}, key FROM events WHERE entry_id = 0 AND "
      "batch_index <= 0"),
    q("push-partition-in", "SELECT partition, count(*) FROM sales WHERE partition IN (0, 2) "
      "GROUP BY partition"),
    q("push-partition-ne", "SELECT count(*) FROM sales WHERE partition <> 1 AND "
      "partition >= 0"),
    q("push-key-eq-in", "SELECT count(*) FROM events WHERE key = 'user-3' OR key IN "
      "('ключ-2', '日本-1', '')"),
    q("push-key-range-like", "SELECT count(*) FROM events WHERE key > 'user-5' AND "
      "key LIKE 'user-1%'"),
    q("push-key-null", "SELECT count(*) FROM events WHERE key IS NULL OR key = ''"),
    q("push-sequence", "SELECT count(*), sum(sequence_id) FROM events WHERE sequence_id "
      "BETWEEN 100 AND 200 AND sequence_id % 2 = 0"),
    q("push-producer", "SELECT count(*) FROM events WHERE producer_name = "
      "(SELECT min(producer_name) FROM events)"),
    q("push-batch-size", "SELECT batch_size = 0, count(*) FROM events GROUP BY 1"),
    # Filters the lake scan is given as Iceberg predicates: a float (32-bit) column, an int
    # column against a float literal, a cast over a column.
    q("push-float32-eq", "SELECT count(*) FROM sales WHERE ratio = 2.0"),
    q("push-float32-range", "SELECT count(*) FROM sales WHERE ratio > CAST(2.5 AS REAL)"),
    q("push-int-vs-float-literal", "SELECT count(*) FROM sales WHERE amount = 3.0"),
    q("push-double-eq", "SELECT count(*) FROM sales WHERE weight = 2.0 OR price = 3.75"),
    q("push-cast-narrowing", "SELECT count(*) FROM sales WHERE CAST(weight AS REAL) = "
      "CAST(1.0 / 3 AS REAL)",
      "SELECT count(*) FROM sales WHERE CAST(weight AS REAL) = CAST(1.0 / 3 AS REAL)"),
    q("push-cast-to-int", "SELECT count(*) FROM sales WHERE CAST(weight AS INT) = 2",
      "SELECT count(*) FROM sales WHERE CAST(trunc(weight) AS INT) = 2"),
    q("push-mixed-or-not", "SELECT count(*) FROM events WHERE NOT (ledger_id = {L1}) "
      "OR key IS NULL OR event_time IS NULL"),
    q("push-schema-version", "SELECT schema_version, count(*) FROM sales GROUP BY 1"),
    q("push-ordering-key", "SELECT count(*) FROM events WHERE ordering_key IS NULL"),
    q("push-publish-and-ids", "SELECT count(*) FROM events WHERE publish_time >= '{pt_mid}' "
      "AND ledger_id >= {L2} AND entry_id < 100"),
    # --- ORDER BY / LIMIT
    # An alias of the sort column, and a filter over two other columns.
    q("order-by-aliased-column", "SELECT entry_id AS e FROM events WHERE sequence_id <= 500 "
      "OR key IS NULL ORDER BY entry_id", ordered=True),
    q("order-desc-limit", f"SELECT {IDS}, key FROM events ORDER BY ledger_id DESC, "
      "entry_id DESC, batch_index DESC LIMIT 10", ordered=True),
    q("order-nulls-first-offset", f"SELECT key, {IDS} FROM events ORDER BY key NULLS FIRST, "
      f"{IDS} LIMIT 20 OFFSET 5", ordered=True),
    q("order-nulls-default-desc", f"SELECT key, {IDS} FROM events ORDER BY key DESC, "
      f"{IDS} LIMIT 20", ordered=True),
    q("order-publish-time", f"SELECT publish_time, {IDS} FROM events ORDER BY publish_time, "
      f"{IDS} LIMIT 7", ordered=True),
    q("order-expression", "SELECT amount, price FROM sales ORDER BY abs(price - 100), amount "
      "LIMIT 12", ordered=True),
    q("order-unicode-keys", "SELECT DISTINCT key FROM events ORDER BY key", ordered=True),
    # --- NULL handling
    q("null-eq-null", "SELECT count(*) FROM events WHERE key = NULL"),
    q("null-distinct-from", "SELECT count(*) FROM events WHERE key IS DISTINCT FROM 'user-1'"),
    q("null-in-list", "SELECT count(*) FROM events WHERE key IN ('user-1', NULL)"),
    q("null-not-in-list", "SELECT count(*) FROM events WHERE key NOT IN ('user-1', NULL)"),
    q("null-not-in-subquery", "SELECT count(*) FROM users WHERE country NOT IN "
      "(SELECT country FROM users WHERE vip)"),
    q("null-nullif-coalesce", "SELECT nullif(note, ''), coalesce(note, region, '-'), count(*) "
      "FROM sales GROUP BY 1, 2"),
    q("null-empty-vs-null", "SELECT note IS NULL, note = '', count(*) FROM sales GROUP BY 1, 2"),
    q("null-case", "SELECT sum(CASE WHEN event_time IS NULL THEN 1 ELSE 0 END), "
      "count(*) - count(event_time) FROM events"),
    q("null-struct", "SELECT customer IS NULL, customer['cid'] IS NULL, count(*) FROM sales "
      "GROUP BY 1, 2"),
    # --- payload bytes and strings
    q("bytes-payload", f"SELECT payload, ledger_id FROM events ORDER BY {IDS} LIMIT 12",
      ordered=True),
    q("bytes-md5", f"SELECT md5({LLP}) FROM events WHERE ledger_id = {{L1}} AND entry_id < 5",
      "SELECT md5(decode(payload)) FROM events WHERE ledger_id = {L1} AND entry_id < 5"),
    q("string-functions", "SELECT upper(key), length(key), substr(key, 2, 3), count(*) "
      "FROM events GROUP BY 1, 2, 3"),
    q("cte-window", "WITH k AS (SELECT key, count(*) AS n FROM events GROUP BY key) "
      "SELECT key, n, sum(n) OVER (ORDER BY n, key) FROM k"),
    # --- more shapes
    q("set-intersect-except", "SELECT 'i', count(*) FROM (SELECT key FROM events INTERSECT "
      "SELECT key FROM sales) t UNION ALL SELECT 'e', count(*) FROM (SELECT key FROM events "
      "EXCEPT SELECT key FROM sales) t"),
    q("unnest-list", "SELECT unnest(tags) AS t, count(*) FROM sales GROUP BY 1"),
    q("distinct-count-filter", "SELECT count(DISTINCT key) FILTER (WHERE partition = 1), "
      "count(DISTINCT region) FILTER (WHERE active) FROM sales"),
    q("regexp-match", "SELECT count(*) FROM events WHERE key ~ '^user-1[0-9]$'"),
    q("string-concat", "SELECT key || '#' || CAST(sequence_id % 3 AS VARCHAR) AS k, count(*) "
      "FROM events GROUP BY 1"),
    q("time-format", "SELECT to_char(event_time, '%Y-%m-%d %H') AS h, count(*) FROM events "
      "GROUP BY 1",
      "SELECT strftime(event_time, '%Y-%m-%d %H') AS h, count(*) FROM events GROUP BY 1"),
    q("time-now-window", "SELECT count(*) FROM events WHERE publish_time > now() - "
      "INTERVAL '1 day' AND publish_time <= now()"),
    q("time-at-time-zone", "SELECT date_part('hour', event_time AT TIME ZONE 'Asia/Tokyo') "
      "AS h, count(*) FROM events GROUP BY 1"),
    q("time-trunc-week-month", "SELECT date_trunc('week', event_time), "
      "date_trunc('month', event_time), count(*) FROM events GROUP BY 1, 2"),
    q("int-division", "SELECT (amount - 900) / 7 AS d, (amount - 900) % 7 AS m, count(*) "
      "FROM sales GROUP BY 1, 2",
      "SELECT CAST(trunc((amount - 900) / 7) AS BIGINT) AS d, (amount - 900) % 7 AS m, "
      "count(*) FROM sales GROUP BY 1, 2"),
    q("window-percent-rank", "SELECT amount, percent_rank() OVER (ORDER BY price), "
      "cume_dist() OVER (PARTITION BY region ORDER BY amount) FROM sales"),
    q("array-agg-ordered", "SELECT region, array_agg(amount ORDER BY amount DESC) FROM sales "
      "WHERE amount < 40 GROUP BY region"),
]

# Forms ledgerlake does not support: each must fail with a clear error (HTTP 400, and psql
# reports it), never a wrong answer. (PostgreSQL and DuckDB accept them.)
UNSUPPORTED = [
    ("octet-length-binary", "SELECT octet_length(payload) FROM events LIMIT 1",
     "octet_length"),
    ("same-expression-twice", "SELECT count(*), count(*) FROM sales",
     "Projections require unique expression names"),
    # Arrow's row format (grouping, sorting) has no encoding of maps.
    ("group-map-key", "SELECT attrs, count(*) FROM sales GROUP BY attrs",
     "not supported: grouping, sorting or joining on a map value"),
    ("group-properties-map", "SELECT properties, count(*) FROM events GROUP BY properties",
     "not supported: grouping, sorting or joining on a map value"),
    # DataFusion 53 does not decorrelate a scalar subquery whose correlated predicate reads a
    # struct field (also over VALUES with named_struct).
    ("subquery-correlated-struct-field", "SELECT u.name, (SELECT count(*) FROM sales s "
     "WHERE s.customer['cid'] = u.age % 7) FROM users u", "ScalarSubquery"),
]

# Known differences, not compared: a chain of `->>` is one JSON path in datafusion-functions-json
# (`(x ->> 'a') ->> 'b'` is `x ->> 'a' ->> 'b'`, NULL when `a` holds a string of JSON), where
# DuckDB parses the text `a` holds again (PostgreSQL refuses `text ->> text`).


def _format(query, lits):
    return Query(query.name, query.ll.format(**lits), query.duck.format(**lits), query.ordered)


@pytest.fixture(scope="module")
def corpus_problems(world):
    """Every corpus query run once on every surface (psql: one session for all)."""
    queries = [_format(c, world["lits"]) for c in CORPUS]
    problems = check_many(world["ll"], world["duck"], queries, ("http", "psql", "json"))
    return dict(zip((c.name for c in CORPUS), problems))


@pytest.mark.parametrize("name", [c.name for c in CORPUS])
def test_corpus(corpus_problems, name):
    problem = corpus_problems[name]
    assert problem is None, problem


@pytest.mark.parametrize("name,sql,fragment", UNSUPPORTED, ids=[u[0] for u in UNSUPPORTED])
def test_unsupported_forms_fail_clearly(world, name, sql, fragment):
    ll = world["ll"]
    with pytest.raises(QueryError) as e:
        ll.http(sql)
    assert str(e.value).startswith("HTTP 400") and fragment in str(e.value), e.value
    with pytest.raises(QueryError) as e:
        ll.psql(sql, None)
    assert fragment in str(e.value), e.value


# ----------------------------------------------------------------------------- generated

def specs():
    envelope = [
        Col("ledger_id", "int", nullable=False),
        Col("entry_id", "int", nullable=False),
        Col("batch_index", "int", nullable=False),
        Col("batch_size", "int", nullable=False),
        Col("partition", "int", nullable=False),
        Col("publish_time", "ts", nullable=False),
        Col("event_time", "ts"),
        Col("key", "str"),
        Col("sequence_id", "int", nullable=False),
        Col("producer_name", "str", nullable=False, agg=False),
    ]
    events = Spec("events", envelope + [
        Col("properties['region']", "str"),
        Col("properties['tier']", "str"),
        Col("json_user", "str", ll=f"json_get_str({LLP}, 'user')",
            duck="jstr(payload, '$.user')"),
        # Non-negative JSON numbers only: json_get_int/json_get_float read negative numbers
        # as NULL (corpus: json-int-negative), which would drown everything else.
        Col("json_i", "int", ll=f"json_get_int({LLP}, 'i')", duck="jint(payload, '$.i')"),
        Col("json_nested_a", "int", ll=f"json_get_int({LLP}, 'nested', 'a')",
            duck="jint(payload, '$.nested.a')"),
        Col("json_price", "float", ll=f"json_get_float({LLP}, 'price')",
            duck="jfloat(payload, '$.price')"),
    ])
    sales = Spec("sales", envelope + [
        Col("amount", "int"), Col("price", "float"), Col("qty", "int"), Col("weight", "float"),
        # Not in filters: any filter on a float (32-bit) column fails on the lake side
        # (corpus: push-float32-*), which would drown everything else.
        Col("ratio", "float", filter=False),
        Col("region", "str"), Col("active", "bool"), Col("note", "str"),
        Col("customer['cid']", "int"), Col("customer['tier']", "str"),
        Col("attrs['a']", "str"),
    ])
    readings = Spec("readings", envelope + [
        Col("device", "str"), Col("value", "int"), Col("temp", "float"),
    ])
    return [events, sales, readings]


def test_generated(world):
    seed_env = os.environ.get("LL_SQL_GEN_SEED", "20261202")
    seed = random.randrange(1 << 32) if seed_env == "random" else int(seed_env)
    n = int(os.environ.get("LL_SQL_GEN_QUERIES", "300"))
    tables = specs()
    rng = random.Random(seed)
    for s in tables:
        profile(world["duck"], s, rng=rng)
    gen = Generator(seed, tables)
    started = time.time()
    queries = [gen.query(i) for i in range(n)]
    failures = []
    for first in range(0, n, 200):
        problems = check_many(world["ll"], world["duck"], queries[first:first + 200])
        failures += [p for p in problems if p]
    elapsed = time.time() - started
    print(f"generated {n} queries with seed {seed} in {elapsed:.1f}s: {len(failures)} failed")
    # One example of each kind of failure first, then the others.
    kinds = {}
    for f in failures:
        kinds.setdefault(_kind(f), []).append(f)
    summary = "\n".join(f"  {len(v):4} x {k}" for k, v in
                        sorted(kinds.items(), key=lambda kv: -len(kv[1])))
    examples = [v[0] for v in kinds.values()] + [f for v in kinds.values() for f in v[1:]]
    assert not failures, (f"{len(failures)} of {n} generated queries differ (LL_SQL_GEN_SEED="
                          f"{seed} LL_SQL_GEN_QUERIES={n} reproduces them):\n{summary}\n\n"
                          + "\n\n".join(examples[:12]))


def _kind(problem):
    """A failure's kind: ledgerlake's error without its details, or the kind of difference."""
    for line in problem.splitlines():
        line = line.strip()
        if line.startswith("ledgerlake failed:"):
            reason = line.split(":", 1)[1].strip()
            reason = re.sub(r'^HTTP \d+: \{"reason":"', "", reason)
            reason = reason.split(": Plan: [")[0].replace("\\n", " ")
            return "error " + re.sub(r"\d+", "N", reason)[:100]
        if " differs from DuckDB" in line:
            return "different rows"
        if line.startswith("DuckDB failed"):
            return "DuckDB failed (a bad generated query)"
    return "other"


# ----------------------------------------------------------------------------- the live tail

def test_live_tail_matches_acknowledged_sends(world):
    """`readings`: the first sends are in the lake, the later ones only in the log; ledgerlake
    answers over both exactly what the producer had acknowledged."""
    ll = world["ll"]
    svc = world["svc"]
    lake_part, log_part, offload = world["readings"]
    assert offload["committedRows"] == TAIL_LAKE, offload
    st = stats(svc, READINGS)
    # Part of the topic is still only in the log: the plan's tail reads entries.
    _, plan = ll.run("EXPLAIN SELECT count(*) FROM readings", ("http",))
    tail = re.search(r"LiveTailExec: .* ledgers=(\d+) entries=(\d+)", repr(plan["http"]))
    assert tail and int(tail.group(1)) > 0 and int(tail.group(2)) > 0, plan
    acked = lake_part + log_part
    rows = [reading(i) for i, _ in acked]
    n = len(acked)
    values = [r.value for r in rows]
    temps = [r.temp for r in rows]

    def one(sql, surfaces=("http", "psql")):
        _, out = ll.run(sql, surfaces)
        for surface, got in out.items():
            assert not isinstance(got, QueryError), (surface, sql, got)
            assert compare(out["http"], got, False) is None, (surface, sql, got)
        return out["http"]

    got = one("SELECT count(*), sum(value), min(value), max(value), sum(temp), min(temp), "
              "max(temp), count(key), count(DISTINCT key), count(DISTINCT device) FROM readings")
    want = [(n, sum(values), min(values), max(values), sum(temps), min(temps), max(temps),
             sum(1 for _, k in acked if k is not None),
             len({k for _, k in acked if k is not None}), len({r.device for r in rows}))]
    assert compare(want, got, True) is None, (want, got)

    per_key = {}
    for (i, k), r in zip(acked, rows):
        c, s = per_key.get(k, (0, 0))
        per_key[k] = (c + 1, s + r.value)
    got = one("SELECT key, count(*), sum(value) FROM readings GROUP BY key")
    want = [(k, c, s) for k, (c, s) in per_key.items()]
    assert compare(want, got, False) is None, (want, got)

    # A filter pushed down to both sides.
    picked = [r.value for (i, k), r in zip(acked, rows)
              if k in ("dev-1", "dev-2") and -100 <= r.value <= 500]
    got = one("SELECT count(*), sum(value) FROM readings WHERE key IN ('dev-1', 'dev-2') "
              "AND value BETWEEN -100 AND 500")
    assert got == [(len(picked), sum(picked))], got

    # JSON over the payload agrees with the typed column, on both sides of the seam.
    # (Not over `value`: json_get_int reads negative numbers as NULL, see the corpus.)
    got = one("SELECT sum(json_get_float(CAST(payload AS VARCHAR), 'temp')), "
              "count(*) FILTER (WHERE json_get_str(CAST(payload AS VARCHAR), 'device') = device) "
              "FROM readings")
    assert compare([(sum(temps), n)], got, True) is None, got

    # The log part alone (ledgers after the watermark) and the lake part alone (the snapshot).
    snapshot = st["lake"]["snapshotId"]
    got = one(f'SELECT count(*), sum(value) FROM "readings@{snapshot}"')
    assert got == [(TAIL_LAKE, sum(reading(i).value for i, _ in lake_part))], got
    watermark = max(r[0] for r in one(f'SELECT ledger_id FROM "readings@{snapshot}" '
                                      "GROUP BY ledger_id"))
    got = one(f"SELECT count(*), sum(value), min(sequence_id) >= 0 FROM readings "
              f"WHERE ledger_id > {watermark}")
    assert got == [(TAIL_LOG, sum(reading(i).value for i, _ in log_part), True)], got
    # Message ids are unique across the seam.
    got = one("SELECT count(DISTINCT (ledger_id, entry_id, batch_index)) FROM readings")
    assert got == [(n,)], got
