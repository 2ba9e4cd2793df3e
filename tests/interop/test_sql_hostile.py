"""Hostile SQL (issue 20): no statement reads or writes a file or a URL, on every surface
(psql's simple protocol, psycopg2's extended protocol, `POST /sql`); a cross join of two topics
and an unbounded sort are stopped by the memory limit or the deadline with a clear error,
several at once while a producer writes, and the service stays up (the producer is never
refused, later queries answer)."""
import http.server
import os
import signal
import tempfile
import threading
import uuid

import psycopg2
import pulsar
import pytest

from conftest import Sends, Service, _binary, eventually
from test_metrics import scrape
from test_sql import psql, psql_rows, sql_http

N = 20_000


class Canary(http.server.BaseHTTPRequestHandler):
    """An HTTP server that only counts the requests it gets (none may arrive)."""
    hits = []

    def do_GET(self):
        Canary.hits.append(("GET", self.path))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"a,b\n1,2\n")

    do_PUT = do_POST = do_HEAD = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def canary():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Canary)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    with tempfile.TemporaryDirectory() as d:
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}", d
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)


def produce(client, topic, n):
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=500,
                                      batching_max_publish_delay_ms=5, block_if_queue_full=True)
    sends = Sends()
    for i in range(n):
        producer.send_async(f"{topic[-6:]}-{i:08d}-{'p' * 60}".encode(), sends.callback())
    sends.check(producer, n)
    producer.close()


@pytest.fixture(scope="module")
def hostile_svc():
    """A service with small SQL limits and two topics of N messages each."""
    d = tempfile.TemporaryDirectory()
    svc = Service(_binary(), d.name, env={"LEDGERLAKE_SQL__MEMORY_LIMIT": "64MiB",
                                          "LEDGERLAKE_SQL__QUERY_TIMEOUT": "5s"})
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    names = [f"hostile-{c}-{uuid.uuid4().hex[:6]}" for c in "ab"]
    for name in names:
        produce(client, f"persistent://public/default/{name}", N)
    try:
        yield svc, client, names
    finally:
        client.close()
        svc.stop(signal.SIGKILL)
        d.cleanup()


def forbidden(url, canary_dir, table):
    return [
        f"SELECT * FROM '{url}/x.csv'",
        f"SELECT * FROM read_csv('{url}/x.csv')",
        f"SELECT * FROM read_parquet('{url}/x.parquet')",
        "SELECT * FROM read_json('/etc/hostname')",
        "SELECT * FROM '/etc/passwd'",
        f"SELECT * FROM '{canary_dir}/../../../../etc/passwd'",
        f"CREATE EXTERNAL TABLE evil STORED AS CSV LOCATION '{url}/x.csv'",
        f"CREATE EXTERNAL TABLE evil2 STORED AS PARQUET LOCATION '{canary_dir}/'",
        f"COPY (SELECT 1) TO '{url}/out.csv'",
        f"COPY (SELECT 1) TO '{canary_dir}/out.parquet' STORED AS PARQUET",
        f"COPY \"{table}\" TO '{canary_dir}/dump.csv'",
        "CREATE FUNCTION plus_one(x INT) RETURNS INT RETURN x + 1",
        "CREATE TABLE copied AS SELECT 1",
        "CREATE VIEW v AS SELECT 1",
        f"INSERT INTO \"{table}\" (payload) VALUES ('x')",
        f"DELETE FROM \"{table}\"",
        "SET datafusion.catalog.location = '/etc'",
        f"SET datafusion.runtime.temp_directory = '{canary_dir}'",
        "SET datafusion.execution.listing_table_ignore_subdirectory = false",
    ]


def test_no_statement_reads_or_writes_a_file_or_url(hostile_svc, canary):
    svc, _, (a, _) = hostile_svc
    url, canary_dir = canary
    before = psql_rows(svc, f'SELECT count(*) FROM "{a}"')
    conn = psycopg2.connect(host="127.0.0.1", port=svc.pg_port, user="analyst", dbname="lake")
    conn.autocommit = True
    try:
        for sql in forbidden(url, canary_dir, a):
            r = psql(svc, sql)
            assert r.returncode != 0, (sql, r.stdout)
            assert "root:" not in r.stdout + r.stderr, sql
            status, body = sql_http(svc, sql)
            # Refused (400/403), or a URL taken for a table name that does not exist (404).
            assert status in (400, 403, 404), (sql, status, body)
            with conn.cursor() as cur:
                with pytest.raises(psycopg2.Error):
                    cur.execute(sql + " -- %s", ("extended",))
    finally:
        conn.close()
    assert Canary.hits == [], Canary.hits
    assert os.listdir(canary_dir) == []
    assert psql_rows(svc, f'SELECT count(*) FROM "{a}"') == before


def test_cross_joins_and_huge_sorts_are_stopped(hostile_svc):
    svc, client, (a, b) = hostile_svc
    heavy = [
        # 8 × 10^12 triples to test: the deadline.
        f'SELECT count(*) FROM "{a}" x CROSS JOIN "{b}" y CROSS JOIN "{a}" z '
        f'WHERE (length(x.payload) * x.entry_id + y.entry_id + z.entry_id) % 1000 = 7',
        # 400 million rows to sort: the memory limit.
        f'SELECT x.payload, y.payload FROM "{a}" x CROSS JOIN "{b}" y ORDER BY 1, 2',
        # A 100 GB sort of generated rows: the memory limit.
        "SELECT value FROM generate_series(1, 10000000000) ORDER BY value DESC",
        # A sort that keeps only ten rows runs in bounded memory: the deadline.
        "SELECT value FROM generate_series(1, 100000000000) ORDER BY value DESC LIMIT 10",
    ]
    for sql in heavy:
        r = psql(svc, sql)
        assert r.returncode != 0, (sql, r.stdout[:200])
        assert "memory limit" in r.stderr or "timeout" in r.stderr, (sql, r.stderr)

    # Several at once (over the concurrency limit: some wait their turn) while a producer
    # writes: every query ends with a clear error, the producer is never refused.
    results = []

    def run(sql):
        results.append((sql, psql(svc, sql)))
    threads = [threading.Thread(target=run, args=(heavy[i % len(heavy)],)) for i in range(12)]
    for t in threads:
        t.start()
    topic = f"persistent://public/default/during-{uuid.uuid4().hex[:6]}"
    produce(client, topic, 2000)
    for t in threads:
        t.join(timeout=300)
    assert len(results) == 12
    for sql, r in results:
        assert r.returncode != 0 and ("memory limit" in r.stderr or "timeout" in r.stderr), \
            (sql, r.stderr)
    # Each stopped query stopped working too: none runs on after its client got the error
    # (a join drained in one loop never yielded, so it ran on, holding a query slot).
    def none_running():
        values, _ = scrape(svc)
        assert sum(v for _, v in values.get("ledgerlake_sql_queries_running", [])) == 0
    eventually(none_running, timeout=15, interval=0.5)
    # The service stays up and answers.
    assert psql_rows(svc, "SELECT 41 + 1") == [["42"]]
    assert psql_rows(svc, f'SELECT count(*) FROM "{topic.rsplit("/", 1)[1]}"') == [["2000"]]
