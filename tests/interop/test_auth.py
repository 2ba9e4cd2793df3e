"""Token authentication on CONNECT with the official client's AuthenticationToken."""
import socket
import struct

import pulsar
import pytest

# PulsarApi.proto: BaseCommand.Type, ServerError.
CONNECTED, ERROR = 3, 14
AUTHENTICATION_ERROR = 3


def _field(number, value):
    """One protobuf field: an int as a varint, str/bytes length-delimited."""
    if isinstance(value, int):
        key, payload = number << 3, b""
        n = value
    else:
        data = value.encode() if isinstance(value, str) else value
        key, payload, n = number << 3 | 2, data, len(data)
    out = bytearray()
    for v in (key, n):
        while True:
            out.append(v & 0x7F | (0x80 if v > 0x7F else 0))
            v >>= 7
            if not v:
                break
    return bytes(out) + payload


def _fields(data):
    """Field number → value (varints and length-delimited fields; enough for the replies)."""
    out, i = {}, 0

    def varint():
        nonlocal i
        v = shift = 0
        while True:
            b = data[i]
            i += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return v
    while i < len(data):
        key = varint()
        if key & 7 == 0:
            out[key >> 3] = varint()
        elif key & 7 == 2:
            n = varint()
            out[key >> 3] = data[i:i + n]
            i += n
        else:
            raise AssertionError(f"unexpected wire type in {data!r}")
    return out


def _recv(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, f"connection closed after {len(buf)} of {n} bytes"
        buf += chunk
    return buf


def connect_reply(svc, token):
    """The broker's answer to a CONNECT with `token` (None: no credentials), on a raw socket:
    (command type, ServerError of an ERROR or None)."""
    connect = _field(1, "ll-interop") + _field(4, 21)
    if token is not None:
        connect += _field(5, "token") + _field(3, token.encode())
    cmd = _field(1, 2) + _field(2, connect)  # BaseCommand{type: CONNECT, connect}
    with socket.create_connection(("127.0.0.1", svc.pulsar_port), timeout=10) as s:
        s.sendall(struct.pack(">II", len(cmd) + 4, len(cmd)) + cmd)
        total, size = struct.unpack(">II", _recv(s, 8))
        reply = _fields(_recv(s, total - 4)[:size])
    error = _fields(reply[14]).get(2) if 14 in reply else None
    return reply[1], error


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
