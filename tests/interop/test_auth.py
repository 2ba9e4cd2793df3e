"""Token authentication on CONNECT with the official client's AuthenticationToken."""
import pulsar
import pytest

from rawpulsar import CONNECT, CONNECTED, ERROR, RawPulsar, connect_body

AUTHENTICATION_ERROR = 3  # ServerError


def connect_reply(svc, token):
    """The broker's answer to a CONNECT with `token` (None: no credentials), on a raw socket:
    (command type, ServerError of an ERROR or None)."""
    conn = RawPulsar(svc.pulsar_port, connect=False, timeout=10)
    try:
        conn.send(CONNECT, connect_body("ll-interop", token, version=21))
        kind, fields = conn.read()
    finally:
        conn.close()
    return kind, (fields.get(2, [None])[0] if kind == ERROR else None)


def test_token_authentication(auth_service):
    svc = auth_service
    svc.start()
    good = pulsar.Client(svc.url, authentication=pulsar.AuthenticationToken("s3cret"),
                         operation_timeout_seconds=10)
    producer = good.create_producer("persistent://public/default/auth")
    producer.send(b"hello")
    good.close()

    for auth in (pulsar.AuthenticationToken("wrong"), None):
        # The C++ client retries a refused CONNECT until its operation timeout instead of
        # reporting AuthenticationError (apache/pulsar-client-cpp#227): kept short here.
        bad = pulsar.Client(svc.url, authentication=auth, operation_timeout_seconds=3)
        with pytest.raises(pulsar.Timeout):
            bad.create_producer("persistent://public/default/auth")
        bad.close()

    # That is a refusal, not a hang: the broker answers CONNECT with AuthenticationError.
    assert connect_reply(svc, "wrong") == (ERROR, AUTHENTICATION_ERROR)
    assert connect_reply(svc, None) == (ERROR, AUTHENTICATION_ERROR)
    assert connect_reply(svc, "s3cret") == (CONNECTED, None)
