"""Crashes at every step of offload, local deletion, retention, snapshot expiry, sealing and
recovery (issue 20), each through a named failpoint (`LL_FAILPOINTS`, debug builds; the names
are listed in src/failpoint.rs). Each test runs the service with one point armed until the
process aborts there, restarts it without, lets it finish the interrupted work and then checks:
- `ledgerlake verify --deep`: 0 gaps, 0 duplicates between the log and the lake;
- a reader from the earliest: every acknowledged message exactly once, none never sent
  (after retention: a complete suffix of what was sent);
- orphans cleaned: every data file under the table's location is referenced by a snapshot,
  and the log keeps index files only for ledgers it still holds locally.
Also a failed `fdatasync`: the journal stops acknowledging (fail-stop) and a restart recovers
every acknowledged entry."""
import os
import signal
import threading
import time
import urllib.parse
import urllib.request
import uuid

import pulsar
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from conftest import close_quietly, eventually, metric, read_all, verify_clean
from lake import http, offload_and_wait, stats, table_of, topic_path

NS = "admin/v2/namespaces/public/default"
FAST = {
    "LEDGERLAKE_LAKE__CHECK_INTERVAL": "100ms",
    "LEDGERLAKE_BROKER__RETENTION_CHECK_INTERVAL": "100ms",
    "LEDGERLAKE_LEDGER__ROLLOVER_ENTRIES": "20",
    "LEDGERLAKE_BROKER__CURSOR_PERSIST_INTERVAL": "100ms",
    "LEDGERLAKE_LAKE__ORPHAN_FILE_AGE": "0s",
    "LEDGERLAKE_LAKE__ORPHAN_CHECK_INTERVAL": "100ms",
    # Retention's removed files are deleted by the finisher a second after the removal (the
    # crash before that deletion is one of the steps below).
    "LEDGERLAKE_LAKE__REMOVED_FILE_GRACE": "1s",
    # Small segments, so that deleting ledgers' local copies frees whole segments.
    "LEDGERLAKE_LEDGER__SEGMENT_SIZE": "1MiB",
    "LEDGERLAKE_LEDGER__MAX_ENTRY_SIZE": "256KiB",
    "LEDGERLAKE_BROKER__MAX_MESSAGE_SIZE": "100KiB",
}
PAYLOAD_PAD = 4000  # bytes per message: 20-entry ledgers of ~80 KB, a segment every ~12 ledgers


class History:
    """Sends with a producer that gives up after a few seconds; remembers what was
    acknowledged (a crash fails the sends in flight: they may or may not be stored)."""

    def __init__(self, client, topic):
        self.topic = topic
        self.sent = []  # every payload handed to the producer, in order
        self.acked = set()
        self.producer = client.create_producer(topic, batching_enabled=False,
                                               send_timeout_millis=5000)

    def send(self, n):
        for _ in range(n):
            payload = f"{len(self.sent):06d}-".encode() + b"x" * PAYLOAD_PAD
            self.sent.append(payload)
            try:
                self.producer.send(payload)
                self.acked.add(payload)
            except pulsar.PulsarException:
                return False
        return True

    def check(self, client, expired_prefix=False):
        """A reader from the earliest: no duplicate, nothing never sent, every acknowledged
        payload (after the first one read, when retention removed a prefix) present."""
        reader = client.create_reader(self.topic, pulsar.MessageId.earliest)
        got = []
        while reader.has_message_available():
            got.append(reader.read_next(timeout_millis=30000).data())
        reader.close()
        assert len(got) == len(set(got)), "duplicates read"
        sent = set(self.sent)
        assert all(g in sent for g in got), "a payload read that was never sent"
        want = self.acked
        if expired_prefix and got:
            want = {p for p in want if p >= got[0]}
        missing = sorted(want - set(got))
        assert not missing, f"{len(missing)} acknowledged messages lost, first {missing[0][:7]}"
        assert got == sorted(got), "order changed"
        return got


def wait_exit(svc, failpoint, timeout=120):
    """Waits for the armed failpoint to abort the process."""
    deadline = time.time() + timeout
    while svc.proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert svc.proc.poll() is not None, f"the failpoint {failpoint} did not fire"
    assert svc.proc.returncode != 0
    assert f"failpoint {failpoint}: aborting" in open(svc.log_path, errors="replace").read()
    svc.proc = None


def restart_clean(svc):
    svc.env.pop("LL_FAILPOINTS", None)
    svc.start()


def the_table(svc, topic):
    lake = stats(svc, topic)["lake"]
    catalog = SqlCatalog(lake["catalog"], uri=f"sqlite:///{svc.data_dir}/data/catalog.db",
                         warehouse="")
    return catalog.load_table(tuple(lake["namespace"]) + (lake["tableName"],))


def local_path(uri):
    return urllib.parse.urlparse(uri).path if uri.startswith("file:") else uri


def local_files(location):
    root = local_path(location)
    return {os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".parquet")}


def assert_no_orphans(svc, topic):
    """Every Parquet file under the table's data location is referenced by a snapshot (the
    orphan sweep removed the rest), and index files exist only for ledgers held locally."""
    def lake_swept():
        offload_and_wait(svc, topic)  # a pass: the sweep runs in it
        table = the_table(svc, topic)
        referenced = set()
        for snap in table.metadata.snapshots:
            referenced |= {local_path(t.file.file_path)
                           for t in table.scan(snapshot_id=snap.snapshot_id).plan_files()}
        stored = local_files(table.metadata.location + "/data")
        assert stored == referenced, (stored - referenced, referenced - stored)
    eventually(lake_swept, timeout=60, interval=0.5)

    local = {str(l["ledger"]["id"]) for l in stats(svc, topic)["ledgers"]
             if l["ledger"]["state"] in ("open", "sealed", "offloaded")}
    index_dir = os.path.join(svc.data_dir, "data", "ledger", "index")
    present = {f.split(".")[0].lstrip("0") for f in os.listdir(index_dir)}
    stray = present - local
    assert not stray, f"index files of ledgers no longer held locally: {stray}"


def settle(svc, topic):
    """Lets the restarted service finish: everything sealed is offloaded and deleted locally."""
    offload_and_wait(svc, topic)

    def all_deleted():
        left = [l["ledger"]["id"] for l in stats(svc, topic)["ledgers"]
                if l["ledger"]["entry_count"] > 0 and l["ledger"]["state"] not in ("deleted", "open")]
        assert not left, left
    eventually(all_deleted, timeout=120, interval=0.2)


def begin(make_service, failpoint, prefix):
    """A service with `failpoint` armed, a client, a new topic and its history."""
    svc = start(make_service, failpoint)
    client = pulsar.Client(svc.url, operation_timeout_seconds=10)
    topic = f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:6]}"
    return svc, client, topic, History(client, topic)


def restart_and_check(svc, topic, history):
    """Restarts without the failpoint, sends more, lets the interrupted work finish, then
    checks the log against the lake, the history and the orphans."""
    restart_clean(svc)
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    history.producer = client.create_producer(topic, batching_enabled=False)
    assert history.send(30)
    settle(svc, topic)
    verify_clean(svc, topic)
    history.check(client)
    assert_no_orphans(svc, topic)
    close_quietly(client)


def start(make_service, failpoint, extra=None):
    svc = make_service(dict(FAST, LL_FAILPOINTS=failpoint, **(extra or {})))
    svc.start()
    assert http("PUT", f"{svc.http}/{NS}/offloadDeletionLagMs", "0")[0] == 204
    return svc


OFFLOAD_STEPS = [
    "offload.before_commit",        # files written, not committed
    "offload.after_commit",         # committed, ledgers not marked offloaded
    "offload.before_mark",          # same, through the mark step
    "offload.before_delete_local",  # committed and marked, local copy not deleted
    "ledger.local_delete.after_record",  # deletion recorded, index and segments still there
    "ledger.reclaim.before_sync",   # segments removed, directory not synced
    "ledger.seal.after_index",      # a ledger's index written, seal not recorded
    "ledger.seal.after_record",     # seal recorded, index not cached
]


@pytest.mark.parametrize("failpoint", OFFLOAD_STEPS)
def test_crash_in_offload_and_sealing(make_service, failpoint):
    svc, client, topic, history = begin(make_service, failpoint, "fp")
    # Seal and offload ledgers until the point fires (each pass offloads what is sealed).
    for _ in range(60):
        if not history.send(20) or svc.proc.poll() is not None:
            break
    wait_exit(svc, failpoint)
    close_quietly(client)

    restart_and_check(svc, topic, history)


RETENTION_STEPS = [
    "retention.before_commit",       # the delete snapshot's files written, not committed
    "retention.after_commit",        # committed, older snapshots not expired
    "retention.before_file_delete",  # after the grace: expired, the removed files not deleted
]


def crash_in_retention(make_service, failpoint, prefix):
    """100 messages offloaded, then a retention of 0 minutes that `failpoint` crashes; the
    service restarted clean, its topic and the topic's history."""
    svc, client, topic, history = begin(make_service, failpoint, prefix)
    assert history.send(100)
    settle(svc, topic)
    # Everything older than 0 minutes and consumed (no subscription) expires.
    assert http("POST", f"{svc.http}/{NS}/retention",
                '{"retentionTimeInMinutes": 0, "retentionSizeInMB": -1}')[0] == 204
    wait_exit(svc, failpoint)
    close_quietly(client)
    restart_clean(svc)
    return svc, topic, history


@pytest.mark.parametrize("failpoint", RETENTION_STEPS)
def test_crash_in_retention(make_service, failpoint):
    svc, topic, history = crash_in_retention(make_service, failpoint, "rt")
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)

    def retention_done():
        offload_and_wait(svc, topic)
        st = http("GET", f"{svc.http}/admin/v2/{topic_path(topic)}/offload")[1]
        assert st["retention"]["lastError"] == "", st
        table = the_table(svc, topic)
        assert table.current_snapshot().summary.operation.value == "delete", \
            table.current_snapshot().summary
        assert len(table.metadata.snapshots) == 1
    eventually(retention_done, timeout=120, interval=0.5)
    # Keep what is left from here on: the reader below must not race retention.
    assert http("POST", f"{svc.http}/{NS}/retention",
                '{"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}')[0] == 204
    verify_clean(svc, topic)
    history.producer = client.create_producer(topic, batching_enabled=False)
    assert history.send(30)
    got = history.check(client, expired_prefix=True)
    assert len(got) < len(history.acked), "retention removed nothing"
    assert_no_orphans(svc, topic)
    close_quietly(client)


def test_files_of_expired_ledgers_left_by_a_crash_go_at_the_next_start_by_themselves(
        make_service):
    """A crash after retention expired every ledger of a topic but before their files left
    the table: the next start removes the files with no new data and no request (a pass used
    to skip a table whose ledgers were all expired as having nothing to do)."""
    svc, topic, _ = crash_in_retention(make_service, "retention.before_commit", "rg")
    # Nothing but the leftovers gives a pass work (expired ledgers are not listed).
    busy = [l["ledger"] for l in stats(svc, topic)["ledgers"]
            if l["ledger"]["state"] in ("sealed", "offloaded")]
    assert not busy, busy

    def removed():
        table = the_table(svc, topic)
        assert table.current_snapshot().summary.operation.value == "delete", \
            table.current_snapshot().summary
        assert not list(table.scan().plan_files())
    eventually(removed, timeout=60, interval=0.5)
    verify_clean(svc, topic)


@pytest.mark.parametrize("failpoint", ["history.before_commit", "history.after_commit"])
def test_crash_in_snapshot_expiry(make_service, failpoint):
    svc, client, topic, history = begin(make_service, failpoint, "hx")
    assert history.send(20)
    offload_and_wait(svc, topic)
    with the_table(svc, topic).transaction() as tx:
        tx.set_properties({"history.expire.max-snapshot-age-ms": "1",
                           "history.expire.min-snapshots-to-keep": "2"})
    # One commit per offload: the tenth makes 8 snapshots expirable.
    for _ in range(20):
        if svc.proc.poll() is not None or not history.send(20):
            break
        try:
            offload_and_wait(svc, topic, timeout=30)
        except OSError:
            break
    wait_exit(svc, failpoint)
    close_quietly(client)

    restart_and_check(svc, topic, history)
    assert len(the_table(svc, topic).metadata.snapshots) < 9


@pytest.mark.parametrize("failpoint", ["ledger.recovery.after_scan", "ledger.recovery.after_seal"])
def test_crash_during_recovery(make_service, failpoint):
    """A SIGKILL leaves open ledgers; the next start crashes while recovering them; the one
    after recovers every acknowledged entry."""
    svc = start(make_service, "")
    client = pulsar.Client(svc.url, operation_timeout_seconds=10)
    topics = [f"persistent://public/default/rc{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
    histories = [History(client, t) for t in topics]
    for h in histories:
        assert h.send(50)  # two sealed ledgers and an open one with 10 entries
    svc.stop(signal.SIGKILL)
    close_quietly(client)

    svc.env["LL_FAILPOINTS"] = failpoint
    with pytest.raises(RuntimeError, match="did not become ready"):
        svc.start()
    wait_exit(svc, failpoint)

    restart_clean(svc)
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    for h in histories:
        h.producer = client.create_producer(h.topic, batching_enabled=False)
        assert h.send(10)
        settle(svc, h.topic)
    verify_clean(svc, *topics)
    for h in histories:
        h.check(client)
    close_quietly(client)


@pytest.mark.parametrize("failpoint", ["ledger.seal.record", "ledger.seal.answer"])
def test_a_failed_seal_is_tried_again_until_it_lands(make_service, failpoint):
    """The store refuses the first three seals' records (`ledger.seal.record`, as a store
    that is unreachable for a while would), or records them and loses the answer
    (`ledger.seal.answer`): each such ledger is closed on a later try, without a restart
    (after a lost answer, from the store's record), then offloaded and deleted locally like
    any other. Before, it stayed open until the next start: never offloaded, its journal
    segments pinned."""
    svc = start(make_service, f"{failpoint}=error*3")
    client = pulsar.Client(svc.url, operation_timeout_seconds=10)
    topic = f"persistent://public/default/reseal-{uuid.uuid4().hex[:6]}"
    history = History(client, topic)
    assert history.send(70)  # three rolls (20 entries each): three refused seals
    log = lambda: open(svc.log_path, errors="replace").read()
    eventually(lambda: log().count(f"failpoint {failpoint}: injecting") == 3,
               timeout=30, interval=0.2)

    def every_full_ledger_closed():
        # The open one, if any, is the current ledger (the last).
        ledgers = [l["ledger"] for l in stats(svc, topic)["ledgers"]]
        still_open = [l["id"] for l in ledgers[:-1] if l["state"] == "open"]
        assert not still_open, still_open
    eventually(every_full_ledger_closed, timeout=30, interval=0.2)
    assert "closing a ledger failed; trying again" in log()
    if failpoint == "ledger.seal.record":
        # Only the retry can close these; a seal whose answer was lost may also be taken
        # from the store's record by an offload pass that reads it first.
        assert "closed a ledger whose seal had failed" in log()
    settle(svc, topic)
    verify_clean(svc, topic)
    history.check(client)
    assert_no_orphans(svc, topic)
    close_quietly(client)


def test_a_topic_whose_deletion_failed_takes_messages_again(make_service):
    """A DELETE whose seal the store refuses fails; the topic stays, and its producer is
    served again at once (before, its log refused every append until the topic was read
    anew). The seal is tried again (refused twice more: about 7 s) and lands; the repeated
    DELETE then succeeds."""
    svc = start(make_service, "ledger.seal.record=error*3")
    client = pulsar.Client(svc.url, operation_timeout_seconds=10)
    topic = f"persistent://public/default/undeleted-{uuid.uuid4().hex[:6]}"
    history = History(client, topic)
    assert history.send(5)  # one open ledger: the DELETE's seal is the one refused
    history.producer.close()
    url = f"{svc.http}/admin/v2/{topic_path(topic)}"
    status, body = http("DELETE", url)
    assert status == 500, (status, body)
    assert "failpoint ledger.seal.record: injecting" in open(svc.log_path,
                                                            errors="replace").read()
    # Before, the topic refused every message until its log was read anew (a SEND_ERROR,
    # on which the client reconnects and sends again, for good).
    history.producer = client.create_producer(topic, batching_enabled=False,
                                              send_timeout_millis=5000)
    assert within(30, lambda: history.send(5)), \
        "the topic refused messages after its deletion failed"
    # Served by the log the deletion left (not one read anew after a let-go).
    assert "let go of a topic" not in open(svc.log_path, errors="replace").read()
    history.check(client)
    history.producer.close()
    eventually(lambda: http("DELETE", url)[0] == 204, timeout=30, interval=0.5)
    assert http("GET", f"{svc.http}/admin/v2/{topic_path(topic)}/stats")[0] == 404
    close_quietly(client)


def test_a_topic_whose_deletion_failed_is_let_go_once_its_seal_lands(make_service):
    """A DELETE whose seal the store refuses fails with no client left: the topic, unloaded
    but owned here, is let go once the seal tried again lands (before, it stayed owned with
    its log in memory until a restart or a client), and the repeated DELETE succeeds."""
    svc = start(make_service, "ledger.seal.record=error*1")
    client = pulsar.Client(svc.url, operation_timeout_seconds=10)
    topic = f"persistent://public/default/dropped-{uuid.uuid4().hex[:6]}"
    history = History(client, topic)
    assert history.send(5)
    history.producer.close()
    close_quietly(client)
    url = f"{svc.http}/admin/v2/{topic_path(topic)}"
    assert http("DELETE", url)[0] == 500
    log = lambda: open(svc.log_path, errors="replace").read()
    eventually(lambda: "let go of a topic once no seal of it was tried again" in log(),
               timeout=30, interval=0.2)
    assert metric(svc, "ledgerlake_topic_logs_in_memory") == 0
    assert http("DELETE", url)[0] == 204
    assert http("GET", f"{svc.http}/admin/v2/{topic_path(topic)}/stats")[0] == 404


def test_an_unloaded_topic_whose_seal_failed_is_let_go_once_the_retry_lands(make_service):
    """An idle topic's unload finds its seal refused: the topic stays owned here with its
    log in memory until the seal tried again lands, then is let go as its unload would have
    (before, it stayed until it was loaded and unloaded again), and loads again as any."""
    svc = start(make_service, "ledger.seal.record=error*1",
                {"LEDGERLAKE_BROKER__UNLOAD_IDLE_AFTER": "1s"})
    client = pulsar.Client(svc.url, operation_timeout_seconds=10)
    topic = f"persistent://public/default/letgo-{uuid.uuid4().hex[:6]}"
    history = History(client, topic)
    assert history.send(5)  # one open ledger: the unload's seal is the one refused
    history.producer.close()
    log = lambda: open(svc.log_path, errors="replace").read()
    eventually(lambda: "sealing an unloaded topic's ledger failed" in log(),
               timeout=30, interval=0.2)
    eventually(lambda: "let go of a topic once no seal of it was tried again" in log(),
               timeout=30, interval=0.2)
    assert "closed a ledger whose seal had failed" in log()
    # The unload is counted once it is whole (ownership released, log forgotten).
    assert metric(svc, "ledgerlake_topics_unloaded_idle_total") == 1
    assert metric(svc, "ledgerlake_topic_logs_in_memory") == 0
    history.producer = client.create_producer(topic, batching_enabled=False)
    assert history.send(5)
    history.check(client)
    close_quietly(client)


def test_an_admin_unload_whose_seal_failed_forgets_the_log_once_the_retry_lands(make_service):
    """`PUT …/unload` finds the topic's seal refused: the unload answers, the topic's claim is
    given up (its open ledger keeps it on this node's bookie), and its log leaves memory once
    the seal tried again lands (before, it stayed until a restart); the topic then loads
    again with every message."""
    svc = start(make_service, "ledger.seal.record=error*1")
    client = pulsar.Client(svc.url, operation_timeout_seconds=10)
    topic = f"persistent://public/default/unloaded-{uuid.uuid4().hex[:6]}"
    history = History(client, topic)
    assert history.send(5)  # one open ledger: the unload's seal is the one refused
    assert metric(svc, "ledgerlake_topic_logs_in_memory") == 1
    history.producer.close()
    status, body = http("PUT", f"{svc.http}/admin/v2/{topic_path(topic)}/unload")
    assert status == 204, (status, body)
    log = lambda: open(svc.log_path, errors="replace").read()
    assert "sealing at unload failed" in log()
    eventually(lambda: metric(svc, "ledgerlake_topic_logs_in_memory") == 0,
               timeout=30, interval=0.2)
    assert "closed a ledger whose seal had failed" in log()
    history.producer = client.create_producer(topic, batching_enabled=False)
    assert history.send(5)
    history.check(client)
    close_quietly(client)


def test_a_topic_made_anew_during_its_forced_deletion_keeps_its_messages(make_service):
    """A forced DELETE closes the producer, which reconnects at once and makes the topic
    anew (auto-creation) while the deletion is still finishing (held by a failpoint after the
    topic went): the new topic keeps every message acknowledged to it. Before, the deletion
    deleted the name's log a second time, outside the topic's lock, taking the new topic's
    acknowledged messages and refusing its appends from then on. The name's lake table loses
    the deleted topic's rows and stays (before, it was dropped whole: in a cluster another
    node may have offloaded the new topic into it already)."""
    svc = start(make_service, "ops.after_topics_deleted=sleep(12000)")
    client = pulsar.Client(svc.url, operation_timeout_seconds=10)
    topic = f"persistent://public/default/anew-{uuid.uuid4().hex[:6]}"
    producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=5000)
    for i in range(5):
        producer.send(f"old{i}".encode())
    offload_and_wait(svc, topic)
    catalog, ident, _ = table_of(svc, topic)
    assert len(catalog.load_table(ident).scan().to_arrow()) == 5
    delete_while_made_anew(svc, f"{svc.http}/admin/v2/{topic_path(topic)}?force=true",
                           producer)
    assert catalog.table_exists(ident), "the table of a topic made anew was dropped"
    assert len(catalog.load_table(ident).scan().to_arrow()) == 0
    within(10, lambda: [producer.send(f"new{i}".encode()) for i in range(5, 10)])
    assert read_all(client, topic) == [f"new{i}".encode() for i in range(10)]
    # The new topic offloads into the table it kept; the lake and the log agree.
    offload_and_wait(svc, topic)
    rows = catalog.load_table(ident).scan().to_arrow()
    assert sorted(rows.column("payload").to_pylist()) == [f"new{i}".encode() for i in range(10)]
    eventually(lambda: verify_clean(svc, topic), timeout=60, interval=1)
    close_quietly(client)


def test_a_partitioned_topic_made_anew_during_its_forced_deletion_stays_whole(make_service):
    """The same with a partitioned topic: its partitions, made anew by their producers while
    the deletion finishes, keep their partitioned topic (partition count, schemas), so they
    are served, listed and deleted as one (before, the deletion removed the partition count
    under them: `…/partitions` answered 404 and each partition refused its own DELETE)."""
    svc = start(make_service, "ops.after_topics_deleted=sleep(12000)")
    client = pulsar.Client(svc.url, operation_timeout_seconds=10)
    topic = f"persistent://public/default/anew-parted-{uuid.uuid4().hex[:6]}"
    url = f"{svc.http}/admin/v2/{topic_path(topic)}/partitions"
    assert http("PUT", url, "2")[0] in (200, 204)
    producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=5000)
    for i in range(5):
        producer.send(f"old{i}".encode())
    delete_while_made_anew(svc, f"{url}?force=true", producer)
    assert http("GET", url) == (200, {"partitions": 2})
    got = read_all(client, f"{topic}-partition-0") + read_all(client, f"{topic}-partition-1")
    assert sorted(got) == [f"new{i}".encode() for i in range(5)]
    producer.close()
    assert http("DELETE", url)[0] == 204
    assert http("GET", url) == (200, {"partitions": 0})
    close_quietly(client)


def delete_while_made_anew(svc, url, producer):
    """DELETEs `url` (a forced deletion, held by the failpoint once its topics are gone) and,
    while it is held, sends `new0`…`new4` with `producer`: closed by the deletion, it
    reconnects and makes the topic anew."""
    answer = {}
    deletion = threading.Thread(target=lambda: answer.update(status=http("DELETE", url)[0]))
    deletion.start()
    eventually(lambda: "failpoint: pausing" in open(svc.log_path, errors="replace").read(),
               timeout=10, interval=0.05)
    within(10, lambda: [producer.send(f"new{i}".encode()) for i in range(5)])
    assert deletion.is_alive(), "the deletion ended before the topic was made anew"
    deletion.join(30)
    assert answer.get("status") == 204, answer


def within(seconds, what):
    """`what()`, run in a daemon thread so that a call that never returns fails the test."""
    out = {}

    def run():
        try:
            out["value"] = what()
        except BaseException as e:  # handed to the test below
            out["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still waiting after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out["value"]


def health(svc, what):
    try:
        with urllib.request.urlopen(f"{svc.http}/health/{what}", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


FSYNC_FAILED = "failpoint journal.fdatasync: injecting an I/O error"


def read_text(path):
    with open(path) as f:
        return f.read()


def test_failed_fdatasync_stops_acknowledging_and_restart_recovers(make_service):
    """The 30th journal `fdatasync` fails: from then on no append is acknowledged (the state
    of the page cache is unknown), liveness fails so that a supervisor restarts the process,
    and the restart recovers every acknowledged entry."""
    svc = start(make_service, "journal.fdatasync=error#30")
    client = pulsar.Client(svc.url, operation_timeout_seconds=10)
    topic = f"persistent://public/default/fsync-{uuid.uuid4().hex[:6]}"
    history = History(client, topic)
    results = {}

    def done(payload):
        return lambda res, _id: results.__setitem__(payload, res)
    # Bursts of 10 with a pause between them: each burst needs at least one sync, and how
    # many it takes depends on the journal's grouping, so send until the point has fired
    # (the log says so), then 20 more that must not be acknowledged.
    fired_at = None
    for i in range(2000):
        payload = f"{i:06d}-".encode() + b"x" * PAYLOAD_PAD
        history.sent.append(payload)
        history.producer.send_async(payload, done(payload))
        if i % 10 == 9:
            time.sleep(0.05)
            if fired_at is None and FSYNC_FAILED in read_text(svc.log_path):
                fired_at = i
            if fired_at is not None and i >= fired_at + 20:
                break
    assert fired_at is not None, "the 30th fdatasync never came"
    # The client retries refused sends on a new connection; none is acknowledged any more.
    time.sleep(5)
    acked = {p for p, r in results.items() if r == pulsar.Result.Ok}
    history.acked = acked
    assert 0 < len(acked) < len(history.sent), len(acked)
    log = read_text(svc.log_path)
    assert FSYNC_FAILED in log
    assert "journal failed; refusing further appends until restart" in log
    assert svc.proc.poll() is None, "the service exited"
    assert health(svc, "live") == 503
    time.sleep(2)
    assert {p for p, r in results.items() if r == pulsar.Result.Ok} == acked, \
        "an append was acknowledged after the journal failed"
    svc.stop(signal.SIGKILL)
    close_quietly(client)

    restart_clean(svc)
    assert health(svc, "live") == 200
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    history.producer = client.create_producer(topic, batching_enabled=False)
    assert history.send(30)
    settle(svc, topic)
    verify_clean(svc, topic)
    history.check(client)
    close_quietly(client)
