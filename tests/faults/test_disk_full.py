"""A full disk and the local-disk budget (issue 20).

- The log's volume fills up (a small tmpfs mounted by the test, filled by a ballast file):
  producers get SEND_ERROR with a clear reason, nothing acknowledged is damaged, and appends
  resume by themselves once space returns, with no restart.
- The lake is unreachable (S3 refusing connections through the fault proxy): producers keep
  being served from the local disk until `ledger.max_local_size` is reached, then get a clear
  error; when S3 heals, offload catches up, local copies are deleted and producers are served
  again.
Every message acknowledged is read back exactly once and `verify` finds nothing."""
import logging
import os
import subprocess
import tempfile
import threading
import time
import uuid

import pulsar
import pytest

from conftest import eventually, read_all, verify_clean
from faultproxy import FaultProxy
from lake import http, offload_and_wait, stats

SMALL = {
    "LEDGERLAKE_LAKE__CHECK_INTERVAL": "100ms",
    "LEDGERLAKE_LEDGER__ROLLOVER_ENTRIES": "20",
    "LEDGERLAKE_LEDGER__SEGMENT_SIZE": "1MiB",
    "LEDGERLAKE_LEDGER__MAX_ENTRY_SIZE": "256KiB",
    "LEDGERLAKE_BROKER__MAX_MESSAGE_SIZE": "100KiB",
    "LEDGERLAKE_LEDGER__DISK_CHECK_INTERVAL": "100ms",
}
PAD = 8000


class ClientLog(logging.Handler):
    """The Pulsar client's own log lines (the server's SEND_ERROR reasons appear there)."""

    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())

    def saw(self, text):
        return any(text in line for line in self.lines)


# The client library takes its logger once per process (the first client's): one logger and
# one handler for every client of this module; each test looks at the lines since its start.
_LOGGER = logging.getLogger("pulsar-client-faults")
_LOGGER.setLevel(logging.INFO)
_LOGGER.propagate = False
_HANDLER = ClientLog()
_LOGGER.addHandler(_HANDLER)


class _Since:
    """The client log lines from now on."""

    def __init__(self):
        self.start = len(_HANDLER.lines)

    @property
    def lines(self):
        return _HANDLER.lines[self.start:]

    def saw(self, text):
        return any(text in line for line in self.lines)


def client_with_log(url):
    return pulsar.Client(url, operation_timeout_seconds=10, logger=_LOGGER), _Since()


class Sender:
    """Sends unique payloads one at a time; remembers every send's outcome. A refused send
    stays queued in the client, which retries it on a new connection (and may get it
    acknowledged later), so outcomes are recorded by callback, whenever they come."""

    def __init__(self, client, topic):
        self.producer = client.create_producer(topic, batching_enabled=False,
                                               send_timeout_millis=0, block_if_queue_full=True)
        self.sent = []
        self.results = {}

    @property
    def acked(self):
        return [p for p, r in self.results.items() if r == pulsar.Result.Ok]

    def send(self, n, wait=3.0):
        """Sends up to `n`, each once the previous one was acknowledged; stops when one is
        not acknowledged within `wait` seconds. Returns how many were acknowledged."""
        for i in range(n):
            payload = f"{len(self.sent):06d}-".encode() + b"d" * PAD
            self.sent.append(payload)
            answered = threading.Event()

            def done(res, _id, payload=payload, answered=answered):
                self.results[payload] = res
                answered.set()
            self.producer.send_async(payload, done)
            if not answered.wait(wait) or self.results[payload] != pulsar.Result.Ok:
                return i
        return n


def check_history(client, topic, sender):
    got = read_all(client, topic)
    assert len(got) == len(set(got)), "duplicates read"
    assert set(got) <= set(sender.sent), "a payload read that was never sent"
    missing = set(sender.acked) - set(got)
    assert not missing, f"{len(missing)} acknowledged messages lost"


@pytest.fixture
def small_volume():
    """A 24 MiB tmpfs mounted for the test (root only), unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small volume needs root (CI runs the suite as root)")
    mount_point = tempfile.mkdtemp(prefix="ll-vol-")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", mount_point],
                       capture_output=True, text=True)
    if r.returncode != 0:
        os.rmdir(mount_point)
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", mount_point], check=False)
        os.rmdir(mount_point)


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_full_log_volume_refuses_then_recovers(make_service, small_volume, tmp_path):
    svc = make_service(dict(SMALL, LEDGERLAKE_LAKE__WAREHOUSE=f"{tmp_path}/warehouse"))
    # The service's data (log, metadata) on the small volume; its own log and the warehouse
    # elsewhere.
    os.makedirs(os.path.join(small_volume, "data"))
    os.symlink(os.path.join(small_volume, "data"), os.path.join(svc.data_dir, "data"))
    svc.start()
    client, clog = client_with_log(svc.url)
    topic = f"persistent://public/default/full-{uuid.uuid4().hex[:6]}"
    sender = Sender(client, topic)
    assert sender.send(100) == 100

    # Fill the volume, leaving less than two segments free.
    ballast = os.path.join(small_volume, "ballast")
    with open(ballast, "wb") as f:
        f.truncate(0)
        room = free_bytes(small_volume) - 1_500_000
        f.write(b"\0" * room)
        f.flush()
        os.fsync(f.fileno())
    assert free_bytes(small_volume) < 2 * 1024 * 1024

    # Refused with a clear reason; the service stays up and says why in its log.
    def refused():
        assert sender.send(5) < 5
    eventually(refused, timeout=30, interval=0.2)
    assert clog.saw("appends refused: the log's volume is full"), clog.lines[-5:]
    assert "refusing appends" in open(svc.log_path).read()
    assert svc.proc.poll() is None
    status, _ = http("GET", f"{svc.http}/health/live")
    assert status == 200, "a full disk is not a failure that needs a restart"

    # Space returns: appends resume without a restart.
    os.remove(ballast)

    def resumed():
        assert sender.send(5) == 5
    eventually(resumed, timeout=30, interval=0.2)
    assert sender.send(50) == 50
    offload_and_wait(svc, topic)
    verify_clean(svc, topic)
    check_history(client, topic, sender)
    client.close()


def test_local_budget_holds_while_the_lake_is_down(make_service, s3_server):
    proxy = FaultProxy(int(s3_server.endpoint.rsplit(":", 1)[1]))
    proxy.start()
    try:
        env = dict(SMALL, **s3_server.service_env(f"budget-{uuid.uuid4().hex[:6]}"))
        env.update(LEDGERLAKE_LAKE__S3__ENDPOINT=proxy.endpoint,
                   LEDGERLAKE_LEDGER__MAX_LOCAL_SIZE="4MiB")
        svc = make_service(env)
        svc.start()
        assert http("PUT", f"{svc.http}/admin/v2/namespaces/public/default/offloadDeletionLagMs",
                    "0")[0] == 204
        client, clog = client_with_log(svc.url)
        topic = f"persistent://public/default/budget-{uuid.uuid4().hex[:6]}"
        sender = Sender(client, topic)
        assert sender.send(40) == 40
        offload_and_wait(svc, topic)

        # S3 down: producers are served from the local disk until the budget is reached.
        proxy.set_mode("refuse")
        served = sender.send(2000)
        assert served > 100, f"refused after only {served} messages"
        assert clog.saw("ledger.max_local_size"), clog.lines[-5:]
        held = sum(os.path.getsize(os.path.join(d, f))
                   for d, _, fs in os.walk(os.path.join(svc.data_dir, "data", "ledger",
                                                        "segments")) for f in fs)
        assert held <= 4 * 1024 * 1024 + 1024 * 1024, held

        # S3 heals: offload catches up, local copies go, producers are served again.
        proxy.set_mode("pass")

        def resumed():
            assert sender.send(5) == 5
        eventually(resumed, timeout=120, interval=0.5)
        offload_and_wait(svc, topic)
        verify_clean(svc, topic)
        check_history(client, topic, sender)
        client.close()
    finally:
        proxy.stop()
