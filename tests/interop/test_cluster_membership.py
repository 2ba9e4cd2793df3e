"""Membership (issue 19, slice 2's first part): every node registers itself under its etcd
session; `GET /admin/v2/brokers/{cluster}` on any node lists the live ones, as Pulsar's
getActiveBrokers. A killed node drops out when its lease runs out; a stopped one at once."""
import json
import signal
import time
import urllib.error
import urllib.request

from conftest import eventually


def _brokers(svc, cluster="standalone"):
    try:
        with urllib.request.urlopen(f"{svc.http}/admin/v2/brokers/{cluster}", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _id(svc):
    return f"127.0.0.1:{svc.http_port}"


def test_a_single_node_lists_itself(service):
    assert _brokers(service) == (200, [_id(service)])
    status, _ = _brokers(service, "elsewhere")
    assert status == 404


def test_nodes_on_one_etcd_see_each_other_and_leave(etcd, make_service):
    env = {"LEDGERLAKE_METADATA__SESSION_TTL": "3s"}
    url = etcd.url("/members")
    a = make_service(env=env, args=["--metadata-url", url])
    b = make_service(env=env, args=["--metadata-url", url])
    a.start()
    b.start()
    both = sorted([_id(a), _id(b)])
    for svc in (a, b):
        status, ids = _brokers(svc)
        assert status == 200 and sorted(ids) == both, ids

    # A killed node renews nothing: it drops out once its lease (3 s) runs out.
    a.stop(signal.SIGKILL)
    killed = time.monotonic()

    def only_b():
        assert _brokers(b) == (200, [_id(b)])
    eventually(only_b, timeout=10)
    assert time.monotonic() - killed < 8

    # Restarted, it waits out its own stale registration if needed, then joins again.
    a.start()
    for svc in (a, b):
        def both_listed(svc=svc):
            status, ids = _brokers(svc)
            assert status == 200 and sorted(ids) == both, ids
        eventually(both_listed, timeout=10)

    # A graceful stop ends the session: gone at once, not after the lease.
    assert b.stop(signal.SIGTERM) == 0
    stopped = time.monotonic()

    def only_a():
        assert _brokers(a) == (200, [_id(a)])
    eventually(only_a, timeout=10)
    assert time.monotonic() - stopped < 2, "the registration outlived a graceful stop"
