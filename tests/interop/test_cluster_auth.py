"""A cluster with authentication on (issue 19, ADR 0012): the nodes' bookie listeners serve
only connections that say hello with a superuser's token first, the nodes present their
`node_token` to each other, and replicated writes, fencing and recovery all go through those
authenticated connections: the owner of a busy topic is SIGKILLed and every acknowledged message
is read once from the node that took over."""
import json
import os
import socket
import struct
import subprocess
import urllib.request
import uuid

from bookiewire import call
from conftest import _free_port
from test_cluster_replication import (_bookie_id, _ledgers, kill_owner_and_read_all,
                                      send_to_an_owner)

NODE_TOKEN = "node-s3cret"
APP_TOKEN = "app-s3cret"
VIEWER_TOKEN = "viewer-s3cret"
AUTH = {
    "LEDGERLAKE_BROKER__AUTHENTICATION__ENABLED": "true",
    "LEDGERLAKE_BROKER__AUTHENTICATION__TOKENS":
        f'{{{NODE_TOKEN}="ledgerlake-node", {APP_TOKEN}="app", {VIEWER_TOKEN}="viewer"}}',
    "LEDGERLAKE_BROKER__AUTHENTICATION__SUPERUSER_ROLES": '["ledgerlake-node", "app"]',
    "LEDGERLAKE_METADATA__SESSION_TTL": "3s",
    "LEDGERLAKE_LAKE__ENABLED": "false",
}


def _bookie_call(port, request_id, kind, body):
    """One request on a fresh connection to a bookie: (kind, body) of its answer, or None when
    it closed the connection without one. Returns the socket too, for more requests."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    return s, call(s, request_id, kind, body)


def _string(text):
    raw = text.encode()
    return struct.pack(">H", len(raw)) + raw


def _closed(s):
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def test_bookies_serve_only_nodes_with_a_superuser_token(etcd, make_service, tmp_path):
    prefix = f"/auth-{uuid.uuid4().hex[:6]}"
    token_file = tmp_path / "node-token"
    token_file.write_text(NODE_TOKEN + "\n")
    bookie_ports = [_free_port() for _ in range(3)]
    nodes = []
    for i, port in enumerate(bookie_ports):
        # One node reads its token from a file, the others take it inline.
        token = f"file:{token_file}" if i == 0 else NODE_TOKEN
        env = dict(AUTH, LEDGERLAKE_BROKER__AUTHENTICATION__NODE_TOKEN=token)
        nodes.append(make_service(env=env, args=["--metadata-url", etcd.url(prefix),
                                                 "--bookie-addr", f"127.0.0.1:{port}"]))
    for n in nodes:
        n.start()
    req = urllib.request.Request(
        f"{nodes[0].http}/admin/v2/namespaces/public/default/persistence", method="POST",
        data=json.dumps({"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 3,
                         "bookkeeperAckQuorum": 2}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {APP_TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 204

    topic = f"persistent://public/default/guarded-{uuid.uuid4().hex[:6]}"
    client, producer, sent, owner = send_to_an_owner(etcd, prefix, nodes, topic, "m", APP_TOKEN)
    try:
        others = [n for n in nodes if n is not owner]
        # Replicated over authenticated connections: the ledger's entries went to both peers.
        ledger = max(_ledgers(etcd, prefix).values(), key=lambda r: r["id"])
        assert ledger["bookie"] == _bookie_id(owner)
        assert sorted(ledger["replicas"]) == sorted(_bookie_id(n) for n in others)
        for n in others:
            with open(n.log_path) as f:
                log = f.read()
            assert "bad credentials" not in log and "before credentials" not in log, \
                "every bookie connection said hello with a welcome token"
        kill_owner_and_read_all(etcd, prefix, client, producer, topic, owner, sent)
    finally:
        client.close()

    port = bookie_ports[nodes.index(others[0])]
    ask = _string(topic) + struct.pack(">Q", 1)  # last confirmed of some ledger
    # A request before hello: unauthorized (0xFF, code 6), and the connection closed.
    s, answer = _bookie_call(port, 1, 0x02, ask)
    with s:
        assert answer is not None and answer[0] == 0xFF and answer[1][0] == 6, answer
        assert _closed(s)
    # Hello with a token whose role is not a superuser, or an unknown one: the same.
    for token in (VIEWER_TOKEN, "forged"):
        s, answer = _bookie_call(port, 0, 0x06, _string(token))
        with s:
            assert answer is not None and answer[0] == 0xFF and answer[1][0] == 6, answer
            assert _closed(s)
    # The nodes' token: welcomed with its role, then served.
    s, answer = _bookie_call(port, 0, 0x06, _string(NODE_TOKEN))
    with s:
        assert answer == (0x85, _string("ledgerlake-node"))
        kind, _ = call(s, 1, 0x02, ask)
        assert kind in (0x82, 0xFF)  # confirmed, or not held: served either way
        kind, body = call(s, 2, 0x02, ask)
        assert kind != 0xFF or body[0] != 6, "no longer unauthorized"


def test_a_node_with_a_bookie_listener_needs_a_node_token(tmp_path):
    binary = os.environ["LL_TEST_BIN"]
    run = subprocess.run(
        [binary, "serve", "--data-dir", str(tmp_path / "data"),
         "--pulsar-addr", f"127.0.0.1:{_free_port()}", "--http-addr", f"127.0.0.1:{_free_port()}",
         "--pg-addr", f"127.0.0.1:{_free_port()}", "--bookie-addr", f"127.0.0.1:{_free_port()}"],
        capture_output=True, text=True, timeout=60,
        env=dict(os.environ, **{k: v for k, v in AUTH.items()
                                if k.startswith("LEDGERLAKE_BROKER")}))
    assert run.returncode != 0
    assert "broker.authentication.node_token" in run.stderr, run.stderr
