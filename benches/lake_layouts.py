"""Many small topics in the lake (issue 22): a table per topic against one shared table per
namespace (`lakeTableLayout = shared`), on the embedded defaults (local warehouse, SQLite
catalog).

    python benches/lake_layouts.py --bin target/release/ledgerlake --topics 10000 --runs 3

Each run starts a fresh service per layout, then:
1. holds offload (`offloadThreshold = -1`), sets the layout, and `ledgerlake perf produce`
   writes `--messages-per-topic` messages to each of N topics;
2. waits until every topic is unloaded as idle (which seals its ledger), so N sealed ledgers
   wait;
3. releases offload (`offloadThreshold = 0`) and times until no sealed ledger is left (read
   from the metadata store's SQLite file), counting the catalog commits the service made
   (`ledgerlake_lake_commit_seconds_count`);
4. measures what the lake holds: bytes of table metadata (metadata JSON, manifest lists,
   manifests) under the warehouse, the catalog database's size, data files and their bytes.
Prints one JSON object per run and layout, then the medians per layout.
"""
import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import many_topics


def http(method, url, body=None):
    req = urllib.request.Request(url, data=body.encode() if body is not None else None,
                                 method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, r.read().decode()


def metric(base, name):
    """A metric's value (0 when absent)."""
    return many_topics.metric(base, name) or 0.0


def sealed_left(data_dir):
    """Sealed ledgers with entries (waiting for offload), read from the metadata store."""
    db = sqlite3.connect(f"file:{data_dir}/data/metadata.db?mode=ro", uri=True, timeout=30)
    try:
        return db.execute(
            "SELECT count(*) FROM ll_ledgers WHERE state = 2 AND entry_count > 0").fetchone()[0]
    finally:
        db.close()


def lake_footprint(data_dir):
    """Bytes of table metadata and of data files under the warehouse, and the catalog's size."""
    out = {"metadata_files": 0, "metadata_bytes": 0, "data_files": 0, "data_bytes": 0,
           "tables": 0}
    warehouse = os.path.join(data_dir, "data", "warehouse")
    for root, _, files in os.walk(warehouse):
        kind = "metadata" if os.path.basename(root) == "metadata" else "data"
        for f in files:
            size = os.path.getsize(os.path.join(root, f))
            out[f"{kind}_files"] += 1
            out[f"{kind}_bytes"] += size
    db = os.path.join(data_dir, "data", "catalog.db")
    out["catalog_db_bytes"] = sum(os.path.getsize(p) for p in (db, db + "-wal")
                                  if os.path.exists(p))
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        out["tables"] = conn.execute("SELECT count(*) FROM iceberg_tables").fetchone()[0]
    finally:
        conn.close()
    return out


def run_once(args, layout):
    with tempfile.TemporaryDirectory(dir=args.tmp) as d:
        svc = many_topics.Service(args.bin, d, args.idle,
                                  env={"LEDGERLAKE_LAKE__ENABLED": "true",
                                       "LEDGERLAKE_LAKE__CHECK_INTERVAL": "1s"})
        svc.start()
        try:
            ns = f"{svc.http}/admin/v2/namespaces/public/bench"
            http("PUT", ns, "")
            http("PUT", f"{ns}/offloadThreshold", "-1")
            http("PUT", f"{ns}/lakeTableLayout", layout)
            cmd = [args.bin, "perf", "produce", "--service-url", svc.url,
                   "--topic", "persistent://public/bench/t", "--topic-count", str(args.topics),
                   "--messages", str(args.topics * args.messages_per_topic),
                   "--rate", "20000", "--connections", "8", "--batch-max-messages", "1",
                   "--duration", "1h", "--json"]
            produced = json.loads(subprocess.run(cmd, check=True, capture_output=True,
                                                 text=True).stdout)
            deadline = time.time() + 1800
            while sealed_left(d) < args.topics or metric(svc.http, "ledgerlake_topics_loaded"):
                if time.time() > deadline:
                    raise RuntimeError("topics were not sealed")
                time.sleep(1)
            commits0 = metric(svc.http, "ledgerlake_lake_commit_seconds_count")
            failures0 = metric(svc.http, "ledgerlake_lake_commit_failures")
            started = time.time()
            http("PUT", f"{ns}/offloadThreshold", "0")
            while sealed_left(d):
                if time.time() - started > 3600:
                    raise RuntimeError("offload did not finish")
                time.sleep(0.5)
            seconds = time.time() - started
            commits = metric(svc.http, "ledgerlake_lake_commit_seconds_count") - commits0
            failures = metric(svc.http, "ledgerlake_lake_commit_failures") - failures0
            out = {"layout": layout, "topics": args.topics,
                   "messages": produced["messages"], "send_errors": produced["send_errors"],
                   "offload_seconds": round(seconds, 1), "commits": int(commits),
                   "commit_failures": int(failures),
                   "commits_per_s": round(commits / seconds, 2),
                   "topics_per_s": round(args.topics / seconds, 1)}
            svc.stop()
            foot = lake_footprint(d)
            out.update(foot)
            out["metadata_bytes_per_topic"] = round(
                (foot["metadata_bytes"] + foot["catalog_db_bytes"]) / args.topics)
            out["data_files_per_topic"] = round(foot["data_files"] / args.topics, 2)
            return out
        finally:
            svc.stop()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--topics", type=int, default=10000)
    p.add_argument("--messages-per-topic", type=int, default=3)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--idle", default="5s")
    p.add_argument("--layouts", default="per-topic,shared")
    p.add_argument("--tmp", default=None)
    args = p.parse_args()
    results = {layout: [] for layout in args.layouts.split(",")}
    for _ in range(args.runs):
        for layout in results:
            out = run_once(args, layout)
            print(json.dumps(out), flush=True)
            results[layout].append(out)
    for layout, runs in results.items():
        keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
        med = {k: statistics.median(r[k] for r in runs) for k in keys}
        print(json.dumps({"layout": layout, "median_of": len(runs), **med}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
