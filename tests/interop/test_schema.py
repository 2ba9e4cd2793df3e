"""Schemas carried on PRODUCER/SUBSCRIBE: stored with versions, BACKWARD-checked, echoed in
messages; typed values round-trip through the official client's JSON and Avro schemas."""
import uuid

import pulsar
import pytest
from pulsar.schema import AvroSchema, Integer, JsonSchema, Record, String


class User(Record):
    name = String()
    age = Integer()


class UserV2(Record):
    name = String()
    age = Integer()
    email = String(required_default=True)


class UserBroken(Record):
    name = String()
    age = String()


@pytest.mark.parametrize("schema_type", [JsonSchema, AvroSchema])
def test_typed_round_trip_and_evolution(service, schema_type):
    client = pulsar.Client(service.url, operation_timeout_seconds=15)
    topic = f"persistent://public/default/schema-{uuid.uuid4().hex[:8]}"
    producer = client.create_producer(topic, schema=schema_type(User))
    consumer = client.subscribe(topic, "s", schema=schema_type(User),
                                initial_position=pulsar.InitialPosition.Earliest)
    producer.send(User(name="ada", age=36))
    m = consumer.receive(timeout_millis=5000)
    assert (m.value().name, m.value().age) == ("ada", 36)
    first_version = m.schema_version()

    # A compatible change (optional field with a default) registers the next version.
    v2 = client.create_producer(topic, schema=schema_type(UserV2))
    v2.send(UserV2(name="bob", age=7, email="b@example.org"))
    m2 = consumer.receive(timeout_millis=5000)
    assert m2.schema_version() != first_version

    # An incompatible change is refused.
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=schema_type(UserBroken))
    client.close()
