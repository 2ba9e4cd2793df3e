"""SQL over a topic's lake table vs DuckDB reading the same Parquet data files; in one run,
against a release build of `ledgerlake serve` on local disk.

    python benches/sql_compare.py --bin target/release/ledgerlake [--messages 50000000]
                                  [--rounds 5]

1. `perf produce --messages N --keys 100000 --json-payloads --publish-time-span 30d`: a month of
   backfilled ~100 B JSON messages with 100k distinct keys, then offload everything and wait.
2. The data files of the table's current snapshot are listed from its manifests (PyIceberg), so
   DuckDB reads exactly the committed files (`read_parquet([...])`), in-process.
3. Per query and engine: one warm-up, then `--rounds` timed runs; medians. ledgerlake is queried
   through psycopg2 over the PostgreSQL protocol (so its times include the wire), DuckDB in the
   same Python process. Both must return the same answer.

Queries: a full-scan aggregate, a full-scan group-by on key, a one-hour time range out of the
month, and a key lookup. Prints a JSON summary for benches/RESULTS.md.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import duckdb
import psycopg2
from pyiceberg.catalog.sql import SqlCatalog

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "interop"))
from replay_compare import Service  # noqa: E402
from lake import http, offload_and_wait  # noqa: E402

TOPIC = "persistent://public/default/sqlbench"


def queries(hour_start_us):
    hour_end_us = hour_start_us + 3_600_000_000
    ts = "TIMESTAMP '{}'"
    return {
        "full_scan_aggregate": (
            "SELECT count(*), sum(sequence_id), max(publish_time) FROM {t}"),
        "full_scan_group_by_key": (
            "SELECT key, count(*) AS n FROM {t} GROUP BY key ORDER BY n DESC, key LIMIT 5"),
        "time_range_1h_of_30d": (
            "SELECT count(*), sum(sequence_id) FROM {t} WHERE publish_time >= " + ts.format(iso(hour_start_us))
            + " AND publish_time < " + ts.format(iso(hour_end_us))),
        "key_lookup": (
            "SELECT count(*), min(ledger_id), max(sequence_id) FROM {t} WHERE key = 'key-4242'"),
    }


def iso(us):
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(us / 1e6)) + "+00"


def timed(run, rounds):
    run()  # warm-up
    times = []
    result = None
    for _ in range(rounds):
        t = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times, result


def normalize(rows):
    out = []
    for row in rows:
        cells = []
        for c in row:
            if hasattr(c, "timestamp"):
                c = round(c.timestamp() * 1000)
            elif isinstance(c, float):
                c = round(c, 6)
            cells.append(c)
        out.append(tuple(cells))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--messages", type=int, default=50_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", default=None, help="keep the data set here (default: a temp dir)")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="sqlbench-")
    os.makedirs(work, exist_ok=True)
    svc = Service(args.bin, work, {})
    svc.start()
    pg_port = svc.pg
    try:
        admin = argparse.Namespace(http=f"http://127.0.0.1:{svc.http}")
        produced = os.path.join(work, "produced.json")
        if not os.path.exists(produced):
            t = time.time()
            subprocess.run([args.bin, "perf", "produce", "--service-url", f"pulsar://127.0.0.1:{svc.pulsar}",
                            "--topic", TOPIC, "--messages", str(args.messages), "--keys", "100000",
                            "--json-payloads", "--size", "100", "--publish-time-span", "30d",
                            "--duration", "3600s"], check=True)
            open(produced, "w").write(json.dumps({"produce_s": time.time() - t}))
        offloaded = os.path.join(work, "offloaded.json")
        if not os.path.exists(offloaded):
            t = time.time()
            offload_and_wait(admin, TOPIC, timeout=7200)
            open(offloaded, "w").write(json.dumps({"offload_s": time.time() - t}))
        prep = dict(json.loads(open(produced).read()), **json.loads(open(offloaded).read()))

        catalog = SqlCatalog("ledgerlake", uri=f"sqlite:///{work}/data/catalog.db",
                             warehouse=f"file://{work}/data/warehouse")
        _, st = http("GET", f"{admin.http}/admin/v2/persistent/public/default/sqlbench/stats")
        table = catalog.load_table(tuple(st["lake"]["namespace"]) + (st["lake"]["tableName"],))
        files = [f.file.file_path.removeprefix("file:") for f in table.scan().plan_files()]
        lake_bytes = sum(os.path.getsize(f) for f in files)

        conn = psycopg2.connect(host="127.0.0.1", port=pg_port, user="bench", dbname="lake")
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute("SELECT count(*), min(publish_time), max(publish_time) FROM sqlbench")
        rows, lo, hi = cur.fetchone()
        mid_us = int((lo.timestamp() + (hi.timestamp() - lo.timestamp()) / 2) * 1e6)
        mid_us -= mid_us % 3_600_000_000

        duck = duckdb.connect()
        duck.execute("SET TimeZone = 'UTC'")
        file_list = "[" + ",".join(f"'{f}'" for f in files) + "]"
        duck.execute(f"CREATE VIEW sqlbench AS SELECT * FROM read_parquet({file_list})")

        results = {}
        for name, q in queries(mid_us).items():
            def ours():
                cur.execute(q.format(t="sqlbench"))
                return normalize(cur.fetchall())

            def theirs():
                return normalize(duck.execute(q.format(t="sqlbench")).fetchall())

            ours_s, ours_all, ours_rows = timed(ours, args.rounds)
            duck_s, duck_all, duck_rows = timed(theirs, args.rounds)
            assert ours_rows == duck_rows, (name, ours_rows, duck_rows)
            results[name] = {
                "ledgerlake_median_s": round(ours_s, 4),
                "duckdb_median_s": round(duck_s, 4),
                "ratio_ledgerlake_over_duckdb": round(ours_s / duck_s, 3),
                "ledgerlake_runs_s": [round(x, 4) for x in ours_all],
                "duckdb_runs_s": [round(x, 4) for x in duck_all],
                "answer": [list(map(str, r)) for r in ours_rows][:5],
            }
            print(name, json.dumps(results[name]), file=sys.stderr)
        summary = {
            "rows": rows,
            "data_files": len(files),
            "lake_bytes": lake_bytes,
            "produce_s": round(prep["produce_s"], 1),
            "offload_s": round(prep["offload_s"], 1),
            "rounds": args.rounds,
            "queries": results,
            "duckdb_version": duckdb.__version__,
        }
        print(json.dumps(summary, indent=2))
    finally:
        svc.stop()


if __name__ == "__main__":
    main()
