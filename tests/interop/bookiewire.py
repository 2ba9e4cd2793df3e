"""The bookie protocol as the tests speak it to a node's bookie listener (ARCHITECTURE.md,
"the bookie wire format"): a frame is `[u32 length][version u8][kind u8][request id u64]
[body][crc32c u32]`, the checksum over everything after the length."""

import socket
import struct

VERSION = 2
READ = 0x01
ENTRIES = 0x81


def crc32c(data):
    """CRC-32C (Castagnoli), bit by bit: the bookie protocol's frame checksum."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, "bookie closed the connection"
        buf += chunk
    return buf


def encode(kind, request_id, body):
    """One request frame, length prefix included."""
    frame = struct.pack(">BBQ", VERSION, kind, request_id) + body
    frame += struct.pack(">I", crc32c(frame))
    return struct.pack(">I", len(frame)) + frame


def call(s, request_id, kind, body):
    """Sends one request on `s`: (kind, body) of the answer, checked (checksum, version,
    request id), or None when the bookie closed the connection without one."""
    s.sendall(encode(kind, request_id, body))
    head = s.recv(4)
    if not head:
        return None
    (length,) = struct.unpack(">I", head + recv_exact(s, 4 - len(head)))
    answer = recv_exact(s, length)
    assert crc32c(answer[:-4]) == struct.unpack(">I", answer[-4:])[0], "frame checksum"
    version, got_kind, got_id = struct.unpack(">BBQ", answer[:10])
    assert (version, got_id) == (VERSION, request_id)
    return got_kind, answer[10:-4]


def served(addr, topic, ledger, count):
    """entry id → (publish time, stored bytes: the message's metadata and payload) of every
    entry of `ledger` below `count` that the bookie at `addr` serves, asked for in as many
    requests as its byte budget needs (a replica of a striped ledger serves its stripe only)."""
    host, port = addr.rsplit(":", 1)
    out, request_id, first = {}, 0, 0
    t = topic.encode()
    with socket.create_connection((host, int(port)), timeout=30) as s:
        while first < count:
            request_id += 1
            body = struct.pack(">H", len(t)) + t + struct.pack(">QQQI", ledger, first, count - 1,
                                                                4 << 20)
            answer = call(s, request_id, READ, body)
            assert answer is not None, f"bookie {addr} closed the connection"
            kind, body = answer
            assert kind == ENTRIES, f"bookie {addr} refused ledger {ledger}: kind {kind:#x} {body!r}"
            (n,) = struct.unpack(">I", body[:4])
            if n == 0:
                break
            at = 4
            for _ in range(n):
                entry, publish, size = struct.unpack(">QqI", body[at:at + 20])
                at += 20
                assert entry >= first and entry not in out
                out[entry] = (publish, body[at:at + size])
                at += size
                first = entry + 1
    return out
