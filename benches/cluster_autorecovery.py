#!/usr/bin/env python3
"""Issue 19 figure: autorecovery MB/s.

    python benches/cluster_autorecovery.py --bin target/release/ledgerlake [--runs 3] [--mb 256]

Each run: three nodes on one etcd (lake off, default 3/3/2 replication, session TTL 3 s,
`autorecovery.delay = 2s`); `ledgerlake perf produce` writes about `--mb` MiB of 8 KiB
messages to four topics; the namespace is unloaded (every ledger sealed, each on all three
bookies). Then one node is SIGKILLed, its data directory wiped, and it is restarted as a new
bookie: autorecovery copies every sealed ledger to it. The copy rate is the bytes the new
bookie's autorecovery copied (`bytesCopied` of `GET /admin/v2/autorecovery`) over the time
from its first "copying a ledger here" log line to its last "copied" line (journal fsync on,
the machine's one disk shared by all three nodes). Also reported: the time from the restart
until no sealed ledger is short of copies (includes the delay and the node's start).

Prints a JSON document, then a markdown snippet, on stdout; stops every process by PID.
"""
import argparse
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "interop"))
from conftest import Service, _free_port  # noqa: E402
from servers import Etcd  # noqa: E402

ENV = {"LEDGERLAKE_LAKE__ENABLED": "false", "LEDGERLAKE_METADATA__SESSION_TTL": "3s",
       "LEDGERLAKE_AUTORECOVERY__DELAY": "2s"}
SIZE = 8192


def http(node, method, path):
    req = urllib.request.Request(node.http + path, method=method)
    with urllib.request.urlopen(req, timeout=60) as r:
        raw = r.read()
        return json.loads(raw) if raw else None


def sealed_ledgers(etcd, prefix):
    out = {}
    for value in etcd.items(f"{prefix}/ledgers/").values():
        r = json.loads(value[1:])
        if r.get("seal") and r["seal"]["entry_count"] > 0:
            out[r["id"]] = r
    return out


def stamps(log_path, text):
    out = []
    with open(log_path) as f:
        for line in f:
            if text in line:
                at = line.split()[0].rstrip("Z")
                out.append(datetime.datetime.fromisoformat(at[:26]).timestamp())
    return out


def one_run(binary, etcd, mb, run):
    prefix = f"/arbench-{run}-{time.time_ns()}"
    dirs = [tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) for _ in range(3)]
    nodes = [Service(binary, d.name, env=ENV,
                     args=["--metadata-url", etcd.url(prefix),
                           "--bookie-addr", f"127.0.0.1:{_free_port()}"]) for d in dirs]
    try:
        for n in nodes:
            n.start()
        # The perf tool takes one host; lookups redirect it to each topic's owner.
        url = nodes[0].url
        rate = 4000
        duration = max(2, round(mb * 1024 * 1024 / SIZE / rate))
        out = subprocess.run([binary, "perf", "produce", "--service-url", url, "--topic",
                              "persistent://public/default/arbench", "--topic-count", "4",
                              "--rate", str(rate), "--size", str(SIZE), "--duration",
                              f"{duration}s", "--json"],
                             capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, out.stderr[:1500]
        http(nodes[0], "PUT", "/admin/v2/namespaces/public/default/unload")
        time.sleep(1)
        sealed = sealed_ledgers(etcd, prefix)
        total = sum(r["seal"]["size_bytes"] for r in sealed.values())
        victim = nodes[2]
        with open(os.path.join(victim.data_dir, "data", "ledger", "bookie-id")) as f:
            old = f.read().split()[-1]
        held = [r for r in sealed.values() if old in [r["bookie"], *r["replicas"]]]
        assert held, f"no sealed ledger on the victim: {sealed}"
        victim.stop(signal.SIGKILL)
        shutil.rmtree(os.path.join(victim.data_dir, "data"))
        restarted = time.time()
        victim.start()
        deadline = time.time() + 600
        while True:
            records = sealed_ledgers(etcd, prefix)
            if all(len({r["bookie"], *r["replicas"]}) == 3 and len(r["replicas"]) == 2
                   and old not in [r["bookie"], *r["replicas"]] for r in records.values()) \
                    and all(not http(n, "GET", "/admin/v2/autorecovery")["underReplicated"]
                            for n in nodes):
                done = time.time()
                break
            assert time.time() < deadline, "autorecovery did not finish"
            time.sleep(0.2)
        status = http(victim, "GET", "/admin/v2/autorecovery")
        starts = stamps(victim.log_path, "autorecovery copying a ledger here")
        ends = stamps(victim.log_path, "autorecovery copied an under-replicated ledger here")
        copying = max(ends) - min(starts)
        return {"ledgers": len(sealed), "bytes_sealed": total,
                "bytes_copied": status["bytesCopied"], "copies": status["copiesMade"],
                "copy_seconds": round(copying, 2),
                "mb_per_s": round(status["bytesCopied"] / copying / 1e6, 1),
                "restart_to_restored_s": round(done - restarted, 2)}
    finally:
        for n in nodes:
            n.stop(signal.SIGKILL)
        for d in dirs:
            d.cleanup()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mb", type=int, default=256)
    a = ap.parse_args()
    etcd = Etcd()
    try:
        runs = [one_run(a.bin, etcd, a.mb, i) for i in range(a.runs)]
    finally:
        etcd.stop()
    med = {k: statistics.median(r[k] for r in runs)
           for k in ("mb_per_s", "copy_seconds", "restart_to_restored_s", "bytes_copied")}
    print(json.dumps({"runs": runs, "median": med}, indent=2))
    print(f"\n| autorecovery | MB/s (median of {a.runs}) | copy time | restart → restored |")
    print("|---|---|---|---|")
    print(f"| {med['bytes_copied'] / 1e6:.0f} MB in {runs[0]['ledgers']} ledgers | "
          f"{med['mb_per_s']} | {med['copy_seconds']} s | {med['restart_to_restored_s']} s |")


if __name__ == "__main__":
    main()
