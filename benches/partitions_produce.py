"""20,000 msg/s over 10,000 partitions (issue 22), against each given service binary in turn.

    python benches/partitions_produce.py GEN_BIN SERVICE_BIN [SERVICE_BIN...]

For each SERVICE_BIN: a fresh service on embedded defaults (lake on) in a new temporary data
dir, on ports 16650/18080/15433; then GEN_BIN's `perf produce --partitions 10000 --rate 20000
--duration 20s --warmup 5s --batch-max-messages 1 --connections 16 --json` (publish latency
after the first 5 s, and over the whole run, and each 2 s interval's p99); resident memory before and
after; the service's CPU over 30 s of idle after a 5 s settle; SIGTERM and the time to exit
(killed after 300 s: `stop_s` null); the count of sqlx slow-acquire warnings and ERROR lines
and "hot partition" warnings in its log. Prints one JSON line per service binary; pass the binaries interleaved
(before, after, before, ...) to compare them in one run.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from metrics_compare import rss_kib


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return int(parts[11]) + int(parts[12])


def run(gen, svc, idx):
    d = tempfile.mkdtemp(prefix=f"ll-partitions-{idx}-")
    log = open(f"{d}/service.log", "w")
    p = subprocess.Popen([svc, "serve", "--data-dir", f"{d}/data", "--pulsar-addr", "127.0.0.1:16650",
                          "--http-addr", "127.0.0.1:18080", "--pg-addr", "127.0.0.1:15433"],
                         stdout=log, stderr=subprocess.STDOUT, cwd=d)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen("http://127.0.0.1:18080/health/ready", timeout=1)
                break
            except Exception:
                time.sleep(0.1)
        rss0 = rss_kib(p.pid)
        t0 = time.time()
        out = subprocess.run([gen, "perf", "produce", "--service-url", "pulsar://127.0.0.1:16650",
                              "--topic", "persistent://public/default/p10k", "--partitions", "10000",
                              "--rate", "20000", "--duration", "20s", "--warmup", "5s", "--batch-max-messages", "1",
                              "--connections", "16", "--admin-url", "http://127.0.0.1:18080", "--json"], capture_output=True, text=True)
        wall = time.time() - t0
        rss1 = rss_kib(p.pid)
        try:
            res = json.loads(out.stdout)
        except Exception:
            res = {}
        if not res:
            res = {"stdout": out.stdout[-2000:], "stderr": out.stderr[-2000:]}
        # Each 2 s interval's p99 (ms) in place of the full timeline.
        res["interval_p99_ms"] = [i["latency"]["p99_us"] // 1000 for i in res.pop("timeline", [])]
        # idle CPU over 30 s after the run
        time.sleep(5)
        c0 = cpu_ticks(p.pid); time.sleep(30); c1 = cpu_ticks(p.pid)
        idle_cpu = (c1 - c0) / os.sysconf("SC_CLK_TCK") / 30.0
        t1 = time.time()
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=300)
            stop = time.time() - t1
        except subprocess.TimeoutExpired:
            stop = None
            p.kill(); p.wait()
    finally:
        if p.poll() is None:
            p.kill(); p.wait()
        log.close()
    with open(f"{d}/service.log") as f:
        text = f.read()
    slow = len(re.findall(r"slow threshold|slow acquire", text))
    hot = text.count("hot partition:")
    errors = len(re.findall(r" ERROR ", text))
    shutil.rmtree(d, ignore_errors=True)
    return {"service": svc, "gen_wall_s": round(wall, 1), "result": res, "rss_before_mb": rss0 // 1024,
            "rss_after_mb": rss1 // 1024, "idle_cpu_cores": round(idle_cpu, 3), "stop_s": stop,
            "slow_warnings": slow, "hot_partition_warnings": hot,
            "error_lines": errors}


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    gen = sys.argv[1]
    for i, svc in enumerate(sys.argv[2:]):
        print(json.dumps(run(gen, svc, i)), flush=True)


if __name__ == "__main__":
    main()
