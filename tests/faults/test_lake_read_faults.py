"""Lake read faults (issue 20): S3 failing while consumers replay from the lake and SQL scans it.

`test_lake_faults.py` faults S3 under offload (writes). Here the readers meet the fault: the
service's warehouse is the local S3 server seen through `faultproxy.FaultProxy`, the catalog is
SQLite. Each test (one per kind)
1. produces 300 messages (unbatched, one ledger per 50 entries), offloads them all and waits
   until every sealed ledger's local copy is deleted (`offloadDeletionLagMs` = 0): from then on
   they can only be read from S3;
2. turns the fault on for 15 s (`refuse`: connections refused; `http503`: every request
   answered 503; `truncate`: every response cut after half its body; `stall`: every request
   held without an answer) and meanwhile
   - subscribes a new consumer from earliest (its replay must come from the lake),
   - runs a SQL count and checksum over the topic (psql, `sql.query_timeout` = 20 s) in the
     background, and
   - produces 50 more messages (they go to the local log: every one acknowledged);
3. heals S3 and checks: the consumer, never disconnected, receives all 350 messages exactly
   once, in id order, with their payloads (whatever it received during the fault included);
   every SQL answer during the fault was either the exact count and checksum or a clear error,
   never a wrong number; SQL after the heal is exact; the replay's read errors were counted
   (the fault was met) and retried; `ledgerlake verify --deep` is clean; the service stops
   cleanly and never panicked. Refused and 503 reads reach the replay as errors (counted, then
   retried with backoff); cut and held answers are retried inside the S3 client.

Each test prints one `FAULT-FIGURES` line: the proxy's counts, the replay's read errors, the
SQL outcomes during the fault, messages received during the fault and the catch-up time.
"""
import threading
import time
import uuid

import pulsar
import pytest

from conftest import eventually, verify_clean
from lake import offload_and_wait, stats
from test_lake_faults import (ENV, ROLLOVER, assert_service_healthy, figures, keep_log,
                              new_client, produce_batch, proxy, stop_load_and_client)
from test_replay import set_policy, wait_all_deleted
from test_sql import psql

WINDOW = 15.0
READ_FAULTS = {
    "refuse": ("refuse", {}),
    "http503": ("http503", {}),
    "truncate": ("truncate", {}),
    "stall": ("stall", {"stall_seconds": 30}),
}
READ_ENV = {
    "LEDGERLAKE_SQL__QUERY_TIMEOUT": "20s",
    # Retries after the heal come quickly (the default backs off to 30 s).
    "LEDGERLAKE_REPLAY__RETRY_MAX": "2s",
}


def sql_figures(svc, table):
    """(count, checksum) of the topic's payloads, or the error psql printed."""
    r = psql(svc, f'SELECT count(*), sum(length(payload) * (entry_id + 1)) FROM "{table}"')
    if r.returncode != 0:
        return None, r.stderr.strip()
    count, checksum = r.stdout.strip().split("|")
    return (int(count), int(checksum)), None


def expected_figures(messages):
    return len(messages), sum(len(p) * (k[1] + 1) for k, p in messages.items())


def receive_until(consumer, got, deadline, want):
    """Receives (and acknowledges) into `got` until `want` messages or `deadline`."""
    while len(got) < want and time.monotonic() < deadline:
        try:
            m = consumer.receive(timeout_millis=200)
        except pulsar.Timeout:
            continue
        mid = m.message_id()
        got.append(((mid.ledger_id(), mid.entry_id(), mid.batch_index()), m.data()))
        consumer.acknowledge(m)


@pytest.mark.parametrize("kind", list(READ_FAULTS))
def test_s3_fault_under_lake_reads(kind, make_service, s3_server, proxy):  # noqa: F811
    mode, params = READ_FAULTS[kind]
    prefix = f"readfault-{kind}-{uuid.uuid4().hex[:6]}"
    env = dict(ENV, **ROLLOVER, **READ_ENV, **s3_server.service_env(prefix))
    env["LEDGERLAKE_LAKE__S3__ENDPOINT"] = proxy.endpoint
    svc = make_service(env)
    svc.start()
    set_policy(svc, "offloadDeletionLagMs", 0)
    client = new_client(svc)
    try:
        name = f"rf{kind}-{uuid.uuid4().hex[:6]}"
        topic = f"persistent://public/default/{name}"
        expected = produce_batch(client, topic, "lake", 300)
        s = offload_and_wait(svc, topic)
        assert s["status"] == "SUCCESS", s
        assert wait_all_deleted(svc, topic) >= 5
        base = expected_figures(expected)
        assert sql_figures(svc, name) == (base, None)
        errors0 = stats(svc, topic)["replay"]["readErrors"]
        before = proxy.stats()

        t_on = time.monotonic()
        proxy.set_mode(mode, **params)
        consumer = client.subscribe(topic, f"replay-{kind}", receiver_queue_size=100,
                                    initial_position=pulsar.InitialPosition.Earliest)
        during_sql = []

        def sql_during():
            while time.monotonic() < t_on + WINDOW:
                during_sql.append(sql_figures(svc, name))
        sql_thread = threading.Thread(target=sql_during)
        sql_thread.start()
        more = produce_batch(client, topic, "during", 50)
        got = []
        receive_until(consumer, got, t_on + WINDOW, 350)
        received_during = len(got)
        counts = proxy.stats()
        proxy.set_mode("pass")
        t_heal = time.monotonic()
        receive_until(consumer, got, t_heal + 120, 350)
        catch_up = time.monotonic() - t_heal
        sql_thread.join(timeout=120)
        assert not sql_thread.is_alive(), "a SQL query outlived its deadline"

        injected = {k: v - before.get(k, 0) for k, v in counts.items() if isinstance(v, int)}
        read_errors = stats(svc, topic)["replay"]["readErrors"] - errors0
        outcomes = [("exact" if f is not None else err.splitlines()[-1][:160])
                    for f, err in during_sql]
        figures(f"s3-read-{kind}", proxy=injected, replay_read_errors=read_errors,
                received_during_fault=received_during, catch_up_s=round(catch_up, 1),
                sql_during_fault=outcomes[:6], sql_queries_during_fault=len(outcomes))

        # The fault was met: the proxy injected it. Refused and 503 reads fail and are counted
        # (then retried); cut and held answers are retried inside the S3 client (a cut read
        # resumes where it ended), so they need not reach the replay as errors.
        met = {"refuse": "mode_refuse", "http503": "http503", "truncate": "truncated_responses",
               "stall": "stalled"}[kind]
        assert injected.get(met, 0) > 0, injected
        if kind in ("refuse", "http503"):
            assert read_errors >= 1, stats(svc, topic)["replay"]
        # The consumer got everything exactly once, in id order, without reconnecting.
        expected.update(more)
        ids = [k for k, _ in got]
        assert len(ids) == len(set(ids)), "a message was delivered twice"
        assert ids == sorted(expected), (len(ids), len(expected))
        assert all(expected[k] == data for k, data in got)
        # SQL during the fault: exact or a clear error, never a wrong answer.
        assert during_sql, "no SQL query ran during the fault"
        for figs, err in during_sql:
            if figs is None:
                assert err.startswith("psql:") or "ERROR" in err, err
            else:
                assert figs in (base, expected_figures(expected)), (figs, base)
        def exact_after_heal():
            assert sql_figures(svc, name) == (expected_figures(expected), None)
        eventually(exact_after_heal, timeout=60, interval=1)
        verify_clean(svc, topic)
        assert_service_healthy(svc)
        consumer.close()
        client.close()
        assert svc.stop() == 0, "the service did not stop cleanly"
    finally:
        keep_log(svc, f"s3-read-{kind}")
        proxy.set_mode("pass")
        stop_load_and_client(None, client)
