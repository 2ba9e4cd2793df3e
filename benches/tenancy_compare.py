#!/usr/bin/env python3
"""Issue 17 figures: publish- and dispatch-rate accuracy (set vs measured), the cost of authentication +
authorization on produce throughput and p99, and the publish p99 of one tenant with and
without another tenant flat out at its quota. Every figure is measured in the same run by
`ledgerlake perf produce` against services this script starts on 127.0.0.1 (and stops by PID).

    python3 benches/tenancy_compare.py --bin target/release/ledgerlake [--runs 3] [--seconds 10]
        [--only dispatch]
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    def __init__(self, binary, args=()):
        self.binary, self.dir = binary, tempfile.mkdtemp(prefix="ll-bench-")
        self.pulsar, self.http, self.pg = free_port(), free_port(), free_port()
        log = open(os.path.join(self.dir, "serve.log"), "ab")
        self.proc = subprocess.Popen(
            [binary, "serve", "--data-dir", os.path.join(self.dir, "data"),
             "--pulsar-addr", f"127.0.0.1:{self.pulsar}", "--http-addr", f"127.0.0.1:{self.http}",
             "--pg-addr", f"127.0.0.1:{self.pg}", *args],
            stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/health/ready", timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("service did not become ready")

    def admin(self, method, path, body=None, token=None):
        data = json.dumps(body).encode() if body is not None else b""
        req = urllib.request.Request(f"http://127.0.0.1:{self.http}/admin/v2{path}", data=data,
                                     method=method, headers={"Content-Type": "application/json"})
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    def stop(self):
        os.kill(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)


def perf(binary, svc, topic, seconds, rate=None, size=100, token=None):
    args = [binary, "perf", "produce", "--service-url", f"pulsar://127.0.0.1:{svc.pulsar}",
            "--topic", topic, "--size", str(size), "--duration", f"{seconds}s",
            "--batch-max-messages", "1", "--json"]
    if rate:
        args += ["--rate", str(rate)]
    if token:
        args += ["--token", token]
    out = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 120, check=True)
    return json.loads(out.stdout)


def parallel(jobs):
    results = [None] * len(jobs)

    def run(i, job):
        results[i] = job()
    threads = [threading.Thread(target=run, args=(i, j)) for i, j in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def accuracy(binary, seconds):
    svc = Service(binary)
    try:
        rows = []
        ns = "/namespaces/public"
        for name, policy, size in [("500 msg/s", {"publishThrottlingRateInMsg": 500}, 100),
                                   ("5000 msg/s", {"publishThrottlingRateInMsg": 5000}, 100),
                                   ("1 MB/s (1 KiB msgs)", {"publishThrottlingRateInByte": 1_000_000}, 1024)]:
            topic_ns = f"rate{len(rows)}"
            assert svc.admin("PUT", f"{ns}/{topic_ns}") == 204
            assert svc.admin("POST", f"{ns}/{topic_ns}/publishRate", policy) == 204
            r = perf(binary, svc, f"persistent://public/{topic_ns}/t", seconds, size=size)
            if "Byte" in next(iter(policy)):
                # The limit counts each message with its metadata, as Pulsar's does.
                rows.append((name, policy["publishThrottlingRateInByte"],
                             r["mb_per_s"] * 1e6 * 1.0, "payload B/s"))
            else:
                rows.append((name, policy["publishThrottlingRateInMsg"], r["msgs_per_s"], "msg/s"))
        quota = {"publishRateInMsgs": 2000, "publishRateInBytes": -1}
        assert svc.admin("PUT", "/resourcegroups/g", quota) == 204
        assert svc.admin("PUT", "/tenants/team", {"allowedClusters": ["standalone"]}) == 204
        for n in ["n1", "n2"]:
            assert svc.admin("PUT", f"/namespaces/team/{n}") == 204
            assert svc.admin("POST", f"/namespaces/team/{n}/resourcegroup/g") == 204
        both = parallel([lambda n=n: perf(binary, svc, f"persistent://team/{n}/t", seconds)
                         for n in ["n1", "n2"]])
        rows.append(("group 2000 msg/s over 2 namespaces", 2000,
                     sum(r["msgs_per_s"] for r in both), "msg/s"))
        return rows
    finally:
        svc.stop()


def consume(binary, svc, topic, sub, seconds):
    args = [binary, "perf", "consume", "--service-url", f"pulsar://127.0.0.1:{svc.pulsar}",
            "--topic", topic, "--subscription", sub, "--duration", f"{seconds}s", "--json"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 120, check=True)
    return json.loads(out.stdout)


def dispatch_accuracy(binary, seconds):
    """Dispatch rates: a backlog is produced first, then consumed under each limit."""
    svc = Service(binary)
    try:
        rows = []
        ns = "/namespaces/public"
        for name, path, policy, size in [
                ("topic dispatchRate 1000 msg/s", "dispatchRate",
                 {"dispatchThrottlingRateInMsg": 1000}, 100),
                ("subscriptionDispatchRate 500 msg/s", "subscriptionDispatchRate",
                 {"dispatchThrottlingRateInMsg": 500}, 100),
                ("dispatchRate 1 MB/s (1 KiB msgs)", "dispatchRate",
                 {"dispatchThrottlingRateInByte": 1_000_000}, 1024)]:
            topic_ns = f"dispatch{len(rows)}"
            topic = f"persistent://public/{topic_ns}/t"
            assert svc.admin("PUT", f"{ns}/{topic_ns}") == 204
            perf(binary, svc, topic, 3, size=size)
            assert svc.admin("POST", f"{ns}/{topic_ns}/{path}", policy) == 204
            r = consume(binary, svc, topic, "bench", seconds)
            if "dispatchThrottlingRateInByte" in policy:
                # The limit counts each entry with its metadata, as Pulsar's does.
                rows.append((name, policy["dispatchThrottlingRateInByte"],
                             r["msgs_per_s"] * size, "payload B/s"))
            else:
                rows.append((name, policy["dispatchThrottlingRateInMsg"], r["msgs_per_s"], "msg/s"))
        return rows
    finally:
        svc.stop()


def security_cost(binary, seconds, runs, rate):
    key = tempfile.mktemp(prefix="ll-key-")
    subprocess.run([binary, "token", "create-secret-key", "--output", key], check=True,
                   capture_output=True)
    token = subprocess.run([binary, "token", "create", "--secret-key", key, "--subject", "app"],
                           check=True, capture_output=True, text=True).stdout.strip()
    root = subprocess.run([binary, "token", "create", "--secret-key", key, "--subject", "root"],
                          check=True, capture_output=True, text=True).stdout.strip()
    off = Service(binary)
    on = Service(binary, ["--auth-token-secret-key", key, "--superuser-roles", "root"])
    try:
        # The producing role is a plain role with a produce grant: the authorizer's full path.
        assert on.admin("POST", "/namespaces/public/default/permissions/app",
                        ["produce"], token=root) == 204
        out = {"off": [], "on": []}
        for i in range(runs):
            for mode, svc, tok in [("off", off, None), ("on", on, token)]:
                out[mode].append(perf(binary, svc, f"persistent://public/default/sec-{i}",
                                      seconds, rate=rate, token=tok))
        return out
    finally:
        off.stop()
        on.stop()
        os.unlink(key)


def noisy_neighbour(binary, seconds, runs, rate):
    svc = Service(binary)
    try:
        quota = {"publishRateInMsgs": 1000, "publishRateInBytes": -1}
        assert svc.admin("PUT", "/resourcegroups/noisy", quota) == 204
        assert svc.admin("PUT", "/tenants/noisy", {"allowedClusters": ["standalone"]}) == 204
        assert svc.admin("PUT", "/namespaces/noisy/ns") == 204
        assert svc.admin("POST", "/namespaces/noisy/ns/resourcegroup/noisy") == 204
        out = {"alone": [], "neighbour at quota": []}
        for i in range(runs):
            out["alone"].append(perf(binary, svc, f"persistent://public/default/q-{i}",
                                     seconds, rate=rate))
            quiet, noisy = parallel([
                lambda: perf(binary, svc, f"persistent://public/default/qn-{i}", seconds, rate=rate),
                lambda: perf(binary, svc, "persistent://noisy/ns/flood", seconds + 2)])
            out["neighbour at quota"].append(quiet)
            out.setdefault("noisy tenant msg/s", []).append(noisy)
        return out
    finally:
        svc.stop()


def med(results, key):
    return statistics.median(r[key] if key != "p99" else r["latency"]["p99_us"] for r in results)


def accuracy_table(title, rows):
    print(f"\n## {title}")
    print("| limit | set | measured | unit | error |")
    print("|---|---|---|---|---|")
    for name, limit, measured, unit in rows:
        print(f"| {name} | {limit} | {measured:.0f} | {unit} | {100 * (measured - limit) / limit:+.1f} % |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--rate", type=int, default=20000, help="fixed rate of the latency runs")
    ap.add_argument("--only", choices=["dispatch"], help="only the dispatch-rate figures")
    a = ap.parse_args()
    if a.only == "dispatch":
        accuracy_table("dispatch-rate accuracy (one run each, consumed from a backlog)",
                       dispatch_accuracy(a.bin, a.seconds))
        return
    accuracy_table(f"publish-rate accuracy (one run each, {a.seconds} s)",
                   accuracy(a.bin, a.seconds))
    accuracy_table("dispatch-rate accuracy (one run each, consumed from a backlog)",
                   dispatch_accuracy(a.bin, a.seconds))
    print(f"\n## authentication + authorization off vs on ({a.rate} msg/s offered, medians of {a.runs})")
    sec = security_cost(a.bin, a.seconds, a.runs, a.rate)
    print("| | msg/s | p50 µs | p99 µs |")
    print("|---|---|---|---|")
    for mode in ["off", "on"]:
        rs = sec[mode]
        print(f"| {mode} | {med(rs, 'msgs_per_s'):.0f} | "
              f"{statistics.median(r['latency']['p50_us'] for r in rs):.0f} | {med(rs, 'p99'):.0f} |")
    print(f"\n## noisy neighbour: tenant public at {a.rate // 4} msg/s, medians of {a.runs}")
    nn = noisy_neighbour(a.bin, a.seconds, a.runs, a.rate // 4)
    print("| | quiet tenant msg/s | quiet p99 µs | noisy tenant msg/s (quota 1000) |")
    print("|---|---|---|---|")
    for mode in ["alone", "neighbour at quota"]:
        noisy = (f"{statistics.median(r['msgs_per_s'] for r in nn['noisy tenant msg/s']):.0f}"
                 if mode != "alone" else "-")
        print(f"| {mode} | {med(nn[mode], 'msgs_per_s'):.0f} | {med(nn[mode], 'p99'):.0f} | {noisy} |")


if __name__ == "__main__":
    main()
