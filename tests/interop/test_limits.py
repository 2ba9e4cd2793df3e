"""Consumer, unacked-message and topic-count limits (issue 17) with the official Python client:
refusals use Pulsar's errors, Shared dispatch pauses at the unacked limit and resumes at half,
and every limit applies to live topics without restart."""
import pulsar

from conftest import eventually
from test_tenancy import call


def error_name(action):
    try:
        action()
        return None
    except pulsar.PulsarException as e:
        return type(e).__name__


def expect_subscribe(client, topic, sub):
    try:
        return client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared)
    except pulsar.ConsumerBusy as e:
        raise AssertionError(str(e))


def receive_all(consumer, timeout_ms=1500):
    got = []
    while True:
        try:
            got.append(consumer.receive(timeout_millis=timeout_ms))
        except pulsar.Timeout:
            return got


def test_consumer_limits_per_topic_and_subscription(fresh_service):
    svc = fresh_service
    svc.start()
    svc.create_namespace("public/lim")
    topic = "persistent://public/lim/c"
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    assert call(svc, "GET", "/namespaces/public/lim/maxConsumersPerTopic") == (200, None)
    assert call(svc, "POST", "/namespaces/public/lim/maxConsumersPerTopic", "x")[0] == 400
    assert call(svc, "POST", "/namespaces/public/lim/maxConsumersPerTopic", "2")[0] == 204
    assert call(svc, "GET", "/namespaces/public/lim/maxConsumersPerTopic") == (200, 2)
    shared = pulsar.ConsumerType.Shared
    a = client.subscribe(topic, "s1", consumer_type=shared)
    b = client.subscribe(topic, "s2", consumer_type=shared)
    assert error_name(lambda: client.subscribe(topic, "s3", consumer_type=shared)) \
        == "ConsumerBusy"
    subs = call(svc, "GET", "/persistent/public/lim/c/stats")[1]["subscriptions"]
    assert sorted(subs) == ["s1", "s2"], "a refused consumer left no subscription behind"
    b.close()
    # The broker answers CLOSE_CONSUMER before the subscription has let the consumer go.
    b = eventually(lambda: expect_subscribe(client, topic, "s3"), timeout=10)
    # A topic's own limit wins: per subscription, 1.
    assert call(svc, "POST", "/persistent/public/lim/c/maxConsumers", "10")[0] == 204
    assert call(svc, "POST", "/persistent/public/lim/c/maxConsumersPerSubscription",
                "1")[0] == 204
    assert call(svc, "GET", "/persistent/public/lim/c/maxConsumersPerSubscription") == (200, 1)
    assert error_name(lambda: client.subscribe(topic, "s1", consumer_type=shared)) \
        == "ConsumerBusy"
    c = client.subscribe(topic, "s4", consumer_type=shared)
    assert call(svc, "DELETE", "/persistent/public/lim/c/maxConsumersPerSubscription")[0] == 204
    d = client.subscribe(topic, "s1", consumer_type=shared)
    _, doc = call(svc, "GET", "/namespaces/public/lim")
    assert doc["max_consumers_per_topic"] == 2, doc
    for x in (a, b, c, d):
        x.close()
    client.close()


def test_shared_dispatch_pauses_at_the_unacked_limit(fresh_service):
    svc = fresh_service
    svc.start()
    svc.create_namespace("public/lim")
    topic = "persistent://public/lim/u"
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    assert call(svc, "POST", "/persistent/public/lim/u/maxUnackedMessagesOnConsumer",
                "10")[0] == 204
    a = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                         receiver_queue_size=100)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(50):
        producer.send(f"m-{i}".encode())
    held = receive_all(a)
    assert len(held) == 10, len(held)
    sub = call(svc, "GET", "/persistent/public/lim/u/stats")[1]["subscriptions"]["s"]
    assert sub["unackedMessages"] == 10 and sub["blockedConsumersOnUnackedMsgs"] == 1, sub
    # Acknowledging 4 leaves 6, over half: still paused. The fifth reopens it.
    for m in held[:4]:
        a.acknowledge(m)
    assert receive_all(a, 1000) == []
    a.acknowledge(held[4])
    more = receive_all(a)
    assert len(more) == 5, len(more)
    # Another consumer of the subscription takes what the first may not.
    b = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    rest = receive_all(b)
    assert len(rest) == 10, len(rest)
    # The subscription-wide limit: 25 out at most, whatever the consumers' own.
    assert call(svc, "POST", "/persistent/public/lim/u/maxUnackedMessagesOnConsumer",
                "0")[0] == 204
    assert call(svc, "POST", "/persistent/public/lim/u/maxUnackedMessagesOnSubscription",
                "25")[0] == 204
    c = client.subscribe(topic, "t", consumer_type=pulsar.ConsumerType.Shared,
                         initial_position=pulsar.InitialPosition.Earliest)
    first = receive_all(c)
    assert len(first) == 25, len(first)
    sub = call(svc, "GET", "/persistent/public/lim/u/stats")[1]["subscriptions"]["t"]
    assert sub["blockedSubscriptionOnUnackedMsgs"] is True and sub["unackedMessages"] == 25, sub
    # 13 acknowledged bring it to 12, half of 25: dispatch resumes up to 25 again.
    for m in first[:12]:
        c.acknowledge(m)
    assert receive_all(c, 1000) == []
    c.acknowledge(first[12])
    second = receive_all(c)
    assert len(second) == 13, len(second)
    for m in first[13:] + second:
        c.acknowledge(m)
    last = receive_all(c)
    assert [m.data().decode() for m in first + second + last] == [f"m-{i}" for i in range(50)]
    client.close()


def test_max_topics_per_namespace(fresh_service):
    svc = fresh_service
    svc.start()
    svc.create_namespace("public/few")
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    assert call(svc, "POST", "/namespaces/public/few/maxTopicsPerNamespace", "3")[0] == 204
    client.create_producer("persistent://public/few/a").close()
    assert call(svc, "PUT", "/persistent/public/few/p/partitions", "3")[0] == 412
    assert call(svc, "PUT", "/persistent/public/few/p/partitions", "2")[0] == 204
    assert error_name(lambda: client.create_producer("persistent://public/few/b")) \
        == "NotAllowedError"
    # Existing topics and partitions are still served.
    client.create_producer("persistent://public/few/a").close()
    client.create_producer("persistent://public/few/p").close()
    assert call(svc, "DELETE", "/namespaces/public/few/maxTopicsPerNamespace")[0] == 204
    client.create_producer("persistent://public/few/b").close()
    client.close()


def test_every_policy_survives_sigkill(fresh_service):
    import signal
    svc = fresh_service
    svc.start()
    svc.create_namespace("public/keep")
    ns, topic = "/namespaces/public/keep", "/persistent/public/keep/t"
    dispatch = {"dispatchThrottlingRateInMsg": 100, "dispatchThrottlingRateInByte": -1,
                "relativeToPublishRate": False, "ratePeriodInSecond": 1}
    policies = [
        (f"{ns}/publishRate", {"publishThrottlingRateInMsg": 10, "publishThrottlingRateInByte": -1}),
        (f"{ns}/dispatchRate", dispatch),
        (f"{topic}/subscriptionDispatchRate", dispatch),
        (f"{ns}/subscribeRate", {"subscribeThrottlingRatePerConsumer": 5, "ratePeriodInSecond": 30}),
        (f"{ns}/maxProducersPerTopic", 3), (f"{topic}/maxConsumers", 4),
        (f"{ns}/maxConsumersPerSubscription", 2), (f"{topic}/maxUnackedMessagesOnConsumer", 7),
        (f"{ns}/maxUnackedMessagesPerSubscription", 70), (f"{ns}/maxTopicsPerNamespace", 9),
        (f"{ns}/messageTTL", 3600),
    ]
    for path, value in policies:
        body = value if isinstance(value, dict) else str(value)
        assert call(svc, "POST", path, body)[0] == 204, path
    quota = {"limitSize": 1 << 30, "limitTime": -1, "policy": "producer_exception"}
    assert call(svc, "POST", f"{ns}/backlogQuota", quota)[0] == 204
    svc.stop(signal.SIGKILL)
    svc.start()
    for path, value in policies:
        assert call(svc, "GET", path) == (200, value), path
    assert call(svc, "GET", f"{ns}/backlogQuotaMap") == (200, {"destination_storage": quota})
