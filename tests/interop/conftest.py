"""Fixtures for interop tests: a real `ledgerlake serve` process per test module, driven by the
official Python client. Binds only 127.0.0.1; the process is stopped by PID."""
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pulsar
import pytest

from servers import Etcd, Postgres, S3Server


def eventually(check, timeout=60, interval=0.1):
    """Calls `check` until it passes, then returns what it returned; after `timeout` seconds
    its last AssertionError fails the test. `check` passes when it returns without raising
    AssertionError and does not return `False` (so `lambda: n >= 50` waits too)."""
    deadline = time.time() + timeout
    while True:
        try:
            result = check()
            if result is False:
                raise AssertionError(f"{getattr(check, '__name__', check)} stayed false")
            return result
        except AssertionError:
            if time.time() > deadline:
                raise
        time.sleep(interval)


class Sends:
    """The outcome of each `send_async`: `producer.send_async(payload, sends.callback(), ...)`,
    then `sends.check(producer, n)`. The producer must be created with
    `block_if_queue_full=True`: otherwise a full queue fails a send (ProducerQueueIsFull) and
    only its callback knows."""

    def __init__(self):
        self.results = []

    def callback(self):
        """A callback for the next send; it records (result, message id)."""
        i = len(self.results)
        self.results.append(None)

        def done(res, msg_id):
            self.results[i] = (res, msg_id)
        return done

    def check(self, producer, count, timeout=60):
        """Flushes `producer`, waits for every callback and asserts that all `count` sends were
        acknowledged; returns their message ids in send order."""
        producer.flush()

        def answered():
            missing = sum(1 for r in self.results if r is None)
            assert missing == 0, f"{missing} of {len(self.results)} sends not answered"
        eventually(answered, timeout)
        assert len(self.results) == count, (len(self.results), count)
        failed = [(i, r[0]) for i, r in enumerate(self.results) if r[0] != pulsar.Result.Ok]
        assert not failed, f"{len(failed)} of {count} sends failed, first: {failed[:5]}"
        return [r[1] for r in self.results]


# Ports handed out in this process: the kernel may offer a just-closed port again, so two
# listeners of one service (or of two) could otherwise be given the same one.
_GIVEN = set()


def _free_port():
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


class Service:
    def __init__(self, binary, data_dir, env=None, args=None):
        self.binary = binary
        self.env = dict(os.environ, **(env or {}))
        self.args = list(args or [])
        self.data_dir = data_dir
        self.proc = None
        self.log_path = os.path.join(data_dir, "serve.log")
        # Ports stay the same across restarts, so clients reconnect to the same URL.
        self.pulsar_port = _free_port()
        self.http_port = _free_port()
        self.pg_port = _free_port()
        self.url = f"pulsar://127.0.0.1:{self.pulsar_port}"
        self.http = f"http://127.0.0.1:{self.http_port}"

    def start(self):
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [self.binary, "serve", "--data-dir", os.path.join(self.data_dir, "data"),
             "--pulsar-addr", f"127.0.0.1:{self.pulsar_port}",
             "--http-addr", f"127.0.0.1:{self.http_port}",
             "--pg-addr", f"127.0.0.1:{self.pg_port}", *self.args],
            stdout=subprocess.DEVNULL, stderr=log, env=self.env)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/health/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("ledgerlake did not become ready:\n" + open(self.log_path).read())

    def create_namespace(self, namespace, token=None):
        """Creates `tenant/namespace` (and its tenant when missing) through the admin API."""
        tenant = namespace.split("/")[0]
        body = '{"adminRoles":[],"allowedClusters":["standalone"]}'
        for path, data, ok in [(f"/admin/v2/tenants/{tenant}", body, (204, 409)),
                               (f"/admin/v2/namespaces/{namespace}", "", (204,))]:
            req = urllib.request.Request(self.http + path, data=data.encode(), method="PUT",
                                         headers={"Content-Type": "application/json"})
            if token:
                req.add_header("Authorization", f"Bearer {token}")
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    status = r.status
            except urllib.error.HTTPError as e:
                status = e.code
            assert status in ok, (path, status)

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            self.proc.wait(timeout=30)
        code = self.proc.returncode if self.proc else 0
        self.proc = None
        return code


def _binary():
    binary = os.environ.get("LL_TEST_BIN")
    if not binary:
        pytest.fail("LL_TEST_BIN must point at the ledgerlake binary (tests/run.sh sets it)")
    return binary


def _own_service(env=None):
    """A service of its own (not shared with other tests), killed by PID at the end."""
    with tempfile.TemporaryDirectory() as d:
        svc = Service(_binary(), d, env=env)
        try:
            yield svc
        finally:
            svc.stop(signal.SIGKILL)


@pytest.fixture
def fresh_service():
    """A service of its own, for tests that stop and restart it."""
    yield from _own_service()


@pytest.fixture
def dedup_service():
    """A service of its own with broker deduplication on."""
    yield from _own_service({"LEDGERLAKE_BROKER__DEDUPLICATION": "true"})


@pytest.fixture
def auth_service():
    """A service of its own requiring token authentication (token 's3cret' → role 'app', a
    superuser)."""
    yield from _own_service({
        "LEDGERLAKE_BROKER__AUTHENTICATION__ENABLED": "true",
        "LEDGERLAKE_BROKER__AUTHENTICATION__TOKENS": '{s3cret="app"}',
        "LEDGERLAKE_BROKER__AUTHENTICATION__SUPERUSER_ROLES": '["app"]',
    })


@pytest.fixture(scope="module")
def service():
    binary = _binary()
    with tempfile.TemporaryDirectory() as d:
        svc = Service(binary, d)
        svc.start()
        try:
            yield svc
        finally:
            assert svc.stop() == 0, open(svc.log_path).read()


@pytest.fixture(scope="session")
def s3_server():
    """One SeaweedFS S3 server for the whole run (it uses fixed ports)."""
    server = S3Server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres():
    """One PostgreSQL server for the whole run; tests create their own databases."""
    server = Postgres()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def etcd():
    """An etcd member of the test's own (fresh data), stopped by PID at the end."""
    server = Etcd()
    try:
        yield server
    finally:
        server.stop()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Keeps each phase's report on the test item (fixtures print service logs on failure)."""
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def _print_log_on_failure(request, svc):
    rep = getattr(request.node, "rep_call", None)
    if rep is None or not rep.failed or not os.path.exists(svc.log_path):
        return
    lines = open(svc.log_path, errors="replace").read().splitlines()
    notable = [l for l in lines if " WARN " in l or " ERROR " in l or "panicked" in l]
    print(f"\n--- {svc.log_path}: warnings and errors ---")
    print("\n".join(notable[-60:]))
    print("--- last lines ---")
    print("\n".join(lines[-40:]))


@pytest.fixture
def make_service(request):
    """Factory of services of their own with extra environment; all killed by PID at the end
    (their logs' warnings are printed when the test failed)."""
    made = []
    dirs = []

    def make(env=None, args=None):
        d = tempfile.TemporaryDirectory()
        dirs.append(d)
        svc = Service(_binary(), d.name, env=env, args=args)
        made.append(svc)
        return svc

    try:
        yield make
    finally:
        for svc in made:
            svc.stop(signal.SIGKILL)
            _print_log_on_failure(request, svc)
        for d in dirs:
            d.cleanup()
