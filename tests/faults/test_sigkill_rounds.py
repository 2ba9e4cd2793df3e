"""SIGKILL rounds under full load (issue 20): every acknowledged message exactly once.

One service (broker deduplication on, ledgers sealed every 50 entries, offload checked every
100 ms, offloaded ledgers deleted locally at once, orphan files swept every second) carries,
for the whole test and across every kill:

- two producers on a 2-partition topic, one batched and one not, each with a fixed producer
  name (deduplication keys on it) and `send_timeout_millis=0` (the client retries a send until
  the broker answers it). Payloads are unique and say who sent them (`p{producer}-{seq}`),
  keys (`p{producer}-k{n}`) route them to partitions; each send's answer is recorded;
- a consumer on a durable Shared subscription, receiving and acknowledging;
- a thread running `SELECT count(*), count(DISTINCT payload)` over HTTP: failures of queries
  that overlap a kill or a restart are counted, any other failure is an error; every answer
  must show no duplicate and lie between the messages acknowledged before the query and
  those sent after it;
- offload and local deletion, which run by themselves.

Each round waits until both producers and the consumer have made progress since the last
restart, lets the load run a random 0.5–2.5 s (seeded: the seed is printed, `LL_SEED` replays
it), SIGKILLs the service, starts it again on the same ports (the clients reconnect by
themselves) and runs `ledgerlake verify` on the topic. Rounds: `rounds(20, 200)`.

At the end the producers stop and every send must be answered Ok; the subscription must have
received every message; SQL must count each exactly once; a reader per partition, from the
earliest, must see every acknowledged payload exactly once, nothing never sent, each
producer's messages in send order, unique message ids, and each id the send receipt named
(a receipt of `-1:-1` is the broker dropping a retried duplicate); `verify --deep` is clean.
"""
import collections
import json
import logging
import os
import random
import re
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request
import uuid
from http.client import HTTPException

import pulsar

from conftest import eventually, rounds, verify_clean
from lake import http
from test_replay import set_policy

ENV = {
    "LEDGERLAKE_BROKER__DEDUPLICATION": "true",
    "LEDGERLAKE_LAKE__CHECK_INTERVAL": "100ms",
    "LEDGERLAKE_LEDGER__ROLLOVER_ENTRIES": "50",
    "LEDGERLAKE_LAKE__ORPHAN_FILE_AGE": "0s",
    "LEDGERLAKE_LAKE__ORPHAN_CHECK_INTERVAL": "1s",
}
PARTITIONS = 2
RATE = 250          # messages per second per producer
KEYS = 8            # keys per producer
PAYLOAD = re.compile(rb"^p([01])-(\d+)$")


def sql(svc, query, timeout=30):
    """POST /sql (JSON rows); (status, rows or error text). A connection failure is status 0."""
    req = urllib.request.Request(f"{svc.http}/sql", data=query.encode(), method="POST",
                                 headers={"Accept": "application/json",
                                          "Content-Type": "text/plain"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read()[:300]
    except (OSError, ValueError, HTTPException) as e:
        # HTTPException: the answer was cut (the service killed mid-response).
        return 0, repr(e)


class Producer:
    """A producer thread sending `p{pid}-{seq}` at `RATE`, recording each send's answer."""

    def __init__(self, client, topic, pid, batched, stop):
        self.pid = pid
        self.stop = stop
        self.lock = threading.Lock()
        self.results = []        # seq → None (no answer yet) or (result, id tuple)
        self.acked = 0
        self.dropped_dups = 0    # receipts -1:-1: the broker found the retry a duplicate
        self.error = None
        self.producer = client.create_producer(
            topic, producer_name=f"{topic.rsplit('/', 1)[1]}-p{pid}",
            send_timeout_millis=0, block_if_queue_full=True, max_pending_messages=500,
            batching_enabled=batched, batching_max_messages=20,
            batching_max_publish_delay_ms=5)
        self.thread = threading.Thread(target=self._run, name=f"producer-{pid}", daemon=True)

    def key(self, seq):
        return f"p{self.pid}-k{seq % KEYS}"

    def _callback(self, seq):
        def done(res, mid):
            ident = (mid.partition(), mid.ledger_id(), mid.entry_id(), mid.batch_index())
            with self.lock:
                self.results[seq] = (res, ident)
                if res == pulsar.Result.Ok:
                    self.acked += 1
                    if ident[1] == -1 and ident[2] == -1:
                        self.dropped_dups += 1
        return done

    def _run(self):
        start = time.monotonic()
        seq = 0
        try:
            while not self.stop.is_set():
                with self.lock:
                    self.results.append(None)
                self.producer.send_async(f"p{self.pid}-{seq}".encode(), self._callback(seq),
                                         partition_key=self.key(seq))
                seq += 1
                ahead = start + seq / RATE - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
                elif ahead < -1.0:  # after a stall, catch up by one second at most
                    start = time.monotonic() - seq / RATE + 1.0
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = repr(e)

    def sent(self):
        return len(self.results)

    def unanswered(self):
        with self.lock:
            return sum(1 for r in self.results if r is None)


def test_sigkill_rounds_under_full_load(make_service):
    seed = int(os.environ.get("LL_SEED") or time.time_ns() % 1_000_000_007)
    rng = random.Random(seed)
    n_rounds = rounds(20, 200)
    print(f"\nsigkill rounds: seed={seed} rounds={n_rounds} (LL_SEED={seed} replays the timings)")
    began = time.monotonic()

    svc = make_service(ENV)
    name = f"sigkill-{uuid.uuid4().hex[:8]}"
    topic = f"persistent://public/default/{name}"

    # The clients' own logs go to a file beside the service log (evidence on failure).
    client_log = logging.getLogger(f"ll-client-{name}")
    client_log.propagate = False
    client_log.setLevel(logging.INFO)
    handler = logging.FileHandler(os.path.join(svc.data_dir, "client.log"))
    handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(message)s"))
    client_log.addHandler(handler)

    stop_produce = threading.Event()
    stop_rest = threading.Event()
    clients, threads = [], []
    problems = []            # what the SQL thread saw that must not happen
    received = collections.Counter()
    received_lock = threading.Lock()
    sql_errors = collections.Counter()   # status (0: no connection) → failed queries
    sql_error_samples = []
    phase = {"up": True, "epoch": 0}     # whether the service is up; changes counted
    counts = {"sql_ok": 0, "sql_failed": 0, "consumer_errors": 0, "ack_errors": 0}
    producers = []
    kills = 0
    try:
        svc.start()
        set_policy(svc, "offloadDeletionLagMs", 0)
        status, body = http(
            "PUT", f"{svc.http}/admin/v2/persistent/public/default/{name}/partitions",
            str(PARTITIONS))
        assert status == 204, body
        pclient = pulsar.Client(svc.url, operation_timeout_seconds=30, logger=client_log)
        cclient = pulsar.Client(svc.url, operation_timeout_seconds=30, logger=client_log)
        clients += [pclient, cclient]
        producers = [Producer(pclient, topic, 0, True, stop_produce),
                     Producer(pclient, topic, 1, False, stop_produce)]
        consumer = cclient.subscribe(topic, "sigkill-sub", consumer_type=pulsar.ConsumerType.Shared,
                                     initial_position=pulsar.InitialPosition.Earliest,
                                     receiver_queue_size=500)

        def consume():
            while not stop_rest.is_set():
                try:
                    m = consumer.receive(timeout_millis=200)
                except pulsar.Timeout:
                    continue
                except Exception:  # noqa: BLE001 - counted
                    counts["consumer_errors"] += 1
                    time.sleep(0.1)
                    continue
                with received_lock:
                    received[m.data()] += 1
                try:
                    consumer.acknowledge(m)
                except Exception:  # noqa: BLE001 - counted; the message comes again
                    counts["ack_errors"] += 1

        def query():
            q = f'SELECT count(*) AS n, count(DISTINCT payload) AS d FROM "{name}"'
            while not stop_rest.is_set():
                lower = sum(p.acked for p in producers)
                before = dict(phase)
                status, rows = sql(svc, q)
                after = dict(phase)
                upper = sum(p.sent() for p in producers)
                if status != 200:
                    counts["sql_failed"] += 1
                    sql_errors[status] += 1
                    if before["up"] and before == after:
                        # Sent after the service was ready, answered before the next kill.
                        problems.append(f"SQL failed while the service was up: {status} {rows}")
                    if status not in (0, 503) and len(sql_error_samples) < 5:
                        sql_error_samples.append((status, rows))
                else:
                    counts["sql_ok"] += 1
                    n, d = int(rows[0]["n"]), int(rows[0]["d"])
                    if n != d or not lower <= n <= upper:
                        problems.append(f"SQL count={n} distinct={d}, acknowledged before "
                                        f"{lower}, sent after {upper}")
                stop_rest.wait(0.2)

        threads += [p.thread for p in producers]
        threads += [threading.Thread(target=consume, name="consumer", daemon=True),
                    threading.Thread(target=query, name="sql", daemon=True)]
        for t in threads:
            t.start()

        def consumed():
            with received_lock:
                return sum(received.values())

        def wait_progress(timeout=90):
            """Until both producers have new acknowledgements and the consumer new messages."""
            before = [p.acked for p in producers] + [consumed()]

            def moved():
                now = [p.acked for p in producers] + [consumed()]
                assert all(a > b for a, b in zip(now, before)), \
                    f"no progress since the restart: {before} → {now}"
                for p in producers:
                    assert p.error is None, p.error
            eventually(moved, timeout)

        for r in range(n_rounds):
            wait_progress()
            time.sleep(rng.uniform(0.5, 2.5))
            assert svc.proc.poll() is None, f"the service exited by itself: {svc.proc.returncode}"
            phase.update(up=False, epoch=phase["epoch"] + 1)
            svc.stop(signal.SIGKILL)
            kills += 1
            svc.start()
            phase.update(up=True, epoch=phase["epoch"] + 1)
            verify_clean(svc, topic, deep=False)
            assert not problems, problems[:5]
            # The load goes on: a load thread that died would leave the rounds without it.
            dead = [t.name for t in threads if not t.is_alive()]
            assert not dead, f"load threads died: {dead}"
            if r % 5 == 4 or r == n_rounds - 1:
                print(f"round {r + 1}/{n_rounds}: acknowledged "
                      f"{sum(p.acked for p in producers)}, consumed {consumed()}, "
                      f"sql ok {counts['sql_ok']} failed {counts['sql_failed']}, "
                      f"{time.monotonic() - began:.0f}s")
        wait_progress()

        # The load stops; every send is answered, and (send timeout 0) answered Ok.
        stop_produce.set()
        for p in producers:
            p.thread.join(60)
            assert not p.thread.is_alive(), f"producer {p.pid} did not stop"
            assert p.error is None, p.error
            p.producer.flush()

        def answered():
            left = [p.unanswered() for p in producers]
            assert left == [0, 0], f"sends not answered: {left}"
        eventually(answered, 180)
        failed = [(p.pid, seq, r[0]) for p in producers for seq, r in enumerate(p.results)
                  if r[0] != pulsar.Result.Ok]
        assert not failed, f"{len(failed)} sends failed, first: {failed[:10]}"
        expected = {f"p{p.pid}-{seq}".encode(): (p, seq)
                    for p in producers for seq in range(p.sent())}
        total = len(expected)

        # The durable subscription received every message (at least once).
        def all_consumed():
            with received_lock:
                missing = [k for k in expected if k not in received]
                unknown = [k for k in received if k not in expected]
            assert not unknown, f"consumer got payloads never sent: {unknown[:10]}"
            assert not missing, f"{len(missing)} messages never reached the subscription, " \
                                f"e.g. {sorted(missing)[:10]}"
        eventually(all_consumed, 180)
        stop_rest.set()
        for t in threads:
            t.join(60)
            assert not t.is_alive(), f"thread {t.name} did not stop"
        assert not problems, problems[:5]
        redelivered = consumed() - total

        status, rows = sql(svc, f'SELECT count(*) AS n, count(DISTINCT payload) AS d FROM "{name}"',
                           timeout=120)
        assert status == 200, rows
        assert (int(rows[0]["n"]), int(rows[0]["d"])) == (total, total), (rows, total)

        # The history, read from the earliest, one reader per partition.
        seen = {}                          # payload → (partition, ledger, entry, batch index)
        copies = collections.Counter()
        ids = collections.Counter()
        order_errors = []
        for part in range(PARTITIONS):
            reader = pclient.create_reader(f"{topic}-partition-{part}", pulsar.MessageId.earliest,
                                           receiver_queue_size=2000)
            last = {}                      # producer → last seq in this partition
            while reader.has_message_available():
                m = reader.read_next(timeout_millis=60000)
                mid = m.message_id()
                ident = (part, mid.ledger_id(), mid.entry_id(), mid.batch_index())
                payload = m.data()
                ids[ident] += 1
                copies[payload] += 1
                seen[payload] = ident
                match = PAYLOAD.match(payload)
                assert match and payload in expected, f"payload never sent: {payload!r} at {ident}"
                pid, seq = int(match.group(1)), int(match.group(2))
                assert m.partition_key() == producers[pid].key(seq), (payload, m.partition_key())
                if pid in last and seq <= last[pid]:
                    order_errors.append((part, pid, last[pid], seq, ident))
                last[pid] = seq
            reader.close()
        duplicates = {k: c for k, c in copies.items() if c > 1}
        missing = [k for k in expected if k not in copies]
        assert not duplicates, f"{len(duplicates)} payloads more than once: " \
                               f"{sorted(duplicates.items())[:10]}"
        assert not missing, f"{len(missing)} acknowledged messages lost: {sorted(missing)[:10]}"
        assert not order_errors, f"producer order broken (partition, producer, previous seq, " \
                                 f"seq, id): {order_errors[:10]}"
        assert all(c == 1 for c in ids.values()), [i for i, c in ids.items() if c > 1][:10]
        wrong_ids = []
        for payload, (p, seq) in expected.items():
            receipt = p.results[seq][1]
            if receipt[1:3] != (-1, -1) and receipt != seen[payload]:
                wrong_ids.append((payload, receipt, seen[payload]))
        assert not wrong_ids, f"{len(wrong_ids)} receipts name another id than the log " \
                              f"(payload, receipt, read): {wrong_ids[:10]}"

        if sql_error_samples:
            print("SQL errors other than no connection or 503 (starting):", sql_error_samples)
        verify_clean(svc, topic, deep=True)
        log = open(svc.log_path, errors="replace").read()
        assert "panicked" not in log, [l for l in log.splitlines() if "panicked" in l][:5]

        elapsed = time.monotonic() - began
        print(f"SUMMARY sigkill-rounds seed={seed} rounds={kills} acknowledged={total} "
              f"(batched {producers[0].sent()}, unbatched {producers[1].sent()}; "
              f"retries dropped as duplicates {sum(p.dropped_dups for p in producers)}) "
              f"checked={sum(copies.values())} consumed={consumed()} (redelivered {redelivered}, "
              f"receive errors {counts['consumer_errors']}, ack errors {counts['ack_errors']}) "
              f"sql_ok={counts['sql_ok']} sql_failed={counts['sql_failed']} "
              f"(by status {dict(sql_errors)}) elapsed={elapsed:.0f}s")
    except BaseException:
        # Keep the evidence: make_service deletes the data directory at teardown.
        keep = f"/tmp/ll-sigkill-{name}-seed{seed}"
        try:
            svc.stop(signal.SIGKILL)
            shutil.copytree(svc.data_dir, keep, dirs_exist_ok=True)
            with open(os.path.join(keep, "sends.txt"), "w") as f:
                for p in producers:
                    for seq, r in enumerate(p.results):
                        f.write(f"p{p.pid}-{seq} {r}\n")
            print(f"\nfailed after {kills} kills (seed {seed}); evidence kept in {keep}")
        except Exception as e:  # noqa: BLE001 - the original failure matters more
            print(f"could not keep the evidence: {e!r}")
        raise
    finally:
        stop_produce.set()
        stop_rest.set()
        for c in clients:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - closing after a failure
                pass
        for t in threads:
            t.join(30)
        client_log.removeHandler(handler)
        handler.close()
