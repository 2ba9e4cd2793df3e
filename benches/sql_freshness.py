#!/usr/bin/env python3
"""Issue 21 figure: freshness, produce → visible in a SQL count, p50/p99, at 20k msg/s.

    python benches/sql_freshness.py --bin target/release/ledgerlake [--seconds 60]
        [--idle-seconds 30] [--rate 20000] [--interval 0.2] [--surfaces pg,http] [--out F.json]

One `ledgerlake serve` on a temp data dir, default configuration (`sync = always`, lake on,
each ledger offloaded as it seals), bound to 127.0.0.1 on free ports; stopped by PID at the end.

Two phases on that service:

1. **idle**: no other traffic; probes on their own topic (`freshness-idle`).
2. **loaded**: `ledgerlake perf produce --rate RATE --size 100` (batched as perf does by
   default) on topic `freshness`; after a warm-up, probes on the SAME topic while it runs.

A probe: the official Python client (batching off) sends one message with partition key
`probe-N`; `t_send` is taken just before `send_async`, `t_ack` when its SEND_RECEIPT callback
runs. Polling starts at once (before the ack) and repeats back to back until the answer is 1:

    SELECT count(*) AS n FROM <topic> WHERE key = 'probe-N'

over one persistent psycopg2 connection (PostgreSQL wire) or, with `--surfaces pg,http`, probes
alternate between that and one keep-alive HTTP connection (`POST /sql`). Per probe:

- `send → answer`: end of the first poll that returned 1, minus `t_send` (what a client that
  polls sees; the headline figure);
- `ack → answer`: the same end minus `t_ack` (negative would mean visible before acknowledged);
- `send → start of answering poll`: when the poll that saw it was sent. A query reads the log's
  durable end while it is planned, a little after it was sent, so this is not a strict bound;
  `polls per probe` = 1 means the first query sent after the message already saw it, i.e. the
  figure is the write's durability plus one query, not a wait for anything else.

Probes start every `--interval` s (one at a time: the next starts when the previous is visible,
or at its slot, whichever is later). Reported: percentiles of each, the poll round-trip time of
every poll (so query time can be told from freshness), polls per probe, the achieved produce
rate (perf's own summary and its 2 s progress lines inside the probe window) and publish
latency, and CPU over the probe window (service, perf, this script, whole machine).

Prints one JSON document, then a markdown snippet for benches/RESULTS.md, on stdout; progress on
stderr. Exit status 0 even when the load falls short of `--rate`: the JSON says so
(`load.achieved_in_window_msgs_per_s`).
"""
import argparse
import http.client
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import psycopg2
import pulsar

CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_running():
    """Names of compiler processes running now (a concurrent build skews every figure)."""
    names = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if comm in ("cargo", "rustc", "cc", "cc1", "ld", "ld.lld", "mold") or comm.startswith("rustc"):
            names.append(comm)
    return sorted(set(names))


def proc_cpu_s(pid):
    """utime + stime of a process, seconds (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def all_procs_cpu():
    """{pid: (comm, cpu seconds)} of every process."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                head, tail = f.read().rsplit(")", 1)
        except OSError:
            continue
        fields = tail.split()
        out[int(pid)] = (head.split("(", 1)[1], (int(fields[11]) + int(fields[12])) / CLK_TCK)
    return out


def machine_cpu():
    """(busy, total) jiffies of all CPUs."""
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return sum(parts) - idle, sum(parts)


class CpuWindow:
    """CPU used by some processes and by the machine between start() and stop()."""

    def __init__(self, pids):
        self.pids = pids

    def start(self):
        self.t0 = time.perf_counter()
        self.p0 = {k: proc_cpu_s(p) for k, p in self.pids.items()}
        self.self0 = time.process_time()
        self.m0 = machine_cpu()
        self.all0 = all_procs_cpu()

    def stop(self):
        wall = time.perf_counter() - self.t0
        out = {"wall_s": round(wall, 2)}
        for k, p in self.pids.items():
            now = proc_cpu_s(p)
            if now is not None and self.p0[k] is not None:
                out[f"{k}_cores"] = round((now - self.p0[k]) / wall, 3)
        out["probe_script_cores"] = round((time.process_time() - self.self0) / wall, 3)
        busy, total = machine_cpu()
        out["machine_busy_fraction"] = round((busy - self.m0[0]) / max(1, total - self.m0[1]), 3)
        out["machine_cores"] = os.cpu_count()
        # Whatever else ran meanwhile (other benchmarks, builds): noise to know about.
        mine = set(self.pids.values()) | {os.getpid()}
        others = []
        for pid, (comm, cpu) in all_procs_cpu().items():
            if pid in mine:
                continue
            before = self.all0.get(pid, (comm, 0.0))[1]
            if (cpu - before) / wall >= 0.05:
                others.append({"pid": pid, "comm": comm, "cores": round((cpu - before) / wall, 3)})
        out["other_processes_cores"] = sorted(others, key=lambda o: -o["cores"])[:8]
        out["other_processes_total_cores"] = round(sum(o["cores"] for o in others), 3)
        return out


class Service:
    def __init__(self, binary):
        self.binary = binary
        self.dir = tempfile.mkdtemp(prefix="ll-fresh-")
        self.pulsar, self.http, self.pg = free_port(), free_port(), free_port()
        self.log_path = os.path.join(self.dir, "serve.log")
        self.proc = None

    def start(self):
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(
                [self.binary, "serve", "--data-dir", os.path.join(self.dir, "data"),
                 "--pulsar-addr", f"127.0.0.1:{self.pulsar}",
                 "--http-addr", f"127.0.0.1:{self.http}", "--pg-addr", f"127.0.0.1:{self.pg}"],
                stdout=subprocess.DEVNULL, stderr=logf)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"service exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/health/ready", timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("service did not become ready")

    def stop(self, keep=False):
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if keep:
            log(f"kept {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


class Load:
    """`perf produce` in the background; its 2 s progress lines are kept with their times."""

    def __init__(self, binary, svc, topic, rate, seconds, size, batch_max):
        self.args = [binary, "perf", "produce", "--service-url", f"pulsar://127.0.0.1:{svc.pulsar}",
                     "--topic", topic, "--rate", str(rate), "--size", str(size),
                     "--duration", f"{seconds}s", "--json"]
        if batch_max is not None:
            self.args += ["--batch-max-messages", str(batch_max)]
        self.progress = []  # (perf_counter at the line, msg/s of the 2 s before it)
        self.stderr_tail = []
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.started = time.perf_counter()
        self.out = []
        self.t_err = threading.Thread(target=self._read_err, daemon=True)
        self.t_out = threading.Thread(target=lambda: self.out.append(self.proc.stdout.read()),
                                      daemon=True)
        self.t_err.start()
        self.t_out.start()

    def _read_err(self):
        for line in self.proc.stderr:
            now = time.perf_counter()
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "produced" and parts[2] == "msg/s":
                self.progress.append((now, float(parts[1])))
            else:
                self.stderr_tail = (self.stderr_tail + [line.rstrip()])[-20:]

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout):
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError("perf produce did not finish")
        self.t_out.join(timeout=10)
        self.t_err.join(timeout=10)
        if self.proc.returncode != 0:
            raise RuntimeError(f"perf produce failed ({self.proc.returncode}): "
                               + "\n".join(self.stderr_tail))
        return json.loads("".join(self.out))

    def rate_between(self, t0, t1):
        """Rates of the progress intervals that lie wholly inside [t0, t1]."""
        return [r for (t, r) in self.progress if t - 2.0 >= t0 - 0.05 and t <= t1 + 0.05]

    def kill(self):
        if self.alive():
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


class PgPoller:
    name = "pg"

    def __init__(self, svc):
        self.conn = psycopg2.connect(host="127.0.0.1", port=svc.pg, user="bench", dbname="lake",
                                     connect_timeout=10)
        self.conn.autocommit = True
        self.cur = self.conn.cursor()

    def count(self, sql):
        self.cur.execute(sql)
        return self.cur.fetchone()[0]

    def close(self):
        self.conn.close()


class HttpPoller:
    name = "http"

    def __init__(self, svc):
        self.conn = http.client.HTTPConnection("127.0.0.1", svc.http, timeout=60)

    def count(self, sql):
        self.conn.request("POST", "/sql", body=sql.encode(),
                          headers={"Content-Type": "text/plain", "Accept": "application/json"})
        r = self.conn.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"POST /sql: {r.status} {body[:200]!r}")
        return json.loads(body)[0]["n"]

    def close(self):
        self.conn.close()


def table_of(topic):
    return '"' + topic.rsplit("/", 1)[1] + '"'


def probe_once(producer, poller, table, key, timeout):
    """One probe: send, poll back to back until the count is 1. Returns the probe's record."""
    sql = f"SELECT count(*) AS n FROM {table} WHERE key = '{key}'"
    acked = threading.Event()
    ack = {}

    def on_ack(res, msg_id):
        ack["t"] = time.perf_counter()
        ack["res"] = str(res)
        ack["id"] = str(msg_id)
        ack["ledger"], ack["entry"] = msg_id.ledger_id(), msg_id.entry_id()
        acked.set()

    polls = []  # (start, end, count)
    t_send = time.perf_counter()
    producer.send_async(key.encode(), on_ack, partition_key=key)
    deadline = t_send + timeout
    while True:
        s = time.perf_counter()
        n = poller.count(sql)
        e = time.perf_counter()
        polls.append((s, e, n))
        if n >= 1 or e > deadline:
            break
    acked.wait(timeout=max(1.0, deadline - time.perf_counter()))
    seen = polls[-1][2] >= 1
    rec = {
        "key": key,
        "surface": poller.name,
        "visible": seen,
        "count": polls[-1][2],
        "polls": len(polls),
        "poll_rtt_s": [round(e - s, 6) for s, e, _ in polls],
        "t_send": t_send,
    }
    if seen:
        rec["send_to_answer_s"] = polls[-1][1] - t_send
        rec["send_to_answering_poll_start_s"] = polls[-1][0] - t_send
        # The last poll that did not see it started here: visibility came after this.
        rec["send_to_last_miss_s"] = (polls[-2][0] - t_send) if len(polls) > 1 else None
    if "t" in ack:
        rec["send_to_ack_s"] = ack["t"] - t_send
        rec["ack_result"] = ack["res"]
        rec["message_id"] = ack["id"]
        rec["ledger_id"], rec["entry_id"] = ack["ledger"], ack["entry"]
        if seen:
            rec["ack_to_answer_s"] = polls[-1][1] - ack["t"]
    return rec


def run_probes(producer, pollers, table, prefix, window_s, interval, timeout, stop_at=None):
    """Probes every `interval` s for `window_s` s (or until `stop_at`). Returns the records."""
    records = []
    start = time.perf_counter()
    end = start + window_s
    if stop_at is not None:
        end = min(end, stop_at)
    i = 0
    while True:
        slot = start + i * interval
        now = time.perf_counter()
        if slot < now:
            slot = now
        if slot >= end:
            break
        time.sleep(max(0.0, slot - now))
        rec = probe_once(producer, pollers[i % len(pollers)], table, f"{prefix}-{i}", timeout)
        rec["t_s"] = round(rec.pop("t_send") - start, 4)  # send time within the window
        records.append(rec)
        if len(records) % 50 == 0:
            vis = [r["send_to_answer_s"] for r in records if r["visible"]]
            log(f"  {len(records)} probes, send→answer p50 {pct(vis, 50) * 1e3:.1f} ms")
        i += 1
    return records, time.perf_counter() - start


def pct(xs, p):
    """Nearest-rank percentile."""
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[max(0, math.ceil(p / 100 * len(xs)) - 1)]


def dist_ms(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"n": len(xs), "p50_ms": round(pct(xs, 50) * 1e3, 2), "p90_ms": round(pct(xs, 90) * 1e3, 2),
            "p99_ms": round(pct(xs, 99) * 1e3, 2), "max_ms": round(max(xs) * 1e3, 2),
            "min_ms": round(min(xs) * 1e3, 2), "mean_ms": round(statistics.fmean(xs) * 1e3, 2)}


def by_time(rs, bucket_s):
    """Per `bucket_s` of the window: how freshness and query time move as the live tail grows
    (entries of the open ledger, from the probes' message ids) and shrinks (a ledger sealed
    and offloaded: the ledger id changes)."""
    out = []
    if not rs:
        return out
    for b in range(int(max(r["t_s"] for r in rs) // bucket_s) + 1):
        part = [r for r in rs if b * bucket_s <= r["t_s"] < (b + 1) * bucket_s]
        if not part:
            continue
        vis = [r["send_to_answer_s"] for r in part if r["visible"]]
        rtt = [x for r in part for x in r["poll_rtt_s"]]
        out.append({
            "from_s": b * bucket_s, "probes": len(part),
            "send_to_answer_p50_ms": round(pct(vis, 50) * 1e3, 1) if vis else None,
            "send_to_answer_max_ms": round(max(vis) * 1e3, 1) if vis else None,
            "poll_rtt_p50_ms": round(pct(rtt, 50) * 1e3, 1),
            "ledgers": sorted({r["ledger_id"] for r in part if "ledger_id" in r}),
            "max_entry_id": max((r["entry_id"] for r in part if "entry_id" in r), default=None),
        })
    return out


def summarize(records, bucket_s=10):
    out = {}
    for surface in sorted({r["surface"] for r in records}):
        rs = [r for r in records if r["surface"] == surface]
        vis = [r for r in rs if r["visible"]]
        rtts = [x for r in rs for x in r["poll_rtt_s"]]
        out[surface] = {
            "probes": len(rs),
            "not_visible_within_timeout": len(rs) - len(vis),
            "send_to_answer": dist_ms([r["send_to_answer_s"] for r in vis]),
            "ack_to_answer": dist_ms([r.get("ack_to_answer_s") for r in vis]),
            "send_to_answering_poll_start": dist_ms([r["send_to_answering_poll_start_s"]
                                                     for r in vis]),
            "send_to_last_miss": dist_ms([r["send_to_last_miss_s"] for r in vis]),
            "send_to_ack": dist_ms([r.get("send_to_ack_s") for r in rs]),
            "visible_before_ack": sum(1 for r in vis if r.get("ack_to_answer_s", 1) < 0),
            "poll_rtt_all": dist_ms(rtts),
            "poll_rtt_answering": dist_ms([r["poll_rtt_s"][-1] for r in vis]),
            "polls_per_probe": {"p50": pct([r["polls"] for r in rs], 50),
                                "p99": pct([r["polls"] for r in rs], 99),
                                "max": max((r["polls"] for r in rs), default=0)},
            "seen_by_first_poll": sum(1 for r in vis if r["polls"] == 1),
            "wrong_counts": sum(1 for r in rs if r["count"] > 1),
            "by_10s": by_time(rs, bucket_s),
        }
    return out


def phase(args, svc, client, pollers_for, name, topic, load=None):
    table = table_of(topic)
    producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True,
                                      send_timeout_millis=30000)
    pollers = pollers_for()
    result = {"phase": name, "topic": topic}
    try:
        if load is not None:
            load.start()
            log(f"[{name}] load: {' '.join(load.args[1:])}")
            time.sleep(args.warmup)
            if not load.alive():
                raise RuntimeError("perf produce exited early: " + "\n".join(load.stderr_tail))
        window_s = args.seconds if load is not None else args.idle_seconds
        # Probing stops before the load does, whatever the probes' pace.
        stop_at = load.started + load_seconds(args) - 3 if load is not None else None
        log(f"[{name}] probing for {window_s} s every {args.interval} s on "
            f"{','.join(p.name for p in pollers)}")
        cpu = CpuWindow(dict({"service": svc.proc.pid},
                             **({"perf_produce": load.proc.pid} if load else {})))
        # The CPU window covers the counted probes only (warm-up probes come first).
        for i in range(args.warmup_probes):
            probe_once(producer, pollers[i % len(pollers)], table, f"probe-warm-{i}", args.timeout)
        cpu.start()
        t_first = time.perf_counter()
        records, took = run_probes(producer, pollers, table, "probe", window_s, args.interval,
                                   args.timeout, stop_at)
        t_last = time.perf_counter()
        result["cpu"] = cpu.stop()
        result["window_s"] = round(took, 2)
        result["probes"] = len(records)
        result["surfaces"] = summarize(records)
        if load is not None:
            in_window = load.rate_between(t_first, t_last)
            if load.alive():
                log(f"[{name}] waiting for perf produce to finish its run")
            perf_summary = load.wait(timeout=args.seconds + args.warmup + 180)
            result["load"] = {
                "offered_msgs_per_s": args.rate,
                "size_b": args.size,
                "batch_max_messages": args.batch_max_messages or "perf default (1000)",
                "perf_summary": perf_summary,
                "progress_in_window_msgs_per_s": in_window,
                "achieved_in_window_msgs_per_s": round(statistics.fmean(in_window), 1)
                if in_window else None,
                "min_2s_in_window_msgs_per_s": min(in_window) if in_window else None,
                "probe_window_inside_load": t_last <= load.started + load_seconds(args),
            }
        if args.raw:
            result["records"] = records
        return result
    finally:
        if load is not None:
            load.kill()
        for p in pollers:
            p.close()
        producer.close()


def load_seconds(args):
    # Warm-up, warm-up probes, the window, and slack so probing never outlives the load.
    return int(math.ceil(args.warmup + args.warmup_probes * 2 + args.seconds + 5))


def markdown(doc):
    lines = ["| load | surface | probes | send → visible p50 / p90 / p99 / max | "
             "ack → visible p50 / p99 | poll query RTT p50 / p99 | seen by 1st poll "
             "| produce achieved (publish p50 / p99) | CPU: service / machine busy |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key in ("idle", "loaded"):
        ph = doc.get(key)
        if not ph:
            continue
        if key == "loaded":
            ld = ph["load"]
            ps = ld["perf_summary"]
            label = f"{ld['offered_msgs_per_s']:,} msg/s"
            window = ld["achieved_in_window_msgs_per_s"]
            achieved = (f"{window:,.0f} msg/s in window" if window is not None else "n/a in window")
            achieved += (f", {ps['msgs_per_s']:,.0f} whole run ({ps['latency']['p50_us'] / 1e3:.1f} / "
                         f"{ps['latency']['p99_us'] / 1e3:.1f} ms)")
        else:
            label, achieved = "none", "—"
        cpu = ph["cpu"]
        cpu_text = (f"{cpu.get('service_cores', float('nan')):.2f} cores / "
                    f"{cpu['machine_busy_fraction'] * 100:.0f} % of {cpu['machine_cores']}")
        if cpu.get("other_processes_total_cores", 0) >= 0.1:
            cpu_text += f" (others: {cpu['other_processes_total_cores']:.2f} cores)"
        for surface, s in ph["surfaces"].items():
            a, k, rt = s["send_to_answer"], s["ack_to_answer"], s["poll_rtt_all"]
            miss = f" ({s['not_visible_within_timeout']} never seen)" if s["not_visible_within_timeout"] else ""
            if a is None:
                lines.append(f"| {label} | {surface} | {s['probes']}{miss} | | | | | {achieved} | {cpu_text} |")
                continue
            first = 100 * s["seen_by_first_poll"] / max(1, a["n"])
            lines.append(
                f"| {label} | {surface} | {s['probes']}{miss} | "
                f"{a['p50_ms']:.1f} / {a['p90_ms']:.1f} / {a['p99_ms']:.1f} / {a['max_ms']:.1f} ms | "
                f"{k['p50_ms']:.1f} / {k['p99_ms']:.1f} ms | "
                f"{rt['p50_ms']:.1f} / {rt['p99_ms']:.1f} ms | {first:.0f} % | "
                f"{achieved} | {cpu_text} |")
    builds = sorted(set(doc.get("build_running_at_start", []) + doc.get("build_running_at_end", [])))
    if builds:
        lines.append("")
        lines.append(f"Note: a build ({', '.join(builds)}) was running at the start or the end of "
                     "this run; the figures are skewed by it (see `other_processes_cores`).")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="release build of ledgerlake")
    ap.add_argument("--rate", type=int, default=20000, help="background load, msg/s")
    ap.add_argument("--size", type=int, default=100, help="background message size, bytes")
    ap.add_argument("--batch-max-messages", type=int, default=None,
                    help="passed to perf produce (default: perf's own, 1000)")
    ap.add_argument("--seconds", type=float, default=60, help="probe window under load")
    ap.add_argument("--idle-seconds", type=float, default=30,
                    help="probe window without load (0 = skip the idle phase)")
    ap.add_argument("--no-load", action="store_true", help="skip the loaded phase")
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between probe starts")
    ap.add_argument("--warmup", type=float, default=5, help="seconds of load before probing")
    ap.add_argument("--warmup-probes", type=int, default=3, help="uncounted probes per phase")
    ap.add_argument("--timeout", type=float, default=30, help="give up on a probe after this")
    ap.add_argument("--surfaces", default="pg", help="pg, http or pg,http (probes alternate)")
    ap.add_argument("--raw", action="store_true", help="include every probe in the JSON")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the data dir (and serve.log)")
    args = ap.parse_args()
    surfaces = [s.strip() for s in args.surfaces.split(",") if s.strip()]
    assert surfaces and all(s in ("pg", "http") for s in surfaces), args.surfaces

    # SIGTERM runs the clean-up below, as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    builds_before = build_running()
    if builds_before:
        log(f"WARNING: a build is running ({', '.join(builds_before)}): figures will be skewed")
    svc = Service(args.bin)
    client = None
    doc = {"bench": "sql_freshness", "binary": os.path.abspath(args.bin),
           "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine_cores": os.cpu_count(), "build_running_at_start": builds_before,
           "config": "defaults (sync = always, lake on, offload threshold 0)",
           "args": vars(args)}
    try:
        svc.start()
        log(f"service pid {svc.proc.pid}: pulsar {svc.pulsar}, http {svc.http}, pg {svc.pg}")
        client = pulsar.Client(f"pulsar://127.0.0.1:{svc.pulsar}", operation_timeout_seconds=30,
                               logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))

        def pollers_for():
            return [PgPoller(svc) if s == "pg" else HttpPoller(svc) for s in surfaces]

        if args.idle_seconds > 0:
            doc["idle"] = phase(args, svc, client, pollers_for, "idle",
                                "persistent://public/default/freshness-idle")
        if not args.no_load:
            topic = "persistent://public/default/freshness"
            load = Load(args.bin, svc, topic, args.rate, load_seconds(args), args.size,
                        args.batch_max_messages)
            doc["loaded"] = phase(args, svc, client, pollers_for, "loaded", topic, load)
        doc["build_running_at_end"] = build_running()
    finally:
        if client is not None:
            client.close()
        svc.stop(keep=args.keep)
    text = json.dumps(doc, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    print()
    print(markdown(doc))


if __name__ == "__main__":
    main()
