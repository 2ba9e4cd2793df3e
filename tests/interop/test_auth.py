"""Token authentication on CONNECT with the official client's AuthenticationToken."""
import pulsar
import pytest


def test_token_authentication(auth_service):
    svc = auth_service
    svc.start()
    good = pulsar.Client(svc.url, authentication=pulsar.AuthenticationToken("s3cret"),
                         operation_timeout_seconds=10)
    producer = good.create_producer("persistent://public/default/auth")
    producer.send(b"hello")
    good.close()

    for auth in (pulsar.AuthenticationToken("wrong"), None):
        bad = pulsar.Client(svc.url, authentication=auth, operation_timeout_seconds=3)
        with pytest.raises(Exception):
            bad.create_producer("persistent://public/default/auth")
        bad.close()
