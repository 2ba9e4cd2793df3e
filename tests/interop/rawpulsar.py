"""The Pulsar binary protocol encoded by hand, for tests that must send exactly the bytes under
test (hostile names, floods, malformed batches) or behave as no real client would (never read,
never grant permits). Only what those tests need: protobuf fields as varints and
length-delimited bytes, frames with and without a message payload (no checksum: the broker
accepts both, as Pulsar does).

Numbers are PulsarApi.proto's: BaseCommand.Type (the command's field number in BaseCommand is
the same), and each command's field numbers where it is built.
"""
import socket
import struct

CONNECT, CONNECTED, SUBSCRIBE, PRODUCER, SEND, SEND_RECEIPT, SEND_ERROR, MESSAGE = 2, 3, 4, 5, 6, 7, 8, 9
FLOW, UNSUBSCRIBE = 11, 12
SUCCESS, ERROR, PRODUCER_SUCCESS, PING, PONG = 13, 14, 17, 18, 19
PARTITIONED_METADATA, PARTITIONED_METADATA_RESPONSE, LOOKUP, LOOKUP_RESPONSE = 21, 22, 23, 24
REQUEST_ID_FIELD = {SUCCESS: 1, ERROR: 1, PRODUCER_SUCCESS: 1,
                    PARTITIONED_METADATA_RESPONSE: 2, LOOKUP_RESPONSE: 4}
# ServerError
CONSUMER_NOT_FOUND = 13
# CommandSubscribe.SubType
EXCLUSIVE, SHARED, FAILOVER = 0, 1, 2
PROTOCOL_VERSION = 15


def varint(n):
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def fv(num, value):
    """A varint field."""
    return varint(num << 3) + varint(value)


def fb(num, data):
    """A length-delimited field (bytes, or str as UTF-8)."""
    if isinstance(data, str):
        data = data.encode()
    return varint(num << 3 | 2) + varint(len(data)) + data


def read_varint(buf, i):
    n = shift = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def parse(buf):
    """A protobuf message as {field number: [values]} (varints as ints, the rest as bytes)."""
    out, i = {}, 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = read_varint(buf, i)
        elif wire == 2:
            length, i = read_varint(buf, i)
            value, i = bytes(buf[i:i + length]), i + length
        elif wire == 1:
            value, i = bytes(buf[i:i + 8]), i + 8
        elif wire == 5:
            value, i = bytes(buf[i:i + 4]), i + 4
        else:
            raise ValueError(f"wire type {wire}")
        out.setdefault(num, []).append(value)
    return out


def frame(kind, body, payload=None):
    """One frame: BaseCommand{type: kind, <kind>: body}, then `payload` (a message's
    `[u32 metadata size][metadata][data]`) when given."""
    cmd = fv(1, kind) + fb(kind, body)
    rest = payload or b""
    return struct.pack(">II", 4 + len(cmd) + len(rest), len(cmd)) + cmd + rest


def message(producer, sequence_id, data, publish_time=1_700_000_000_000, batch=None):
    """A SEND's payload: MessageMetadata{producer_name, sequence_id, publish_time[,
    num_messages_in_batch]} and `data` (for a batch, the single-message records, as given)."""
    meta = fb(1, producer) + fv(2, sequence_id) + fv(3, publish_time)
    if batch is not None:
        meta += fv(11, batch)
    return struct.pack(">I", len(meta)) + meta + data


def send_frame(producer_id, sequence_id, payload, num_messages=None):
    body = fv(1, producer_id) + fv(2, sequence_id)
    if num_messages is not None:
        body += fv(3, num_messages)
    return frame(SEND, body, payload)


def connect_body(client="ll-raw-test", token=None, version=PROTOCOL_VERSION):
    body = fb(1, client) + fv(4, version)
    if token is not None:
        body += fb(5, "token") + fb(3, token)
    return body


class RawPulsar:
    """One connection speaking the binary protocol by hand (CONNECT done unless `connect` is
    False; `rcvbuf`: a small receive buffer, for a client that is not going to read)."""

    def __init__(self, port, connect=True, timeout=20, rcvbuf=None):
        self.sock = socket.socket()
        if rcvbuf:
            # Before connecting, so that the window the service sees is this small.
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        if connect:
            self.send(CONNECT, connect_body())
            kind, _ = self.read()
            assert kind == CONNECTED, kind

    def send(self, kind, body, payload=None):
        self.sock.sendall(frame(kind, body, payload))

    def _exact(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed by the server")
            data += chunk
        return data

    def read(self):
        """The next command: (kind, its fields), the payload of a MESSAGE skipped."""
        (total,) = struct.unpack(">I", self._exact(4))
        data = self._exact(total)
        (size,) = struct.unpack(">I", data[:4])
        cmd = parse(data[4:4 + size])
        kind = cmd[1][0]
        return kind, (parse(cmd[kind][0]) if kind in cmd else {})

    def request(self, kind, body, request_id):
        """Sends one request; returns (response kind, fields), or ("closed", None) or
        ("timeout", None)."""
        try:
            self.send(kind, body)
            while True:
                got, fields = self.read()
                if got == PING:
                    self.send(PONG, b"")
                    continue
                field = REQUEST_ID_FIELD.get(got)
                if field and fields.get(field) == [request_id]:
                    return got, fields
        except socket.timeout:
            return "timeout", None
        except (ConnectionError, OSError):
            return "closed", None

    def close(self):
        self.sock.close()
