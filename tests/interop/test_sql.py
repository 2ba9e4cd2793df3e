"""SQL over topics with real clients: psql (Debian's postgresql-client), psycopg2, HTTP
`POST /sql` (JSON, CSV, Arrow) and `ledgerlake sql`. Tables are the lake snapshot plus the
live tail; the seam test runs queries while a producer writes and offload runs in a loop."""
import json
import os
import subprocess
import threading
import time
import urllib.request

import psycopg2
import pulsar
import pyarrow.ipc
import pytest

from conftest import Sends, eventually
from lake import http, offload_and_wait, stats

FAST = {
    "LEDGERLAKE_LAKE__CHECK_INTERVAL": "100ms",
    "LEDGERLAKE_LEDGER__ROLLOVER_ENTRIES": "50",
}
N = 300


def set_policy(svc, name, value):
    status, body = http("PUT", f"{svc.http}/admin/v2/namespaces/public/default/{name}", str(value))
    assert status == 204, body


def psql(svc, sql, password=None):
    env = dict(os.environ, PGCONNECT_TIMEOUT="10")
    env.pop("PGPASSWORD", None)
    if password is not None:
        env["PGPASSWORD"] = password
    return subprocess.run(
        ["psql", "-h", "127.0.0.1", "-p", str(svc.pg_port), "-U", "analyst", "-d", "lake",
         "-X", "-A", "-t", "-F", "|", "-v", "ON_ERROR_STOP=1", "-w", "-c", sql],
        capture_output=True, text=True, env=env, timeout=120)


def psql_rows(svc, sql):
    r = psql(svc, sql)
    assert r.returncode == 0, r.stderr
    return [line.split("|") for line in r.stdout.splitlines() if line]


def sql_http(svc, sql, accept="application/json", token=None):
    req = urllib.request.Request(f"{svc.http}/sql", data=sql.encode(), method="POST",
                                 headers={"Accept": accept, "Content-Type": "text/plain"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def key_of(i):
    if i % 5 == 0:
        return None
    return f"ключ-{i % 7}" if i % 2 else f"日本-{i % 3}"


def produce(client, topic, first, count):
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=10,
                                      batching_max_publish_delay_ms=5, block_if_queue_full=True)
    sends = Sends()
    for i in range(first, first + count):
        kwargs = {"properties": {"n": str(i), "parity": "even" if i % 2 == 0 else "odd"}}
        if i % 4:
            kwargs["event_timestamp"] = 1_700_000_000_000 + i
        if key_of(i) is not None:
            kwargs["partition_key"] = key_of(i)
        payload = json.dumps({"i": i, "name": f"ü{i}"}).encode()
        producer.send_async(payload, sends.callback(), **kwargs)
    sends.check(producer, count)
    producer.close()


@pytest.fixture(scope="module")
def topic_svc(tmp_path_factory):
    """A service whose topic `sql-basic` has its first half in the lake (deleted locally) and
    its second half only in the local log."""
    from conftest import Service, _binary
    d = tmp_path_factory.mktemp("sql")
    svc = Service(_binary(), str(d), env=FAST)
    svc.start()
    try:
        set_policy(svc, "offloadDeletionLagMs", 0)
        client = pulsar.Client(svc.url)
        topic = "persistent://public/default/sql-basic"
        produce(client, topic, 0, N // 2)
        offload_and_wait(svc, topic)
        deadline = time.time() + 60
        while time.time() < deadline:
            states = [l["ledger"]["state"] for l in stats(svc, topic)["ledgers"]]
            if "deleted" in states:
                break
            time.sleep(0.1)
        assert "deleted" in states, states
        produce(client, topic, N // 2, N - N // 2)
        client.close()
        yield svc
    finally:
        svc.stop()


def test_psql_counts_aggregates_filters_nulls_maps(topic_svc):
    assert psql_rows(topic_svc, 'SELECT count(*) FROM "sql-basic"') == [[str(N)]]
    assert psql_rows(topic_svc, 'SELECT count(*) FROM public.default."sql-basic" WHERE key IS NULL') \
        == [[str(sum(1 for i in range(N) if key_of(i) is None))]]
    rows = psql_rows(topic_svc, """SELECT count(*), sum(CAST(properties['n'] AS BIGINT)),
        count(event_time), count(DISTINCT ledger_id) > 1 FROM "sql-basic" """)
    assert rows == [[str(N), str(sum(range(N))), str(sum(1 for i in range(N) if i % 4)), "t"]]
    rows = psql_rows(topic_svc, """SELECT key, count(*) FROM "sql-basic" WHERE key IS NOT NULL
        GROUP BY key ORDER BY key""")
    expected = {}
    for i in range(N):
        if key_of(i) is not None:
            expected[key_of(i)] = expected.get(key_of(i), 0) + 1
    assert {k: int(v) for k, v in rows} == expected
    # Distinct counts of tuples and of a map, beside other aggregates, over the lake and the
    # tail: every message has its own id and its own properties.
    rows = psql_rows(topic_svc, """SELECT count(*),
        count(DISTINCT (ledger_id, entry_id, batch_index)), count(DISTINCT properties),
        count(DISTINCT (key, properties['parity'])) FROM "sql-basic" """)
    pairs = {(key_of(i), "even" if i % 2 == 0 else "odd") for i in range(N)}
    assert rows == [[str(N), str(N), str(N), str(len(pairs))]]
    # JSON helpers over raw JSON payloads.
    rows = psql_rows(topic_svc, """SELECT sum(json_get_int(CAST(payload AS VARCHAR), 'i'))
        FROM "sql-basic" WHERE properties['parity'] = 'even'""")
    assert rows == [[str(sum(i for i in range(N) if i % 2 == 0))]]
    # timestamptz renders with its zone.
    (ts,), = psql_rows(topic_svc, 'SELECT min(event_time) FROM "sql-basic"')
    assert ts.startswith("2023-11-14 22:13:20.001") and ts.endswith("+00"), ts


def test_psycopg2_types_and_unicode(topic_svc):
    conn = psycopg2.connect(host="127.0.0.1", port=topic_svc.pg_port, user="anyone",
                            dbname="whatever", connect_timeout=10)
    try:
        cur = conn.cursor()  # not autocommit: psycopg2 sends BEGIN first
        cur.execute("""SELECT key, properties, payload, publish_time, event_time, ledger_id,
                       entry_id, batch_index FROM "sql-basic" WHERE properties['n'] = '7'""")
        (key, props, payload, publish, event, ledger, entry, index), = cur.fetchall()
        assert key == key_of(7)
        assert props == {"n": "7", "parity": "odd"}
        assert bytes(payload) == json.dumps({"i": 7, "name": "ü7"}).encode()
        assert publish.tzinfo is not None and event.tzinfo is not None
        assert int(event.timestamp() * 1000) == 1_700_000_000_007
        assert ledger >= 0 and entry >= 0 and index >= 0
        cur.execute('SELECT count(*) FROM "sql-basic" WHERE key = %s', ("ключ-3",))
        assert cur.fetchone()[0] == sum(1 for i in range(N) if key_of(i) == "ключ-3")
        cur.execute('SELECT count(*) FROM "sql-basic" WHERE event_time IS NULL')
        assert cur.fetchone()[0] == sum(1 for i in range(N) if i % 4 == 0)
        conn.commit()
    finally:
        conn.close()


def test_explain_shows_pushdown_to_lake_and_tail(topic_svc):
    text = "\n".join("|".join(r) for r in psql_rows(topic_svc, """EXPLAIN SELECT count(*)
        FROM "sql-basic" WHERE publish_time >= TIMESTAMP '2020-01-01T00:00:00Z' AND ledger_id >= 1"""))
    # The lake side: the files Iceberg planned, read by DataFusion's Parquet reader with the
    # filters pushed into it (row groups and pages pruned by statistics).
    lake = next(line for line in text.splitlines() if "DataSourceExec" in line)
    assert "sql_basic/data/" in lake and "file_type=parquet" in lake, lake
    assert "predicate=" in lake and "publish_time" in lake and "pruning_predicate=" in lake, lake
    assert "LiveTailExec" in text and "pruning=[ledger_id=[1..]" in text, text


def test_explain_analyze_splits_lake_and_tail(topic_svc):
    text = "\n".join("|".join(r) for r in psql_rows(topic_svc, 'EXPLAIN ANALYZE SELECT count(*), '
                                                 'max(sequence_id) FROM "sql-basic"'))
    lake = next(line for line in text.splitlines() if "DataSourceExec" in line)
    tail = next(line for line in text.splitlines() if "LiveTailExec" in line)
    # Each side with its own rows and time: the lake half of the messages, the tail the rest.
    assert f"output_rows={N // 2}," in lake and "elapsed_compute=" in lake, lake
    assert f"output_rows={N - N // 2}," in tail and "entries_read=" in tail, tail
    assert "elapsed_compute=" in tail and "entries_read_from_lake=0" in tail, tail


def test_time_travel_and_snapshots_table(topic_svc):
    rows = psql_rows(topic_svc, 'SELECT snapshot_id FROM "sql-basic$snapshots" ORDER BY committed_at')
    assert rows, "no snapshots"
    first = rows[0][0]
    assert psql_rows(topic_svc, f'SELECT count(*) FROM "sql-basic@{first}"') == [[str(N // 2)]]
    r = psql(topic_svc, 'SELECT count(*) FROM "sql-basic@2001-01-01T00:00:00Z"')
    assert r.returncode != 0 and "no snapshot" in r.stderr, r.stderr


def test_history_files_and_partitions_tables(topic_svc):
    """The lake half of the topic, seen through its metadata tables."""
    snapshots = psql_rows(topic_svc, 'SELECT snapshot_id FROM "sql-basic$snapshots"')
    history = psql_rows(topic_svc, """SELECT snapshot_id, is_current_ancestor,
        made_current_at IS NOT NULL FROM "sql-basic$history" ORDER BY made_current_at""")
    assert sorted(h[0] for h in history) == sorted(s[0] for s in snapshots)
    assert history[-1][1:] == ["t", "t"], history
    files = psql_rows(topic_svc, """SELECT content, file_format, partition, record_count,
        file_size_in_bytes > 0 FROM "sql-basic$files" """)
    assert files and all(f[0] == "data" and f[1] == "parquet" and f[4] == "t" for f in files)
    assert all(f[2].startswith("publish_day=") for f in files), files
    assert sum(int(f[3]) for f in files) == N // 2
    parts = psql_rows(topic_svc, """SELECT partition, record_count, file_count
        FROM "sql-basic$partitions" ORDER BY partition""")
    assert sum(int(p[1]) for p in parts) == N // 2
    assert sum(int(p[2]) for p in parts) == len(files)
    assert sorted(p[0] for p in parts) == sorted({f[2] for f in files})


def test_http_json_csv_arrow(topic_svc):
    q = 'SELECT properties[\'n\'] AS n, key FROM "sql-basic" ORDER BY CAST(properties[\'n\'] AS INT) LIMIT 3'
    status, body = sql_http(topic_svc, q)
    assert status == 200, body
    rows = json.loads(body)
    assert rows == [{"n": str(i), "key": key_of(i)} for i in range(3)]
    status, body = sql_http(topic_svc, q, accept="text/csv")
    assert status == 200
    lines = body.decode().splitlines()
    assert lines[0] == "n,key" and lines[1] == "0," and lines[2] == f"1,{key_of(1)}"
    status, body = sql_http(topic_svc, 'SELECT count(*) AS n FROM "sql-basic"',
                            accept="application/vnd.apache.arrow.stream")
    assert status == 200
    table = pyarrow.ipc.open_stream(body).read_all()
    assert table.column("n").to_pylist() == [N]
    status, body = sql_http(topic_svc, "SELEC 1")
    assert status == 400 and b"reason" in body


def test_cli_table_csv_and_prompt(topic_svc):
    binary = os.environ["LL_TEST_BIN"]
    r = subprocess.run([binary, "sql", "--url", topic_svc.http,
                        'SELECT count(*) AS n FROM "sql-basic"'],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "| n   |" in r.stdout and f"| {N} |" in r.stdout and "(1 row)" in r.stdout, r.stdout
    r = subprocess.run([binary, "sql", "--url", topic_svc.http, "--format", "csv",
                        "SELECT 1 AS a, 'x' AS b"], capture_output=True, text=True, timeout=60)
    assert r.stdout == "a,b\n1,x\n", r.stdout
    r = subprocess.run([binary, "sql", "--url", topic_svc.http, "--format", "json"],
                       input="SELECT 1 AS a;\nSELECT\n 2 AS b;\n", capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ['[{"a":1}]', '[{"b":2}]'], r.stdout


FORBIDDEN = [
    "INSERT INTO \"sql-basic\" (key) VALUES ('x')",
    "UPDATE \"sql-basic\" SET key = 'x'",
    "DELETE FROM \"sql-basic\"",
    "CREATE TABLE evil (a INT)",
    "CREATE VIEW evil AS SELECT 1",
    "DROP TABLE \"sql-basic\"",
    "ALTER TABLE \"sql-basic\" ADD COLUMN x INT",
    "TRUNCATE \"sql-basic\"",
    "COPY (SELECT 1) TO '/tmp/ledgerlake-sql-copy.csv'",
    "CREATE EXTERNAL TABLE evil STORED AS CSV LOCATION '/etc/passwd'",
    "SET datafusion.runtime.memory_limit = '100G'",
]


def test_refusals_change_nothing(topic_svc):
    before = psql_rows(topic_svc, "SELECT table_catalog, table_schema, table_name FROM information_schema.tables ORDER BY 1, 2, 3")
    for sql in FORBIDDEN:
        r = psql(topic_svc, sql)
        assert r.returncode != 0 and "read-only" in r.stderr, (sql, r.stderr)
        status, body = sql_http(topic_svc, sql)
        assert status == 403 and b"read-only" in body, (sql, status, body)
    for sql in ["SELECT * FROM '/etc/passwd'", "SELECT * FROM read_csv('/etc/passwd')"]:
        r = psql(topic_svc, sql)
        assert r.returncode != 0, (sql, r.stdout)
        assert "root:" not in r.stdout + r.stderr
    assert not os.path.exists("/tmp/ledgerlake-sql-copy.csv")
    assert psql_rows(topic_svc, 'SELECT count(*) FROM "sql-basic"') == [[str(N)]]
    after = psql_rows(topic_svc, "SELECT table_catalog, table_schema, table_name FROM information_schema.tables ORDER BY 1, 2, 3")
    assert before == after


def test_memory_limit_and_timeout_are_clear_errors(make_service):
    svc = make_service({"LEDGERLAKE_SQL__MEMORY_LIMIT": "16MiB",
                        "LEDGERLAKE_SQL__QUERY_TIMEOUT": "2s"})
    svc.start()
    r = psql(svc, "SELECT value, count(*) FROM generate_series(1, 5000000) GROUP BY value ORDER BY 2 DESC LIMIT 1")
    assert r.returncode != 0 and "memory limit" in r.stderr, r.stderr
    started = time.time()
    r = psql(svc, "SELECT count(*) FROM generate_series(1, 100000000000)")
    assert r.returncode != 0 and "timeout" in r.stderr, r.stderr
    assert time.time() - started < 30
    # The service still answers.
    assert psql_rows(svc, "SELECT 41 + 1") == [["42"]]


def test_token_auth(make_service):
    svc = make_service({
        "LEDGERLAKE_BROKER__AUTHENTICATION__ENABLED": "true",
        "LEDGERLAKE_BROKER__AUTHENTICATION__TOKENS": '{s3cret="analyst"}',
    })
    svc.start()
    ok = psql(svc, "SELECT 1", password="s3cret")
    assert ok.returncode == 0 and ok.stdout.strip() == "1", ok.stderr
    bad = psql(svc, "SELECT 1", password="wrong")
    assert bad.returncode != 0 and "password" in bad.stderr.lower(), bad.stderr
    none = psql(svc, "SELECT 1")
    assert none.returncode != 0
    assert sql_http(svc, "SELECT 1")[0] == 401
    assert sql_http(svc, "SELECT 1", token="s3cret")[0] == 200


def test_seam_is_exact_while_producing_and_offloading(make_service):
    """Every query sees each acknowledged message exactly once while a producer writes and
    offload (with immediate local deletion) moves the seam underneath."""
    svc = make_service(FAST)
    svc.start()
    set_policy(svc, "offloadDeletionLagMs", 0)
    topic = "persistent://public/default/sql-seam"
    client = pulsar.Client(svc.url)
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=20,
                                      batching_max_publish_delay_ms=2, block_if_queue_full=True)
    acked = [0]
    sent = [0]
    stop = threading.Event()
    errors = []

    def on_ack(res, _mid):
        if res == pulsar.Result.Ok:
            acked[0] += 1
        else:
            errors.append(res)

    def produce_loop():
        i = 0
        while not stop.is_set():
            sent[0] += 1
            producer.send_async(f"m{i}".encode(), on_ack, partition_key=f"k{i % 13}")
            i += 1
            if i % 200 == 0:
                time.sleep(0.02)

    def offload_loop():
        url = f"{svc.http}/admin/v2/persistent/public/default/sql-seam/offload"
        while not stop.is_set():
            http("PUT", url)
            time.sleep(0.3)

    threads = [threading.Thread(target=produce_loop), threading.Thread(target=offload_loop)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        conn = psycopg2.connect(host="127.0.0.1", port=svc.pg_port, user="u", dbname="d",
                                connect_timeout=10)
        conn.autocommit = True
        cur = conn.cursor()
        checks = 0
        for _ in range(15):
            before = acked[0]
            cur.execute("""SELECT count(*), count(DISTINCT sequence_id), min(sequence_id),
                           max(sequence_id) FROM "sql-seam" """)
            n, distinct, lo, hi = cur.fetchone()
            upper = sent[0]
            assert n == distinct, (n, distinct)
            assert lo == 0 and hi == n - 1, (n, lo, hi)
            assert before <= n <= upper, (before, n, upper)
            checks += 1
            time.sleep(0.2)
        conn.close()
    finally:
        stop.set()
        for t in threads:
            t.join()
    producer.flush()

    def all_answered():
        assert acked[0] + len(errors) == sent[0], (acked[0], errors[:5], sent[0])
    eventually(all_answered)
    client.close()
    assert not errors
    assert checks == 15
    states = [l["ledger"]["state"] for l in stats(svc, topic)["ledgers"]]
    assert "deleted" in states, states


def test_extended_protocol_with_typed_parameters(topic_svc):
    """pg8000 uses Parse/Bind/Describe/Execute with typed parameters (like JDBC)."""
    import datetime
    import pg8000.dbapi
    conn = pg8000.dbapi.connect(host="127.0.0.1", port=topic_svc.pg_port, user="x", database="y")
    try:
        cur = conn.cursor()
        cur.execute('SELECT count(*) FROM "sql-basic" WHERE key = %s AND ledger_id >= %s',
                    ("ключ-3", 0))
        assert cur.fetchone()[0] == sum(1 for i in range(N) if key_of(i) == "ключ-3")
        since = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
        cur.execute('SELECT count(*) FROM "sql-basic" WHERE publish_time >= %s', (since,))
        assert cur.fetchone()[0] == N
        cur.execute("""SELECT key, properties['n'], payload FROM "sql-basic"
                       WHERE properties['n'] = %s""", ("12",))
        (key, n, payload), = cur.fetchall()
        assert (key, n, bytes(payload)) == (key_of(12), "12", json.dumps({"i": 12, "name": "ü12"}).encode())
        # The same prepared statement executed again sees new data (a fresh seam each time).
        cur.execute('SELECT count(*) FROM "sql-basic" WHERE ledger_id >= %s', (0,))
        assert cur.fetchone()[0] == N
    finally:
        conn.close()


def test_json_operators_typed_columns_and_partitions(make_service):
    from pulsar.schema import Integer, JsonSchema, Record, String

    class Sale(Record):
        amount = Integer()
        region = String()

    svc = make_service(FAST)
    svc.start()
    set_policy(svc, "offloadDeletionLagMs", 0)
    client = pulsar.Client(svc.url)
    # A JSON-schema topic: typed columns in the lake half and the live half alike.
    topic = "persistent://public/default/sales"
    producer = client.create_producer(topic, schema=JsonSchema(Sale))
    for i in range(40):
        producer.send(Sale(amount=i, region=["eu", "us"][i % 2]))
    offload_and_wait(svc, topic)
    for i in range(40, 60):
        producer.send(Sale(amount=i, region=["eu", "us"][i % 2]))
    rows = psql_rows(svc, """SELECT region, sum(amount), count(*) FROM sales
                             GROUP BY region ORDER BY region""")
    assert rows == [["eu", str(sum(range(0, 60, 2))), "30"], ["us", str(sum(range(1, 60, 2))), "30"]]
    rows = psql_rows(svc, """SELECT sum(CAST(CAST(payload AS VARCHAR)->>'amount' AS BIGINT)),
                             count(*) FILTER (WHERE json_get_str(CAST(payload AS VARCHAR), 'region') = 'eu')
                             FROM sales""")
    assert rows == [[str(sum(range(60))), "30"]]
    # A partitioned topic is one table over all partitions.
    status, body = http("PUT", f"{svc.http}/admin/v2/persistent/public/default/parts/partitions", "3")
    assert status in (200, 204), body
    p = client.create_producer("persistent://public/default/parts",
                               message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
                               batching_enabled=False)
    for i in range(90):
        p.send(f"{i}".encode(), partition_key=f"k{i}")
    offload_and_wait(svc, "persistent://public/default/parts")
    for i in range(90, 120):
        p.send(f"{i}".encode(), partition_key=f"k{i}")
    rows = psql_rows(svc, """SELECT partition, count(*) FROM parts GROUP BY partition ORDER BY partition""")
    assert [r[0] for r in rows] == ["0", "1", "2"] and sum(int(r[1]) for r in rows) == 120, rows
    assert psql_rows(svc, "SELECT count(*) FROM parts WHERE partition = 1") == [[rows[1][1]]]
    client.close()


def test_sql_without_the_lake_reads_the_log(make_service):
    svc = make_service({"LEDGERLAKE_LAKE__ENABLED": "false"})
    svc.start()
    client = pulsar.Client(svc.url)
    produce(client, "persistent://public/default/local-only", 0, 25)
    client.close()
    assert psql_rows(svc, 'SELECT count(*), count(key) FROM "local-only"') == \
        [["25", str(sum(1 for i in range(25) if key_of(i) is not None))]]
    r = psql(svc, 'SELECT count(*) FROM "local-only$snapshots"')
    assert r.returncode != 0 and "no lake table" in r.stderr, r.stderr
