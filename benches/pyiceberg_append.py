"""PyIceberg's write step on the same rows as `ledgerlake perf offload --dump-arrow`: loads the
Arrow IPC file (rows already built), creates a table partitioned by day(publish_time) in a SQL
catalog on SQLite, and times `table.append`. Prints one JSON object per file.

    python benches/pyiceberg_append.py DIR/rows-100.arrow [DIR/rows-1024.arrow ...] \
        [--warehouse s3://warehouse/prefix --s3-endpoint http://127.0.0.1:8333 \
         --s3-key test --s3-secret testtest]
"""
import argparse
import json
import os
import tempfile
import time
import uuid

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import DayTransform


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--warehouse")
    ap.add_argument("--s3-endpoint")
    ap.add_argument("--s3-key", default="test")
    ap.add_argument("--s3-secret", default="testtest")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        props = {}
        warehouse = f"file://{d}/warehouse"
        if args.warehouse:
            warehouse = f"{args.warehouse.rstrip('/')}/pyiceberg-{uuid.uuid4().hex[:8]}"
            props = {"s3.endpoint": args.s3_endpoint, "s3.access-key-id": args.s3_key,
                     "s3.secret-access-key": args.s3_secret, "s3.region": "us-east-1"}
        os.makedirs(f"{d}/warehouse", exist_ok=True)
        catalog = SqlCatalog("bench", uri=f"sqlite:///{d}/catalog.db", warehouse=warehouse, **props)
        catalog.create_namespace("bench")
        for path in args.files:
            with pa.memory_map(path) as src:
                rows = pa.ipc.open_file(src).read_all()
            raw = pc.sum(pc.binary_length(rows["payload"])).as_py()
            name = os.path.basename(path).replace(".arrow", "").replace("-", "_")
            table = catalog.create_table(f"bench.{name}", schema=rows.schema)
            field = table.schema().find_field("publish_time")
            with table.update_spec() as spec:
                spec.add_field("publish_time", DayTransform(), "publish_day")
            start = time.perf_counter()
            table.append(rows)
            secs = time.perf_counter() - start
            files = table.inspect.files()
            lake_bytes = pc.sum(files["file_size_in_bytes"]).as_py()
            print(json.dumps({
                "file": path, "rows": rows.num_rows, "raw_bytes": raw,
                "seconds": secs, "mb_per_s": raw / 1e6 / secs,
                "rows_per_s": rows.num_rows / secs,
                "lake_bytes": lake_bytes, "lake_ratio": lake_bytes / raw,
                "files": files.num_rows, "warehouse": warehouse,
            }))
            del field


if __name__ == "__main__":
    main()
