"""Offload throughput, in one run: ledgerlake's whole pipeline (sealed Pulsar batches → committed
Iceberg snapshot) vs PyIceberg 0.12's `append` of the same rows already built as Arrow, vs plain
parquet-rs encoding to memory; on local disk and on a local S3 server (SeaweedFS).

    python benches/offload_compare.py --bin target/release/ledgerlake [--total 256MiB] [--rounds 3]

Prints a JSON summary (medians over rounds) for benches/RESULTS.md.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "interop"))
from servers import BUCKET, S3Server  # noqa: E402


def run_ours(binary, work, total, env):
    out = subprocess.run([binary, "perf", "offload", "--dir", work, "--total", total,
                          "--dump-arrow", "--json"], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout)


def run_pyiceberg(files, s3):
    args = [sys.executable, os.path.join(HERE, "pyiceberg_append.py")] + files
    if s3:
        args += ["--warehouse", f"s3://{BUCKET}/bench", "--s3-endpoint", s3.endpoint]
    out = subprocess.run(args, check=True, capture_output=True, text=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--total", default="256MiB")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    s3 = S3Server()
    results = {}
    try:
        for storage in ["local", "s3"]:
            rows = {}
            for _ in range(args.rounds):
                work = tempfile.mkdtemp(prefix="ll-offload-bench-")
                env = dict(os.environ)
                if storage == "s3":
                    env.update(s3.service_env(f"bench-{os.getpid()}"))
                try:
                    ours = run_ours(args.bin, work, args.total, env)
                    files = [os.path.join(work, f"rows-{r['message_size']}.arrow") for r in ours]
                    theirs = run_pyiceberg(files, s3 if storage == "s3" else None)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
                for o, t in zip(ours, theirs):
                    r = rows.setdefault(o["message_size"], {"ours": [], "pyiceberg": []})
                    r["ours"].append(o)
                    r["pyiceberg"].append(t)
            for size, r in rows.items():
                med = lambda xs, k: statistics.median(x[k] for x in xs)  # noqa: E731
                ours_mb = med(r["ours"], "pipeline_mb_per_s")
                py_mb = med(r["pyiceberg"], "mb_per_s")
                pq_mb = med(r["ours"], "parquet_rs_mb_per_s")
                results[f"{storage}-{size}B"] = {
                    "messages": r["ours"][0]["messages"],
                    "raw_mb": r["ours"][0]["raw_bytes"] / 1e6,
                    "ours_mb_per_s": ours_mb,
                    "ours_rows_per_s": med(r["ours"], "pipeline_rows_per_s"),
                    "pyiceberg_mb_per_s": py_mb,
                    "pyiceberg_rows_per_s": med(r["pyiceberg"], "rows_per_s"),
                    "parquet_rs_mb_per_s": pq_mb,
                    "ours_vs_pyiceberg": ours_mb / py_mb,
                    "ours_vs_parquet_rs": ours_mb / pq_mb,
                    "ours_lake_ratio": med(r["ours"], "lake_ratio"),
                    "pyiceberg_lake_ratio": med(r["pyiceberg"], "lake_ratio"),
                    "rounds": args.rounds,
                    "all_ours_mb_per_s": [x["pipeline_mb_per_s"] for x in r["ours"]],
                    "all_pyiceberg_mb_per_s": [x["mb_per_s"] for x in r["pyiceberg"]],
                }
    finally:
        s3.stop()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
