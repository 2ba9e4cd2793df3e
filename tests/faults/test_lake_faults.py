"""Lake faults (issue 20): S3 failing in every way through a fault-injecting proxy, and the
PostgreSQL catalog going down or restarting in the middle of a commit.

S3 (`test_s3_fault`, one test per kind): the service's warehouse is the local S3 server
(SeaweedFS) seen through `faultproxy.FaultProxy`; the catalog is SQLite. Ledgers seal every
50 entries and offload runs by itself (checked every 100 ms), orphan files are swept every
second. Each test
1. produces 100 messages and offloads them with S3 healthy (the table exists);
2. turns the fault on and starts a producer sending 40 messages a second:
   - until an offload pass has failed (its status shows the error): `refuse` (connections
     refused: the listener is closed), `reset` (connections reset), `http503` (every request
     answered 503 SlowDown), `truncate` (every response cut after half its body),
     `truncate_upload` (every PUT/POST body cut in half on its way to S3; reads pass),
     `truncate_data_put` (data-file PUTs reach S3 whole but their response is cut: the object
     exists, the service does not know it);
   - for a fixed time: `trickle` (every response sent 4 bytes every 250 ms) for 15 s, `stall`
     (every request held without an answer) for 30 s, a real 30 s stall;
   while the fault is on, every send is acknowledged (never 5 s without an acknowledgement),
   nothing is committed (the table's current snapshot, read by PyIceberg straight from S3 and
   the catalog, is the one of when the fault began) and failed passes are retried with
   backoff, not in a loop;
3. heals S3, stops the producer (every send acknowledged), requests offloads until everything
   is offloaded, then checks: `ledgerlake verify --deep` is clean; the table holds every
   acknowledged message exactly once with its payload; each ledger is in exactly one snapshot's
   ranges; every data file the table references is whole (size as recorded, every row reads);
   after the orphan sweep no unreferenced file is left in the table's data folder; the service
   stops cleanly.

PostgreSQL (`test_catalog_down_mid_commit`): the catalog is a real PostgreSQL, S3 is direct, and
`lake.before_catalog_commit=sleep(3000)` pauses every commit right before the catalog call. A
manual offload is requested; once the service logs the pause, PostgreSQL is stopped with the
producer running (`down`: fast shutdown, kept down 5 s; `restart`: immediate shutdown, as a
crash, and started again at once; `down_past_timeout`, soak only: kept down 40 s, past the
catalog pool's 30 s acquire timeout, so the commit fails), then started again on the same port
and data. The offload must finish with each range committed exactly once: verify, rows,
snapshot ranges, whole files and orphans as above. `test_catalog_killed_within_commit` kills
PostgreSQL (immediate shutdown) at a sweep of instants just after the pause ends (0 to 60 ms),
so that kills land inside the commit's own catalog calls, and restarts it at once; one ledger
per round (`rounds(6, 30)`), each range committed exactly once at the end.

Each test prints one `FAULT-FIGURES` line (JSON): the proxy's counts of connections, requests
and faults injected (and how long clients waited on stalled or trickled answers before giving
up), failed passes, S3 client retries, commit-failure metric, orphans removed, the status
errors seen, producer figures (acknowledgements, longest gap, slowest acknowledgement) and the
catch-up time after the heal. `LL_FAULT_LOG_DIR=dir` keeps each service log there.
"""
import datetime
import json
import os
import re
import shutil
import signal
import threading
import time
import uuid

import pulsar
import pyarrow.parquet as pq
import pytest
from pyarrow.fs import FileSelector, FileType
from pyiceberg.catalog.sql import SqlCatalog

from conftest import eventually, metric, rounds, soak, verify_clean
from faultproxy import FaultProxy
from lake import http, lake_rows, offload_and_wait, stats, topic_path
from servers import S3_PORT

ENV = {
    "LEDGERLAKE_LAKE__CHECK_INTERVAL": "100ms",
    "LEDGERLAKE_LAKE__ORPHAN_FILE_AGE": "0s",
    "LEDGERLAKE_LAKE__ORPHAN_CHECK_INTERVAL": "1s",
}
ROLLOVER = {"LEDGERLAKE_LEDGER__ROLLOVER_ENTRIES": "50"}
RATE = 40            # messages per second during the fault
MAX_ACK_GAP = 5.0    # seconds without any acknowledgement while a fault is on
MAX_ACK_LATENCY = 10.0


# --- helpers --------------------------------------------------------------------------------

def figures(name, **values):
    print(f"\nFAULT-FIGURES {name} {json.dumps(values, sort_keys=True, default=str)}")


def new_client(svc):
    return pulsar.Client(svc.url, operation_timeout_seconds=30,
                         logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))


def offload_status(svc, topic):
    status, body = http("GET", f"{svc.http}/admin/v2/{topic_path(topic)}/offload")
    assert status == 200, body
    return body


def request_offload(svc, topic):
    status, body = http("PUT", f"{svc.http}/admin/v2/{topic_path(topic)}/offload")
    assert status == 200, body
    return body["request"]


FAILURES = "ledgerlake_lake_commit_failures_total"


def offload_everything(svc, topic, timeout=180):
    """Requests offloads until a pass succeeds with nothing left; returns its status and the
    errors of the passes that failed meanwhile."""
    deadline = time.monotonic() + timeout
    errors = []
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"offload did not catch up in {timeout}s: {offload_status(svc, topic)}"
        s = offload_and_wait(svc, topic, timeout=left)
        if s["status"] == "SUCCESS" and s["firstUnoffloadedMessage"] is None:
            return s, errors
        if s["status"] == "ERROR":
            errors.append(s["lastError"])
        time.sleep(0.2)


def wait_log(svc, needle, count, timeout=60):
    """Waits until `needle` occurs at least `count` times in the service log."""
    def check():
        n = open(svc.log_path, errors="replace").read().count(needle)
        assert n >= count, (needle, n, count)
    eventually(check, timeout, interval=0.02)


def log_count(svc, needle):
    return open(svc.log_path, errors="replace").read().count(needle)


def orphans_removed(svc):
    text = open(svc.log_path, errors="replace").read()
    return sum(int(n) for n in re.findall(r"orphan files removed.* deleted=(\d+)", text))


def log_lines(svc, pattern, limit=8):
    rx = re.compile(pattern)
    lines = [l for l in open(svc.log_path, errors="replace").read().splitlines() if rx.search(l)]
    return lines[:limit]


class Load:
    """A producer thread sending unique payloads `{tag}-{n}` at `rate` per second; each send's
    times, result and message id are recorded."""

    def __init__(self, client, topic, tag, rate=RATE):
        self.producer = client.create_producer(topic, batching_enabled=False,
                                               block_if_queue_full=True,
                                               send_timeout_millis=30000)
        self.tag = tag
        self.rate = rate
        self.records = []  # [payload, sent, acked, result, id]
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"load-{tag}", daemon=True)

    def start(self):
        self.thread.start()
        return self

    def _run(self):
        began = time.monotonic()
        n = 0
        while not self.stop_event.is_set():
            rec = [f"{self.tag}-{n}".encode(), time.monotonic(), None, None, None]
            self.records.append(rec)

            def done(res, mid, rec=rec):
                if res == pulsar.Result.Ok:
                    rec[4] = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
                rec[3] = res
                rec[2] = time.monotonic()
            self.producer.send_async(rec[0], done)
            n += 1
            self.stop_event.wait(max(0.0, began + n / self.rate - time.monotonic()))

    def served(self, t0, t1):
        """Acknowledgements in [t0, t1]: count, longest gap without one (window ends
        included), slowest acknowledgement of a send made in the window, sends failed."""
        acks = sorted(r[2] for r in list(self.records)
                      if r[2] is not None and t0 <= r[2] <= t1 and r[3] == pulsar.Result.Ok)
        points = [t0] + acks + [t1]
        gap = max(b - a for a, b in zip(points, points[1:]))
        now = time.monotonic()
        lat = [(r[2] or now) - r[1] for r in list(self.records) if t0 <= r[1] <= t1]
        failed = [r[3] for r in list(self.records)
                  if r[3] is not None and r[3] != pulsar.Result.Ok]
        return {"acks": len(acks), "max_gap_s": round(gap, 2),
                "max_latency_s": round(max(lat, default=0.0), 2), "failed": len(failed)}

    def finish(self, timeout=60):
        """Stops sending; asserts every send was acknowledged; returns id → payload."""
        self.stop_event.set()
        self.thread.join(timeout=10)
        self.producer.flush()

        def answered():
            missing = sum(1 for r in self.records if r[3] is None)
            assert missing == 0, f"{missing} of {len(self.records)} sends not answered"
        eventually(answered, timeout)
        failed = [(r[0], r[3]) for r in self.records if r[3] != pulsar.Result.Ok]
        assert not failed, f"{len(failed)} of {len(self.records)} sends failed: {failed[:5]}"
        self.producer.close()
        out = {r[4]: r[0] for r in self.records}
        assert len(out) == len(self.records), "two sends got the same message id"
        return out


def produce_batch(client, topic, tag, n):
    """`n` unbatched synchronous sends; id → payload."""
    producer = client.create_producer(topic, batching_enabled=False)
    out = {}
    for i in range(n):
        payload = f"{tag}-{i}".encode()
        mid = producer.send(payload)
        out[(mid.ledger_id(), mid.entry_id(), mid.batch_index())] = payload
    producer.close()
    return out


def load_table(catalog_uri, warehouse, props, lake):
    catalog = SqlCatalog(lake["catalog"], uri=catalog_uri, warehouse=warehouse, **props)
    return catalog.load_table(tuple(lake["namespace"]) + (lake["tableName"],))


def ancestors(table):
    out = []
    snap = table.current_snapshot()
    while snap is not None:
        out.append(snap)
        snap = (table.snapshot_by_id(snap.parent_snapshot_id)
                if snap.parent_snapshot_id is not None else None)
    return out


def check_lake(svc, fs, table, expected):
    """The table holds `expected` (id → payload) exactly once, each ledger in one snapshot's
    ranges, every data file whole, and (after the orphan sweep) nothing unreferenced."""
    rows, _ = lake_rows(table)  # asserts no duplicate id
    missing = expected.keys() - rows.keys()
    extra = rows.keys() - expected.keys()
    assert not missing and not extra, (f"missing {len(missing)}: {sorted(missing)[:5]}; "
                                       f"unexpected {len(extra)}: {sorted(extra)[:5]}")
    wrong = [k for k, p in expected.items() if rows[k]["payload"] != p]
    assert not wrong, f"{len(wrong)} payloads differ, first {wrong[:3]}"

    seen = {}
    for snap in ancestors(table):
        ranges = snap.summary.additional_properties.get("ledgerlake.ranges", "")
        for r in filter(None, ranges.split(",")):
            partition, ledger, _ = r.split(":")
            seen.setdefault((int(partition), int(ledger)), []).append(snap.snapshot_id)
    twice = {k: v for k, v in seen.items() if len(v) > 1}
    assert not twice, f"ledgers committed more than once: {twice}"
    ledgers = {k[0] for k in expected}
    assert ledgers <= {l for _, l in seen}, ledgers - {l for _, l in seen}

    files = table.inspect.files().to_pylist()
    assert files
    for f in files:
        path = f["file_path"].split("://", 1)[1]
        info = fs.get_file_info(path)
        assert info.type == FileType.File and info.size == f["file_size_in_bytes"], (f, info)
        with fs.open_input_file(path) as src:
            got = pq.read_table(src).num_rows
        assert got == f["record_count"], (path, got, f["record_count"])
    assert sum(f["record_count"] for f in files) == len(expected)

    referenced = {f["file_path"].split("://", 1)[1] for f in files}
    data_dir = table.metadata.location.split("://", 1)[1] + "/data"

    def no_orphans():
        listed = {i.path for i in fs.get_file_info(FileSelector(data_dir, recursive=True))
                  if i.type == FileType.File}
        assert referenced <= listed, referenced - listed
        assert listed == referenced, f"unreferenced files left: {sorted(listed - referenced)}"
        return len(listed)
    return eventually(no_orphans, timeout=60, interval=0.5)


def keep_log(svc, name):
    """Copies the service log to $LL_FAULT_LOG_DIR (when set), for inspection."""
    d = os.environ.get("LL_FAULT_LOG_DIR")
    if d and os.path.exists(svc.log_path):
        os.makedirs(d, exist_ok=True)
        shutil.copy(svc.log_path, os.path.join(d, f"{name}.log"))


def assert_service_healthy(svc):
    text = open(svc.log_path, errors="replace").read()
    assert "panicked" not in text, log_lines(svc, "panicked")


# --- S3 faults ------------------------------------------------------------------------------

# kind → (proxy mode, proxy parameters, fault window in seconds; None: until a pass failed)
S3_FAULTS = {
    "refuse": ("refuse", {}, None),
    "reset": ("reset", {}, None),
    "http503": ("http503", {}, None),
    # Reads resume where a cut response ended, so a pass fails only after every retry (about
    # 40 s): the test command watches 15 s of it, the soak until a pass failed.
    "truncate": ("truncate", {}, None if soak() else 15),
    "truncate_upload": ("truncate", {"methods": ("PUT", "POST")}, None),
    "truncate_data_put": ("truncate", {"methods": ("PUT",), "paths": r"/data/",
                                       "truncate_side": "response"}, None),
    "trickle": ("trickle", {"trickle_bytes": 4, "trickle_interval": 0.25}, 15),
    "stall": ("stall", {"stall_seconds": 30}, 30),
}


@pytest.fixture
def proxy():
    p = FaultProxy(S3_PORT).start()
    try:
        yield p
    finally:
        p.stop()


@pytest.mark.parametrize("kind", list(S3_FAULTS))
def test_s3_fault(kind, make_service, s3_server, proxy):
    mode, params, window = S3_FAULTS[kind]
    prefix = f"fault-{kind}-{uuid.uuid4().hex[:6]}"
    env = dict(ENV, **ROLLOVER, **s3_server.service_env(prefix))
    env["LEDGERLAKE_LAKE__S3__ENDPOINT"] = proxy.endpoint
    svc = make_service(env)
    svc.start()
    client = new_client(svc)
    load = None
    try:
        topic = f"persistent://public/default/s3{kind}-{uuid.uuid4().hex[:6]}"
        expected = produce_batch(client, topic, "base", 100)
        s = offload_and_wait(svc, topic)
        assert s["status"] == "SUCCESS" and s["firstUnoffloadedMessage"] is None, s
        lake = stats(svc, topic)["lake"]
        catalog_uri = f"sqlite:///{svc.data_dir}/data/catalog.db"
        props = s3_server.pyiceberg_props()
        warehouse = f"s3://warehouse/{prefix}"
        assert load_table(catalog_uri, warehouse, props, lake).current_snapshot() is not None
        failures0 = metric(svc, FAILURES)
        failed_passes0 = log_count(svc, "offload pass failed")
        retries0 = log_count(svc, "will retry")
        proxy_before = proxy.stats()

        t_on = time.monotonic()
        proxy.set_mode(mode, **params)
        # A pass done with S3 when the fault began may still commit (the catalog is local):
        # the reference snapshot is taken once it had time to.
        time.sleep(0.5)
        base_snapshot = load_table(catalog_uri, warehouse, props, lake).current_snapshot()
        t_load = time.monotonic()
        load = Load(client, topic, "load").start()
        errors = []

        def watch():
            # The state is ERROR only between a failed pass and the next (RUNNING) one; the
            # last error stays until a pass succeeds.
            st = offload_status(svc, topic)
            if st["lastError"] and st["lastError"] not in errors:
                errors.append(st["lastError"])
            return st
        if window is None:
            # Until a pass failed: its status says why, and the commit-failure metric counts it.
            def failed():
                watch()
                assert errors, "no pass failed yet"
            eventually(failed, timeout=120, interval=0.2)
        else:
            while time.monotonic() < t_on + window:
                watch()
                time.sleep(0.2)
        st = watch()
        t_off = time.monotonic()
        # Nothing was committed while S3 failed.
        during = load_table(catalog_uri, warehouse, props, lake).current_snapshot()
        assert during.snapshot_id == base_snapshot.snapshot_id, \
            f"a commit landed while S3 was failing: {during}"
        assert st["lastSnapshotId"] == base_snapshot.snapshot_id, st
        served = load.served(t_load, t_off)
        failures_during = metric(svc, FAILURES) - failures0
        failed_passes = log_count(svc, "offload pass failed") - failed_passes0
        retries = log_count(svc, "will retry") - retries0
        counts = proxy.stats()

        proxy.set_mode("pass")
        t_heal = time.monotonic()
        time.sleep(2)
        expected.update(load.finish())
        load = None
        final, later_errors = offload_everything(svc, topic)
        catch_up = time.monotonic() - t_heal
        fault_counts = {k: v if not isinstance(v, int) else v - proxy_before.get(k, 0)
                        for k, v in counts.items()}
        figures(f"s3-{kind}", window_s=round(t_off - t_on, 1), proxy=fault_counts,
                commit_failures=failures_during, failed_passes=failed_passes,
                client_retries=retries, orphans_removed=orphans_removed(svc),
                status_errors=[e[:300] for e in errors[:3]],
                errors_after_heal=[e[:300] for e in later_errors[:3]], producer=served,
                catch_up_s=round(catch_up, 1), messages=len(expected))

        # The fault was injected and the producers were served all along.
        injected = {"refuse": counts.get("mode_refuse", 0), "reset": counts.get("reset", 0),
                    "http503": counts.get("http503", 0),
                    "truncate": counts.get("truncated_responses", 0),
                    "truncate_upload": counts.get("truncated_uploads", 0),
                    "truncate_data_put": counts.get("truncated_responses", 0),
                    "trickle": counts.get("trickled", 0),
                    "stall": counts.get("stalled", 0)}[kind]
        assert injected > 0, counts
        assert served["failed"] == 0 and served["acks"] > 0, served
        assert served["max_gap_s"] < MAX_ACK_GAP, served
        assert served["max_latency_s"] < MAX_ACK_LATENCY, served
        if window is None:
            assert errors
            # Every failed pass counts, also one that could not load the table.
            assert failures_during >= 1, failures_during
        # Retried with backoff, not in a loop: the S3 client waits 1, 2, 4 s between attempts
        # (a pass retried every check, 100 ms, would fail ten times a second).
        assert failed_passes <= 1 + (t_off - t_on) / 2, (failed_passes, t_off - t_on)
        if kind in ("stall", "trickle"):
            # The client gave up on held answers (a timeout) and asked again: it did not wait
            # for the whole stall; offload finished after the heal (checked above).
            assert counts.get(f"{kind}_abandoned", 0) >= 1, counts
            assert counts.get("requests", 0) - proxy_before.get("requests", 0) >= 2, counts

        assert final["status"] == "SUCCESS", final
        verify_clean(svc, topic)
        table = load_table(catalog_uri, warehouse, props, lake)
        assert len(ancestors(table)) > 1
        check_lake(svc, s3_server.filesystem(), table, expected)
        assert_service_healthy(svc)
        client.close()
        assert svc.stop() == 0, "the service did not stop cleanly"
    finally:
        keep_log(svc, f"s3-{kind}")
        proxy.set_mode("pass")
        stop_load_and_client(load, client)


def stop_load_and_client(load, client):
    """The end of a test, also a failed one: the load thread stopped, the client closed."""
    if load is not None:
        load.stop_event.set()
        load.thread.join(timeout=10)
    try:
        client.close()
    except Exception:  # already closed
        pass


def check_pg_lake_and_stop(svc, client, topic, s3_server, uri, prefix, expected):
    """The end of a catalog test: verify, the table holds `expected` exactly once, the service
    is healthy and stops cleanly."""
    verify_clean(svc, topic)
    lake = stats(svc, topic)["lake"]
    pg_uri = uri.replace("postgres://", "postgresql+psycopg2://")
    table = load_table(pg_uri, f"s3://warehouse/{prefix}", s3_server.pyiceberg_props(), lake)
    check_lake(svc, s3_server.filesystem(), table, expected)
    assert_service_healthy(svc)
    client.close()
    assert svc.stop() == 0, "the service did not stop cleanly"


# --- PostgreSQL catalog down mid-commit ------------------------------------------------------

# (name, seconds down, signal: SIGINT = fast shutdown, SIGQUIT = immediate, as a crash)
PG_CASES = [
    pytest.param("down", 5.0, signal.SIGINT, id="down"),
    pytest.param("restart", 0.0, signal.SIGQUIT, id="restart"),
    pytest.param("down_past_timeout", 40.0, signal.SIGINT, id="down_past_timeout",
                 marks=pytest.mark.skipif(not soak(), reason="long: LL_SOAK=1")),
]


@pytest.mark.parametrize("how,down_seconds,sig", PG_CASES)
def test_catalog_down_mid_commit(how, down_seconds, sig, make_service, s3_server, postgres):
    uri = postgres.create_database(f"fault_{uuid.uuid4().hex[:8]}")
    prefix = f"pgfault-{uuid.uuid4().hex[:6]}"
    env = dict(ENV, **s3_server.service_env(prefix), LEDGERLAKE_LAKE__CATALOG__URI=uri,
               LL_FAILPOINTS="lake.before_catalog_commit=sleep(3000)")
    svc = make_service(env)
    svc.start()
    client = new_client(svc)
    load = None
    paused = False
    try:
        topic = f"persistent://public/default/pg{how}-{uuid.uuid4().hex[:6]}"
        expected = produce_batch(client, topic, "base", 200)
        pauses = open(svc.log_path, errors="replace").read().count("failpoint: pausing")
        load = Load(client, topic, "load").start()
        ticket = request_offload(svc, topic)
        wait_log(svc, "failpoint: pausing", pauses + 1)
        t_hit = time.monotonic()
        postgres.pause(sig)
        paused = True
        t_down = time.monotonic()
        if down_seconds:
            time.sleep(down_seconds)
        postgres.resume()
        paused = False
        t_up = time.monotonic()
        served = load.served(t_hit, t_up)

        def ticket_done():
            st = offload_status(svc, topic)
            assert st["completedRequest"] >= ticket, st
            return st
        first = eventually(ticket_done, timeout=120, interval=0.1)
        t_first = time.monotonic()
        expected.update(load.finish())
        load = None
        final, errors = offload_everything(svc, topic)
        figures(f"pg-{how}", stop_s=round(t_down - t_hit, 2), down_s=round(t_up - t_down, 2),
                pass_after_restart={"status": first["status"], "lastError": first["lastError"],
                                    "seconds_after_up": round(t_first - t_up, 2)},
                later_errors=errors[:3], producer=served, messages=len(expected),
                warnings=log_lines(svc, r" WARN .*(offload|lake|catalog)", 4))

        assert served["failed"] == 0 and served["acks"] > 0, served
        assert served["max_gap_s"] < MAX_ACK_GAP, served
        assert final["status"] == "SUCCESS", final
        check_pg_lake_and_stop(svc, client, topic, s3_server, uri, prefix, expected)
    finally:
        keep_log(svc, f"pg-{how}")
        if paused:
            postgres.resume()
        stop_load_and_client(load, client)


PAUSE_LINE = re.compile(r"^(\S+)Z\s+WARN .*failpoint: pausing")


def pause_starts(svc):
    """Wall-clock times (epoch seconds) of the service's failpoint pauses, in order."""
    out = []
    for line in open(svc.log_path, errors="replace").read().splitlines():
        m = PAUSE_LINE.match(line)
        if m:
            ts = datetime.datetime.strptime(m.group(1)[:26], "%Y-%m-%dT%H:%M:%S.%f")
            out.append(ts.replace(tzinfo=datetime.timezone.utc).timestamp())
    return out


# Offsets after the end of the pause at which PostgreSQL is killed: the commit's own catalog
# calls (read the table, write its metadata to S3, update the pointer) take a few ms.
KILL_OFFSETS = [0.0, 0.004, 0.008, 0.015, 0.03, 0.06]


def test_catalog_killed_within_commit(make_service, s3_server, postgres):
    """PostgreSQL is killed (immediate shutdown, as a crash) at a sweep of instants right
    after the commit's pause ends, so that some kills land inside the commit's own catalog
    calls, and started again at once; each round offloads a new ledger. Every range must be
    committed exactly once."""
    n_rounds = rounds(6, 30)
    uri = postgres.create_database(f"kill_{uuid.uuid4().hex[:8]}")
    prefix = f"pgkill-{uuid.uuid4().hex[:6]}"
    pause_ms = 1000
    env = dict(ENV, **s3_server.service_env(prefix), LEDGERLAKE_LAKE__CATALOG__URI=uri,
               LL_FAILPOINTS=f"lake.before_catalog_commit=sleep({pause_ms})")
    svc = make_service(env)
    svc.start()
    client = new_client(svc)
    paused = False
    outcomes = []
    try:
        topic = f"persistent://public/default/pgkill-{uuid.uuid4().hex[:6]}"
        expected = {}
        for i in range(n_rounds):
            expected.update(produce_batch(client, topic, f"r{i}", 60))
            seen = len(pause_starts(svc))
            ticket = request_offload(svc, topic)

            def paused_again():
                starts = pause_starts(svc)
                assert len(starts) > seen, "no pause yet"
                return starts[seen]
            began = eventually(paused_again, timeout=60, interval=0.01)
            offset = KILL_OFFSETS[i % len(KILL_OFFSETS)]
            time.sleep(max(0.0, began + pause_ms / 1000 + offset - time.time()))
            late = time.time() - (began + pause_ms / 1000)
            postgres.pause(signal.SIGQUIT)
            paused = True
            postgres.resume()
            paused = False

            def ticket_done():
                st = offload_status(svc, topic)
                assert st["completedRequest"] >= ticket, st
                return st
            st = eventually(ticket_done, timeout=120, interval=0.05)
            outcomes.append({"kill_after_pause_ms": round(late * 1000, 1),
                             "status": st["status"], "lastError": st["lastError"][:160]})
        final, errors = offload_everything(svc, topic)
        figures("pg-kill-within-commit", rounds=n_rounds, outcomes=outcomes,
                failed_commits=sum(1 for o in outcomes if o["lastError"]),
                later_errors=[e[:200] for e in errors[:3]], messages=len(expected),
                orphans_removed=orphans_removed(svc))
        assert final["status"] == "SUCCESS", final
        check_pg_lake_and_stop(svc, client, topic, s3_server, uri, prefix, expected)
    finally:
        keep_log(svc, "pg-kill")
        if paused:
            postgres.resume()
        try:
            client.close()
        except Exception:  # already closed
            pass
