"""What ledgers deleted locally cost the offload scheduler once some namespace's retention is
finite (issue 22: background work must not grow with the topics on a timer).

    python benches/retention_listing.py --bin target/release/ledgerlake --topics 2000

A fresh service with the lake on (local warehouse, SQLite catalog; one table per topic) and
`broker.unload_idle_after = 5s`, `offloadDeletionLagMs = 0` in `public/default`:
1. `ledgerlake perf produce` writes 2 messages to each of N topics (a ledger per entry), the
   topics unload when idle (their last ledgers sealed), the engine offloads every ledger and
   deletes the local copies; the script waits until the metadata store holds no ledger that
   is not deleted locally (read from `metadata.db`);
2. CPU over `--window` seconds with retention infinite everywhere (the default);
3. a namespace `public/finite` is created with a finite retention (it holds no topic), then
   CPU over the same window again.
Each deleted ledger stays in that state for good (the lake holds it). Prints one JSON object.
"""
import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from many_topics import Service, measure  # noqa: E402


def call(svc, method, path, body=None):
    req = urllib.request.Request(f"{svc.http}{path}", method=method,
                                 data=None if body is None else body.encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status


def ledger_states(data_dir):
    """{state number: count} of the ledgers in the metadata store (4 is deleted locally)."""
    db = sqlite3.connect(f"file:{data_dir}/data/metadata.db?mode=ro", uri=True, timeout=30)
    try:
        return dict(db.execute("SELECT state, count(*) FROM ll_ledgers GROUP BY state"))
    finally:
        db.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--topics", type=int, default=2000)
    ap.add_argument("--window", type=float, default=20)
    ap.add_argument("--tmp", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.tmp) as d:
        svc = Service(args.bin, d, "5s", env={
            "LEDGERLAKE_LAKE__ENABLED": "true",
            "LEDGERLAKE_LEDGER__ROLLOVER_ENTRIES": "1",
        })
        svc.start()
        try:
            pid = svc.proc.pid
            assert call(svc, "PUT", "/admin/v2/namespaces/public/default/offloadDeletionLagMs",
                        "0") == 204
            cmd = [args.bin, "perf", "produce", "--service-url", svc.url,
                   "--topic", "persistent://public/default/kept", "--topic-count",
                   str(args.topics), "--messages", str(2 * args.topics), "--rate", "20000",
                   "--connections", "16", "--batch-max-messages", "1", "--duration", "1h",
                   "--json"]
            subprocess.run(cmd, check=True, capture_output=True, text=True)
            started = time.time()
            while True:
                states = ledger_states(d)
                if states and set(states) == {4}:
                    break
                if time.time() - started > 1800:
                    raise RuntimeError(f"ledgers not all deleted locally: {states}")
                time.sleep(2)
            out = {"topics": args.topics, "ledgers_deleted_locally": states[4],
                   "offloaded_in_seconds": round(time.time() - started, 1)}
            time.sleep(5)
            out["infinite_everywhere"] = measure(pid, args.window)
            assert call(svc, "PUT", "/admin/v2/namespaces/public/finite", "{}") in (200, 204)
            assert call(svc, "POST", "/admin/v2/namespaces/public/finite/retention",
                        '{"retentionTimeInMinutes": 60, "retentionSizeInMB": -1}') == 204
            time.sleep(2)
            out["finite_in_another_namespace"] = measure(pid, args.window)
            print(json.dumps(out), flush=True)
        finally:
            svc.stop()


if __name__ == "__main__":
    main()
