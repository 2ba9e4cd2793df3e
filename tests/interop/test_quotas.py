"""Publish rate limits and resource-group quotas (issue 17), measured with the official
client: Pulsar's throttling stops reading the producer's connection while a limit is in debt,
so a producer sending as fast as it can is acknowledged at the limit, nothing is refused or
lost, and the counts show in stats. Each rate is measured over 10 s after a 1 s warm-up and
must be within ±10 % of the limit."""
import threading
import time

import pulsar

from test_tenancy import call


def measure(svc, topic, seconds=10, size=100, warmup=1):
    """Sends `size`-byte messages to `topic` as fast as the service accepts them for
    `warmup + seconds`; acknowledged messages per second after the warm-up, and how many
    sends failed."""
    client = pulsar.Client(svc.url, operation_timeout_seconds=60)
    producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True,
                                      max_pending_messages=50, send_timeout_millis=0)
    acks, failed = [], []

    def done(res, _msg_id):
        (acks if res == pulsar.Result.Ok else failed).append(time.monotonic())

    payload = b"x" * size
    t0 = time.monotonic()
    start, end = t0 + warmup, t0 + warmup + seconds
    while time.monotonic() < end:
        producer.send_async(payload, done)
    producer.flush()
    client.close()
    return sum(1 for t in acks if start <= t < end) / seconds, len(failed)


def within(measured, limit, tolerance=0.10):
    return abs(measured - limit) <= tolerance * limit


def test_namespace_and_topic_publish_rates(fresh_service):
    svc = fresh_service
    svc.start()
    assert call(svc, "PUT", "/namespaces/public/rl")[0] == 204
    assert call(svc, "GET", "/namespaces/public/rl/publishRate") == (200, None)
    rate = {"publishThrottlingRateInMsg": 200, "publishThrottlingRateInByte": -1}
    assert call(svc, "POST", "/namespaces/public/rl/publishRate", rate)[0] == 204
    assert call(svc, "GET", "/namespaces/public/rl/publishRate") == (200, rate)

    msgs, failed = measure(svc, "persistent://public/rl/a")
    assert within(msgs, 200) and failed == 0, (msgs, failed)
    status, stats = call(svc, "GET", "/persistent/public/rl/a/stats")
    assert stats["publishRateLimitedTimes"] > 0, stats

    # A topic's own rate wins over its namespace's: 100 kB/s of 1 kB messages.
    topic_rate = {"publishThrottlingRateInMsg": -1, "publishThrottlingRateInByte": 100_000}
    assert call(svc, "POST", "/persistent/public/rl/b/publishRate", topic_rate)[0] == 204
    msgs, failed = measure(svc, "persistent://public/rl/b", size=1000)
    assert within(msgs * 1000, 100_000) and failed == 0, (msgs * 1000, failed)

    # Removing the limit applies to the live topic at once.
    assert call(svc, "DELETE", "/namespaces/public/rl/publishRate")[0] == 204
    msgs, failed = measure(svc, "persistent://public/rl/a", seconds=3)
    assert msgs > 2 * 200 and failed == 0, msgs
    assert call(svc, "POST", "/namespaces/public/rl/publishRate", "{bad")[0] == 400


def test_a_resource_group_caps_a_whole_tenant(fresh_service):
    svc = fresh_service
    svc.start()
    quota = {"publishRateInMsgs": 300, "publishRateInBytes": -1,
             "dispatchRateInMsgs": -1, "dispatchRateInBytes": -1}
    assert call(svc, "PUT", "/resourcegroups/team-quota", quota)[0] == 204
    assert call(svc, "GET", "/resourcegroups") == (200, ["team-quota"])
    assert call(svc, "GET", "/resourcegroups/team-quota") == (200, quota)
    assert call(svc, "PUT", "/tenants/team",
                {"adminRoles": [], "allowedClusters": ["standalone"]})[0] == 204
    for ns in ["team/n1", "team/n2"]:
        assert call(svc, "PUT", f"/namespaces/{ns}")[0] == 204
        assert call(svc, "POST", f"/namespaces/{ns}/resourcegroup/team-quota")[0] == 204
    assert call(svc, "GET", "/namespaces/team/n1/resourcegroup") == (200, "team-quota")
    assert call(svc, "POST", "/namespaces/team/n1/resourcegroup/nope")[0] == 404
    assert call(svc, "DELETE", "/resourcegroups/team-quota")[0] == 412

    # Two producers on two namespaces of the tenant share the quota; another tenant's producer
    # at the same time is not held back by it.
    results = {}

    def run(key, topic):
        results[key] = measure(svc, topic)

    threads = [threading.Thread(target=run, args=(k, t)) for k, t in [
        ("n1", "persistent://team/n1/x"), ("n2", "persistent://team/n2/y"),
        ("other", "persistent://public/default/neighbour")]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    team = results["n1"][0] + results["n2"][0]
    assert within(team, 300), results
    assert results["n1"][0] > 50 and results["n2"][0] > 50, results
    assert results["other"][0] > 2 * 300, results
    assert all(failed == 0 for _, failed in results.values()), results

    # Attached at tenant level instead, the quota also covers a namespace created afterwards
    # (a tenant admin cannot step outside it by making a new namespace).
    for ns in ["team/n1", "team/n2"]:
        assert call(svc, "DELETE", f"/namespaces/{ns}/resourcegroup")[0] == 204
    assert call(svc, "POST", "/tenants/team/resourcegroup/team-quota")[0] == 204
    assert call(svc, "GET", "/tenants/team/resourcegroup") == (200, "team-quota")
    assert call(svc, "PUT", "/namespaces/team/n3")[0] == 204
    msgs, failed = measure(svc, "persistent://team/n3/z", seconds=5)
    assert within(msgs, 300) and failed == 0, msgs
    assert call(svc, "DELETE", "/resourcegroups/team-quota")[0] == 412, "the tenant uses it"

    # Detached, the namespaces are free again; the group can then go.
    assert call(svc, "DELETE", "/tenants/team/resourcegroup")[0] == 204
    assert call(svc, "DELETE", "/resourcegroups/team-quota")[0] == 204
    msgs, _ = measure(svc, "persistent://team/n1/x", seconds=3)
    assert msgs > 2 * 300, msgs


def test_max_producers_per_topic(fresh_service):
    svc = fresh_service
    svc.start()
    assert call(svc, "POST", "/namespaces/public/default/maxProducersPerTopic", "2")[0] == 204
    assert call(svc, "GET", "/namespaces/public/default/maxProducersPerTopic") == (200, 2)
    assert call(svc, "POST", "/namespaces/public/default/maxProducersPerTopic", "x")[0] == 400
    client = pulsar.Client(svc.url, operation_timeout_seconds=10)
    topic = "persistent://public/default/limited"
    producers = [client.create_producer(topic) for _ in range(2)]
    try:
        client.create_producer(topic)
        raise AssertionError("a third producer was accepted")
    except pulsar.exceptions.ProducerBusy:
        pass
    # The topic's own limit wins, on the live topic; the connected producers keep working.
    assert call(svc, "POST", "/persistent/public/default/limited/maxProducers", "3")[0] == 204
    producers.append(client.create_producer(topic))
    for p in producers:
        p.send(b"still here")
    assert call(svc, "DELETE", "/persistent/public/default/limited/maxProducers")[0] == 204
    try:
        client.create_producer(topic)
        raise AssertionError("the namespace limit of 2 no longer applied")
    except pulsar.exceptions.ProducerBusy:
        pass
    assert call(svc, "DELETE", "/namespaces/public/default/maxProducersPerTopic")[0] == 204
    client.create_producer(topic).send(b"unlimited")
    client.close()


def consume_rate(svc, topic, sub, seconds=10, warmup=1):
    """Messages per second a consumer of `sub` (from the earliest) receives after `warmup`,
    over `seconds`, acknowledging everything."""
    return consume_rates(svc, topic, [sub], seconds, warmup)[sub]


def consume_rates(svc, topic, subs, seconds=10, warmup=1):
    """Messages per second each subscription of `subs` receives in one common window. Each
    consumer receives on a thread of its own (the client releases the GIL while it waits), so
    one consumer's wait for a message never delays counting the other's."""
    client = pulsar.Client(svc.url, operation_timeout_seconds=60)
    consumers = {s: client.subscribe(topic, s, consumer_type=pulsar.ConsumerType.Shared,
                                     initial_position=pulsar.InitialPosition.Earliest)
                 for s in subs}
    t0 = time.monotonic()
    start, end = t0 + warmup, t0 + warmup + seconds
    got = dict.fromkeys(subs, 0)

    def receive(s, c):
        while time.monotonic() < end:
            try:
                msg = c.receive(timeout_millis=50)
            except pulsar.Timeout:
                continue
            if start <= time.monotonic() < end:
                got[s] += 1
            c.acknowledge(msg)

    threads = [threading.Thread(target=receive, args=(s, c)) for s, c in consumers.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()
    return {s: n / seconds for s, n in got.items()}


def test_dispatch_rates_per_topic_and_subscription(fresh_service):
    svc = fresh_service
    svc.start()
    svc.create_namespace("public/dr")
    topic = "persistent://public/dr/a"
    client = pulsar.Client(svc.url, operation_timeout_seconds=60)
    producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
    for i in range(5000):
        producer.send_async(b"x" * 100, None)
    producer.flush()
    client.close()
    rate = {"dispatchThrottlingRateInMsg": 300, "dispatchThrottlingRateInByte": -1,
            "relativeToPublishRate": False, "ratePeriodInSecond": 1}
    assert call(svc, "POST", "/namespaces/public/dr/dispatchRate",
                dict(rate, relativeToPublishRate=True))[0] == 400
    assert call(svc, "POST", "/namespaces/public/dr/dispatchRate", rate)[0] == 204
    assert call(svc, "GET", "/namespaces/public/dr/dispatchRate") == (200, rate)

    # The topic's rate is shared by its subscriptions (measured in one window).
    results = consume_rates(svc, topic, ["s1", "s2"])
    assert within(results["s1"] + results["s2"], 300), results
    assert min(results.values()) > 50, results

    # A subscription's own rate, with the topic's lifted (a topic setting wins: 0 = unlimited).
    per_sub = dict(rate, dispatchThrottlingRateInMsg=150)
    assert call(svc, "POST", "/persistent/public/dr/a/dispatchRate",
                dict(rate, dispatchThrottlingRateInMsg=0))[0] == 204
    assert call(svc, "POST", "/persistent/public/dr/a/subscriptionDispatchRate", per_sub)[0] \
        == 204
    msgs = consume_rate(svc, topic, "s3")
    assert within(msgs, 150), msgs
    assert call(svc, "DELETE", "/persistent/public/dr/a/subscriptionDispatchRate")[0] == 204
    assert consume_rate(svc, topic, "s4", seconds=5, warmup=0) > 2 * 300

    # Bytes, with batches of many messages: the limit holds per entry, never per read.
    batched = "persistent://public/dr/b"
    client = pulsar.Client(svc.url, operation_timeout_seconds=60)
    producer = client.create_producer(batched, batching_enabled=True, batching_max_messages=50,
                                      batching_max_publish_delay_ms=50, block_if_queue_full=True)
    for i in range(20_000):
        producer.send_async(b"y" * 100, None)
    producer.flush()
    client.close()
    by_bytes = dict(rate, dispatchThrottlingRateInMsg=-1, dispatchThrottlingRateInByte=30_000)
    assert call(svc, "POST", "/persistent/public/dr/b/dispatchRate", by_bytes)[0] == 204
    payload = consume_rate(svc, batched, "s") * 100
    # Entries carry per-message metadata besides the payload: the payload rate is a bit lower.
    assert 0.75 * 30_000 <= payload <= 1.1 * 30_000, payload


def test_subscribe_rate_per_consumer(fresh_service):
    svc = fresh_service
    svc.start()
    svc.create_namespace("public/sr")
    topic = "persistent://public/sr/t"
    rate = {"subscribeThrottlingRatePerConsumer": 2, "ratePeriodInSecond": 30}
    assert call(svc, "POST", "/namespaces/public/sr/subscribeRate",
                dict(rate, ratePeriodInSecond=0))[0] == 400
    assert call(svc, "POST", "/namespaces/public/sr/subscribeRate", rate)[0] == 204
    assert call(svc, "GET", "/namespaces/public/sr/subscribeRate") == (200, rate)
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)

    def subscribe(sub, name):
        try:
            client.subscribe(topic, sub, consumer_name=name).close()
            return None
        except pulsar.PulsarException as e:
            return type(e).__name__
    assert subscribe("s1", "app-1") is None
    assert subscribe("s2", "app-1") is None
    assert subscribe("s3", "app-1") == "NotAllowedError"
    assert subscribe("s3", "app-2") is None, "another consumer has its own allowance"
    # A topic's own rate wins (0 = unlimited), applied at once.
    assert call(svc, "POST", "/persistent/public/sr/t/subscribeRate",
                dict(rate, subscribeThrottlingRatePerConsumer=0))[0] == 204
    assert subscribe("s4", "app-1") is None
    client.close()
