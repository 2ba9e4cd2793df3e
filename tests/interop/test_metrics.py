"""GET /metrics (issue 18) scraped while the official Python client produces and consumes, and
parsed with Prometheus's own text parser: Pulsar's family names and labels, ledgerlake's node
families, topic-level series switched off, and the two early warnings (lag spiral, hot
partition) in metrics, stats and the log."""
import time
import urllib.request

import pulsar
from prometheus_client.parser import text_string_to_metric_families

from conftest import eventually
from test_sql import sql_http
from test_tenancy import call

FAST = {
    "LEDGERLAKE_METRICS__RATE_WINDOW": "4s",
    "LEDGERLAKE_METRICS__LAG_WINDOW": "2s",
    "LEDGERLAKE_METRICS__HOT_MIN_RATE": "5",
}


def scrape(svc):
    """{family name: [(labels, value)]} and {family name: type} of one scrape."""
    with urllib.request.urlopen(f"{svc.http}/metrics", timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    values, types = {}, {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            values.setdefault(s.name, []).append((s.labels, s.value))
    return values, types


def value(values, name, **labels):
    found = [v for (l, v) in values.get(name, []) if all(l.get(k) == x for k, x in labels.items())]
    assert len(found) == 1, (name, labels, values.get(name))
    return found[0]


def test_metrics_show_pulsar_and_ledgerlake_families(make_service):
    # A long rate window: the rates asserted below still cover the traffic after the SQL
    # queries and scrapes in between, however slow the machine.
    svc = make_service(env={**FAST, "LEDGERLAKE_METRICS__RATE_WINDOW": "10m"})
    svc.start()
    topic = "persistent://public/default/metered"
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    consumer = client.subscribe(topic, "reader", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(200):
        producer.send(b"x" * 100)
    for _ in range(100):
        consumer.acknowledge(consumer.receive(timeout_millis=10_000))
    assert sql_http(svc, 'SELECT count(*) FROM "metered"')[0] == 200
    assert sql_http(svc, "SELECT nonsense FROM nowhere")[0] == 404

    def scraped():
        values, types = scrape(svc)
        t = {"cluster": "standalone", "namespace": "public/default", "topic": topic}
        assert value(values, "pulsar_in_messages_total", **t) == 200
        assert value(values, "pulsar_in_bytes_total", **t) >= 200 * 100
        assert value(values, "pulsar_subscription_back_log", subscription="reader", **t) == 100
        assert value(values, "pulsar_msg_backlog", **t) == 100
        return values, types, t

    values, types, t = eventually(scraped, timeout=15)
    assert all(types[n] == "gauge" for n in types if n.startswith("pulsar_")), types
    assert value(values, "pulsar_rate_in", **t) > 0
    assert value(values, "pulsar_throughput_in", **t) > 0
    assert value(values, "pulsar_producers_count", **t) == 1
    assert value(values, "pulsar_consumers_count", **t) == 1
    assert value(values, "pulsar_subscriptions_count", **t) == 1
    assert value(values, "pulsar_storage_size", **t) >= 200 * 100
    assert value(values, "pulsar_storage_backlog_size", **t) > 0
    assert value(values, "pulsar_storage_backlog_quota_limit", **t) == -1
    assert value(values, "pulsar_out_messages_total", **t) >= 100
    assert value(values, "pulsar_subscription_msg_rate_out", subscription="reader", **t) > 0
    assert value(values, "pulsar_subscription_msg_ack_rate", subscription="reader", **t) > 0
    assert value(values, "pulsar_subscription_unacked_messages", subscription="reader",
                 **t) <= 100
    assert value(values, "pulsar_subscription_blocked_on_unacked_messages",
                 subscription="reader", **t) == 0
    # Pulsar's latency buckets: every append in exactly one bucket.
    buckets = ["0_5", "1", "5", "10", "20", "50", "100", "200", "1000", "overflow"]
    counted = sum(value(values, f"pulsar_storage_write_latency_le_{b}", **t) for b in buckets)
    assert counted == value(values, "pulsar_storage_write_latency_count", **t) == 200
    sizes = ["128", "512", "1_kb", "2_kb", "4_kb", "16_kb", "100_kb", "1_mb", "overflow"]
    assert sum(value(values, f"pulsar_entry_size_le_{b}", **t) for b in sizes) == 200
    assert value(values, "pulsar_topics_count", cluster="standalone",
                 namespace="public/default") >= 1
    assert value(values, "ledgerlake_offload_lag_bytes", **t) > 0
    # ledgerlake's node families.
    assert value(values, "ledgerlake_journal_fsync_seconds_count") > 0
    assert value(values, "ledgerlake_journal_group_commit_batches_count") > 0
    assert value(values, "ledgerlake_replay_entries_total", tier="local") >= 100
    assert value(values, "ledgerlake_sql_queries_total", outcome="ok") == 1
    assert value(values, "ledgerlake_sql_queries_total", outcome="error") == 1
    assert value(values, "ledgerlake_sql_query_seconds_count", outcome="ok") == 1
    assert 0 < value(values, "ledgerlake_data_dir_available_bytes") \
        <= value(values, "ledgerlake_data_dir_size_bytes")
    # The same figures in the admin stats, with Pulsar's field names.
    _, stats = call(svc, "GET", "/persistent/public/default/metered/stats")
    assert stats["msgInCounter"] == 200 and stats["msgRateIn"] > 0, stats
    assert stats["subscriptions"]["reader"]["msgBacklog"] == 100
    assert stats["subscriptions"]["reader"]["msgRateOut"] > 0
    producer.close()
    consumer.close()
    client.close()


def test_topic_level_series_can_be_switched_off(make_service):
    svc = make_service(env={"LEDGERLAKE_METRICS__EXPOSE_TOPIC_LEVEL": "false"})
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    for name in ("a", "b"):
        p = client.create_producer(f"persistent://public/default/{name}", batching_enabled=False)
        for _ in range(10):
            p.send(b"m")
        p.close()
    values, _ = scrape(svc)
    assert not any("topic" in labels for samples in values.values() for labels, _ in samples)
    ns = {"cluster": "standalone", "namespace": "public/default"}
    assert value(values, "pulsar_in_messages_total", **ns) == 20
    assert value(values, "pulsar_topics_count", **ns) == 2
    client.close()


def test_lag_spiral_is_flagged_and_clears(make_service):
    svc = make_service(env=FAST)
    svc.start()
    topic = "persistent://public/default/spiral"
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    consumer = client.subscribe(topic, "slow", receiver_queue_size=10)
    producer = client.create_producer(topic, batching_enabled=False)
    t = {"topic": topic, "subscription": "slow"}

    def flagged():
        # A producer outpaces a consumer that never acknowledges.
        for _ in range(20):
            producer.send_async(b"p", None)
        time.sleep(0.2)
        values, _ = scrape(svc)
        assert value(values, "ledgerlake_subscription_lag_growing", **t) == 1
        return values

    values = eventually(flagged, timeout=30, interval=0)
    assert value(values, "pulsar_subscription_back_log", **t) > 0
    _, stats = call(svc, "GET", "/persistent/public/default/spiral/stats")
    sub = stats["subscriptions"]["slow"]
    assert sub["lagGrowing"] is True, sub
    assert sub["nextReadTier"] == "local", sub
    producer.flush()
    # The consumer catches up: the backlog drains and the flag clears.
    while True:
        try:
            consumer.acknowledge(consumer.receive(timeout_millis=2000))
        except pulsar.Timeout:
            break

    def cleared():
        values, _ = scrape(svc)
        assert value(values, "ledgerlake_subscription_lag_growing", **t) == 0
        assert value(values, "pulsar_subscription_back_log", **t) == 0

    eventually(cleared, timeout=20)
    log = open(svc.log_path).read()
    assert "lag spiral" in log and "spiral" in log, log[-2000:]
    client.close()


def route_by_key(msg, partitions):
    return int(msg.partition_key()) % partitions


def test_hot_partition_is_flagged_and_more_partitions_spread_new_traffic(make_service):
    svc = make_service(env=FAST)
    svc.start()
    base = "persistent://public/default/skewed"
    assert call(svc, "PUT", "/persistent/public/default/skewed/partitions", "4")[0] == 204
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    producer = client.create_producer(base, batching_enabled=False, message_router=route_by_key,
                                      block_if_queue_full=True)
    # 90 % of the traffic on keys 1 and 5: both on partition 1 of 4, apart on 8 partitions.
    keys = ["1", "5"] * 9 + ["2", "3"]

    def send_round():
        for i in range(100):
            producer.send_async(b"v", None, partition_key=keys[i % len(keys)])
        producer.flush()

    def hot_flagged():
        send_round()
        _, stats = call(svc, "GET", "/persistent/public/default/skewed/stats")
        assert stats["hotPartitions"] == [f"{base}-partition-1"], stats["partitionShares"]
        return stats

    stats = eventually(hot_flagged, timeout=30, interval=0.1)
    hot = stats["partitionShares"][f"{base}-partition-1"]
    assert hot["inRateShare"] > 0.8, hot
    values, _ = scrape(svc)
    assert value(values, "ledgerlake_partition_hot", topic=f"{base}-partition-1") == 1
    assert value(values, "ledgerlake_partition_hot", topic=f"{base}-partition-0") == 0
    assert "hot partition" in open(svc.log_path).read()
    # The fix: more partitions on the live topic. The producer discovers them by itself
    # (the client looks the partition count up again every 60 s).
    assert call(svc, "POST", "/persistent/public/default/skewed/partitions", "8")[0] == 204

    def spread():
        send_round()
        time.sleep(0.5)
        _, stats = call(svc, "GET", "/persistent/public/default/skewed/stats")
        parts = stats["partitionShares"]
        assert parts.get(f"{base}-partition-5", {}).get("msgInCounter", 0) > 0, parts
        return stats

    eventually(spread, timeout=120, interval=0)

    def shares_fell():
        send_round()
        _, stats = call(svc, "GET", "/persistent/public/default/skewed/stats")
        shares = {n: p["inRateShare"] for n, p in stats["partitionShares"].items()}
        assert max(shares.values()) < 0.6, shares
        assert shares[f"{base}-partition-5"] > 0.3, shares

    eventually(shares_fell, timeout=30, interval=0)
    producer.close()
    client.close()


def test_hot_key_shared_consumer_is_flagged(make_service):
    svc = make_service(env=FAST)
    svc.start()
    topic = "persistent://public/default/ks-skew"
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    consumers = [client.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared,
                                  consumer_name=f"c{i}", receiver_queue_size=5000)
                 for i in range(2)]
    producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)

    def flagged():
        # 90 % of the traffic on one key: one consumer's hash range carries it.
        for i in range(100):
            producer.send_async(b"v", None, partition_key="hot" if i % 10 else f"k{i}")
        producer.flush()
        values, _ = scrape(svc)
        assert value(values, "ledgerlake_subscription_hot_consumers", topic=topic,
                     subscription="ks") == 1
        _, stats = call(svc, "GET", "/persistent/public/default/ks-skew/stats")
        return stats

    stats = eventually(flagged, timeout=30, interval=0.2)
    assert stats["subscriptions"]["ks"]["hotConsumers"] == 1, stats["subscriptions"]
    assert "hot Key_Shared consumer" in open(svc.log_path).read()
    for c in consumers:
        c.close()
    producer.close()
    client.close()


def test_the_stats_tick_samples_topics_that_changed_until_they_are_quiet(make_service):
    """Idle loaded topics cost the stats tick nothing (issue 22): a topic is sampled from its
    first change until its rates are back at zero, then no more until it changes again."""
    svc = make_service(env=FAST)
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    topics = [f"persistent://public/default/watched-{i}" for i in range(30)]
    producers = [client.create_producer(t, batching_enabled=False) for t in topics]
    for p in producers:
        for _ in range(5):
            p.send(b"x" * 10)

    def watched():
        values, _ = scrape(svc)
        return (value(values, "ledgerlake_topics_loaded"),
                value(values, "ledgerlake_topics_watched"))

    def all_watched():
        loaded, n = watched()
        assert loaded >= 30 and n >= 30, (loaded, n)

    eventually(all_watched, timeout=15, interval=0.2)

    def all_quiet():
        loaded, n = watched()
        assert loaded >= 30 and n == 0, (loaded, n)

    # Producers stay connected (the topics stay loaded) but send nothing.
    eventually(all_quiet, timeout=30, interval=0.5)
    _, stats = call(svc, "GET", "/persistent/public/default/watched-3/stats")
    assert stats["msgRateIn"] == 0 and stats["msgInCounter"] == 5, stats
    producers[3].send(b"again")

    def one_again():
        values, _ = scrape(svc)
        assert value(values, "ledgerlake_topics_watched") == 1
        assert value(values, "pulsar_rate_in", topic=topics[3]) > 0

    eventually(one_again, timeout=15, interval=0.2)
    eventually(all_quiet, timeout=30, interval=0.5)
    client.close()


def test_producer_and_consumer_rates_in_stats_cover_the_last_window(make_service):
    """A producer's and a consumer's rates in topic stats, read once they have been attached
    longer than the rate window: each covers the traffic of the last window (a sample taken
    only when stats are read would be the only one within the window, and the rate read 0)."""
    svc = make_service(env={**FAST, "LEDGERLAKE_METRICS__RATE_WINDOW": "2s"})
    svc.start()
    topic = "persistent://public/default/rated"
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    # Exclusive: no Key_Shared check looks at this consumer's rate.
    consumer = client.subscribe(topic, "s")
    producer = client.create_producer(topic, batching_enabled=False)
    time.sleep(3)  # attached longer than the window before any traffic
    sent, until = 0, time.time() + 3
    while time.time() < until:
        producer.send(b"x" * 100)
        consumer.acknowledge(consumer.receive(timeout_millis=10_000))
        sent += 1
    stats = call(svc, "GET", "/persistent/public/default/rated/stats")[1]
    [p] = stats["publishers"]
    [c] = stats["subscriptions"]["s"]["consumers"]
    # Sampled with the topic: the same window, so the same rate (a producer's meter that only
    # had its first sample would read the average since it registered, about half of it).
    assert p["msgInCounter"] == sent and p["msgRateIn"] > 0, p
    assert abs(p["msgRateIn"] - stats["msgRateIn"]) <= 0.2 * stats["msgRateIn"], (p, stats)
    assert c["msgOutCounter"] == sent and c["msgRateOut"] > 0, c
    producer.close()
    consumer.close()
    client.close()
