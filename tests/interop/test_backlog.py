"""Backlog quotas and message TTL (issue 17) with the official Python client, as Pulsar
behaves: `producer_request_hold` closes producers and refuses new ones with
ProducerBlockedQuotaExceededError until the backlog drains, while the client keeps its sends
and delivers them afterwards; `producer_exception` makes the client fail pending sends with
ProducerBlockedQuotaExceededException; `consumer_backlog_eviction` moves only the subscriptions
over the quota forward; a backlog offloaded to the lake still counts; message TTL expires old
messages. Quotas survive a SIGKILL."""
import signal
import threading
import time
import uuid

import pulsar

from conftest import eventually
from lake import offload_and_wait
from test_replay import FAST, set_policy, wait_all_deleted
from test_tenancy import call

KB = b"x" * 1000


def expect(condition, what):
    assert condition, what


def quota(size=-1, time_s=-1, policy="producer_request_hold"):
    return {"limitSize": size, "limitTime": time_s, "policy": policy}


def topic_stats(svc, ns, name):
    status, body = call(svc, "GET", f"/persistent/{ns}/{name}/stats")
    assert status == 200, body
    return body


def subscribe(client, topic, sub):
    return client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared,
                            initial_position=pulsar.InitialPosition.Earliest)


def fill(client, topic, n, prefix="m"):
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(n):
        producer.send(f"{prefix}-{i}:".encode() + KB)
    producer.close()


def drain(consumer, timeout_ms=2000):
    got = []
    while True:
        try:
            msg = consumer.receive(timeout_millis=timeout_ms)
        except pulsar.Timeout:
            return got
        got.append(msg.data().split(b":")[0].decode())
        consumer.acknowledge(msg)


def blocked_error(client, topic):
    """The exception creating a producer raises now (`None`: it was created)."""
    try:
        client.create_producer(topic).close()
        return None
    except pulsar.PulsarException as e:
        return type(e).__name__


def test_hold_then_drain_then_sends_go_through(make_service):
    svc = make_service()
    svc.start()
    svc.create_namespace("public/bq")
    topic = "persistent://public/bq/hold"
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    slow = subscribe(client, topic, "slow")
    producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=0)
    for i in range(30):
        producer.send(f"m-{i}:".encode() + KB)
    assert call(svc, "GET", "/namespaces/public/bq/backlogQuotaMap") == (200, {})
    assert call(svc, "POST", "/namespaces/public/bq/backlogQuota?backlogQuotaType=bogus",
                quota(20_000))[0] == 400
    assert call(svc, "POST", "/namespaces/public/bq/backlogQuota?backlogQuotaType="
                "destination_storage", quota(20_000))[0] == 204
    assert call(svc, "GET", "/namespaces/public/bq/backlogQuotaMap") == (
        200, {"destination_storage": quota(20_000)})
    assert call(svc, "POST", "/namespaces/public/bq/backlogQuota", quota(-1))[0] == 400
    _, doc = call(svc, "GET", "/namespaces/public/bq")
    assert doc["backlog_quota_map"] == {"destination_storage": quota(20_000)}, doc

    # Over the quota: new producers are refused with error 7 (the client would retry) ...
    eventually(lambda: expect(blocked_error(client, topic) == "ProducerBlockedQuotaExceededError",
                              "not blocked yet"), timeout=20)
    # ... and the connected one was closed: its sends wait in the client.
    done = []
    for i in range(30, 40):
        producer.send_async(f"m-{i}:".encode() + KB, lambda res, _id: done.append(res))
    time.sleep(3)
    assert done == [], done
    # Closed, so neither counted nor listed in the stats while the quota holds.
    stats = call(svc, "GET", "/persistent/public/bq/hold/stats")[1]
    assert (stats["producerCount"], stats["publishers"]) == (0, []), stats
    # The slow subscription catches up: the backlog drains and the held sends go through.
    got = drain(slow)
    assert got == [f"m-{i}" for i in range(30)], got[:5]
    eventually(lambda: expect(len(done) == 10, f"{len(done)} of 10 sends done"),
               timeout=60)
    assert set(done) == {pulsar.Result.Ok}, done
    got = drain(slow)
    assert sorted(set(got), key=lambda s: int(s.split("-")[1])) == [
        f"m-{i}" for i in range(30, 40)], got
    assert blocked_error(client, topic) is None
    client.close()


def test_exception_fails_pending_sends(fresh_service):
    svc = fresh_service
    svc.start()
    svc.create_namespace("public/bq")
    topic = "persistent://public/bq/exc"
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    subscribe(client, topic, "slow").close()
    producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=0)
    for i in range(20):
        producer.send(f"m-{i}:".encode() + KB)
    # A WaitForExclusive producer waits behind it; when the quota closes the producers it is
    # refused with the quota's error, not left waiting for a topic nobody holds.
    waiter = {}
    # Its own client, whose operation timeout outlasts the wait for the quota below.
    patient = pulsar.Client(svc.url, operation_timeout_seconds=120)

    def wait_for_exclusive():
        try:
            patient.create_producer(topic,
                                    access_mode=pulsar.ProducerAccessMode.WaitForExclusive)
            waiter["outcome"] = "created"
        except pulsar.PulsarException as e:
            waiter["outcome"] = type(e).__name__
    waiting = threading.Thread(target=wait_for_exclusive, daemon=True)
    waiting.start()
    time.sleep(1)
    assert not waiter, waiter
    assert call(svc, "POST", "/persistent/public/bq/exc/backlogQuota",
                quota(10_000, policy="producer_exception"))[0] == 204
    assert call(svc, "GET", "/persistent/public/bq/exc/backlogQuotaMap") == (
        200, {"destination_storage": quota(10_000, policy="producer_exception")})
    eventually(lambda: expect(
        blocked_error(client, topic) == "ProducerBlockedQuotaExceededException",
        "not blocked yet"), timeout=20)
    waiting.join(timeout=60)
    assert waiter == {"outcome": "ProducerBlockedQuotaExceededException"}, waiter
    patient.close()
    failed = []
    for i in range(5):
        producer.send_async(KB, lambda res, _id: failed.append(res))
    eventually(lambda: expect(len(failed) == 5, f"{failed}"), timeout=30)
    assert set(failed) == {pulsar.Result.ProducerBlockedQuotaExceededException}, failed
    # Removing the quota lets producers in at once (the change is applied before the answer).
    assert call(svc, "DELETE", "/persistent/public/bq/exc/backlogQuota")[0] == 204
    assert blocked_error(client, topic) is None
    client.close()


def test_eviction_moves_only_subscriptions_over_the_quota(fresh_service):
    svc = fresh_service
    svc.start()
    svc.create_namespace("public/bq")
    topic, name = "persistent://public/bq/evict", "evict"
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    # Closed: a connected consumer would still hand out what it prefetched (as with Pulsar).
    subscribe(client, topic, "slow").close()
    fast = subscribe(client, topic, "fast")
    mid = subscribe(client, topic, "mid")
    fill(client, topic, 100)
    assert len(drain(fast)) == 100
    mid_got = []
    for _ in range(95):
        msg = mid.receive(timeout_millis=10_000)
        mid_got.append(msg)
        mid.acknowledge(msg)
    mid.close()
    before = topic_stats(svc, "public/bq", name)["subscriptions"]
    assert before["mid"]["msgBacklog"] == 5, before["mid"]
    assert call(svc, "POST", "/namespaces/public/bq/backlogQuota", quota(
        20_000, policy="consumer_backlog_eviction"))[0] == 204

    def evicted():
        subs = topic_stats(svc, "public/bq", name)["subscriptions"]
        assert 0 < subs["slow"]["backlogSize"] <= 18_000 * 1.05, subs["slow"]
        return subs
    subs = eventually(evicted, timeout=20)
    top = topic_stats(svc, "public/bq", name)
    assert top["backlogQuotaLimitSize"] == 20_000 and top["backlogQuotaLimitTime"] == -1, top
    assert top["backlogSize"] == max(s["backlogSize"] for s in subs.values()), (top, subs)
    assert subs["mid"]["msgBacklog"] == 5, subs["mid"]
    assert subs["mid"]["markDeleteNext"] == before["mid"]["markDeleteNext"]
    assert subs["fast"]["msgBacklog"] == 0
    # The slow subscription now starts at the newest messages it kept, in order.
    got = drain(subscribe(client, topic, "slow"))
    assert 10 <= len(got) <= 20 and got == [f"m-{i}" for i in range(100 - len(got), 100)], got
    producer = client.create_producer(topic)  # eviction never blocks producers
    producer.close()
    client.close()


def test_offloaded_backlog_counts_and_quotas_survive_sigkill(make_service):
    svc = make_service(FAST)
    svc.start()
    set_policy(svc, "offloadDeletionLagMs", 0)
    name = f"lakebq-{uuid.uuid4().hex[:6]}"
    topic = f"persistent://public/default/{name}"
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    subscribe(client, topic, "slow").close()
    fill(client, topic, 600)
    assert offload_and_wait(svc, topic)["status"] == "SUCCESS"
    assert wait_all_deleted(svc, topic) >= 1
    slow = topic_stats(svc, "public/default", name)["subscriptions"]["slow"]
    assert slow["backlogSize"] >= 600_000 and slow["nextReadTier"] == "lake", slow
    assert call(svc, "POST", "/persistent/public/default/" + name + "/backlogQuota",
                quota(100_000))[0] == 204
    eventually(lambda: expect(blocked_error(client, topic) == "ProducerBlockedQuotaExceededError",
                              "not blocked yet"), timeout=20)
    client.close()
    svc.stop(signal.SIGKILL)
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    assert call(svc, "GET", "/persistent/public/default/" + name + "/backlogQuotaMap") == (
        200, {"destination_storage": quota(100_000)})
    # Loaded again, the topic is checked at the next policy tick.
    subscribe(client, topic, "other").close()
    eventually(lambda: expect(blocked_error(client, topic) == "ProducerBlockedQuotaExceededError",
                              "not blocked after restart"), timeout=20)
    # Eviction works on a backlog in the lake: switch the policy, the slow subscription moves.
    assert call(svc, "POST", "/persistent/public/default/" + name + "/backlogQuota",
                quota(100_000, policy="consumer_backlog_eviction"))[0] == 204

    def evicted():
        slow = topic_stats(svc, "public/default", name)["subscriptions"]["slow"]
        assert 0 < slow["backlogSize"] <= 90_000 * 1.05, slow
    eventually(evicted, timeout=20)
    consumer = subscribe(client, topic, "slow")
    got = drain(consumer)
    assert got == [f"m-{i}" for i in range(600 - len(got), 600)], got[:3]
    client.close()


def test_message_age_quota_and_ttl(fresh_service):
    svc = fresh_service
    svc.start()
    svc.create_namespace("public/ttl")
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    # message_age with hold: old unacknowledged messages block producers.
    aged = "persistent://public/ttl/aged"
    subscribe(client, aged, "slow").close()
    fill(client, aged, 3)
    assert call(svc, "POST", "/persistent/public/ttl/aged/backlogQuota?backlogQuotaType="
                "message_age", quota(time_s=2))[0] == 204
    eventually(lambda: expect(blocked_error(client, aged) == "ProducerBlockedQuotaExceededError",
                              "not blocked yet"), timeout=20)
    # Message TTL: messages older than it expire from every subscription.
    assert call(svc, "GET", "/namespaces/public/ttl/messageTTL") == (200, None)
    assert call(svc, "POST", "/namespaces/public/ttl/messageTTL", "-5")[0] == 412
    assert call(svc, "POST", "/namespaces/public/ttl/messageTTL", "2")[0] == 204
    assert call(svc, "GET", "/namespaces/public/ttl/messageTTL") == (200, 2)
    eventually(lambda: expect(blocked_error(client, aged) is None, "TTL did not unblock"),
               timeout=20)
    topic = "persistent://public/ttl/t"
    consumer = subscribe(client, topic, "s")
    consumer.close()
    fill(client, topic, 10, prefix="old")

    def expired():
        s = topic_stats(svc, "public/ttl", "t")["subscriptions"]["s"]
        assert s["msgBacklog"] == 0, s
    eventually(expired, timeout=20)
    fill(client, topic, 3, prefix="new")
    consumer = subscribe(client, topic, "s")
    assert drain(consumer) == ["new-0", "new-1", "new-2"]
    # A topic's TTL wins over its namespace's (0: never expire).
    assert call(svc, "POST", "/persistent/public/ttl/t/messageTTL?messageTTL=0")[0] == 204
    assert call(svc, "GET", "/persistent/public/ttl/t/messageTTL") == (200, 0)
    consumer.close()
    fill(client, topic, 2, prefix="kept")
    time.sleep(4)
    consumer = subscribe(client, topic, "s")
    assert drain(consumer) == ["kept-0", "kept-1"]
    client.close()
