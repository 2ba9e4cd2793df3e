"""A cluster whose bookie listeners speak TLS (issue 19, ADR 0013: `server.bookie_tls`), with
authentication on: every node-to-node connection (replication, reads, fencing, recovery) is
encrypted, checks the peer's certificate against `server.bookie_tls_trust_certs_file` for the
host it dials, and says hello with the node token inside TLS. The test routes every bookie
connection through a recording proxy (the nodes reach each other by a named listener, at
`localhost`, the only name their certificates carry) and checks that no message body and no
token crosses it in the clear, then SIGKILLs the owner of a busy topic: the new owner recovers
over TLS and every acknowledged message is read once. A node trusting another authority, and a
node dialling the others at an address their certificates do not name, refuse the others'
bookies. A plaintext request to a TLS listener gets no answer; a node with TLS on and no
trusted authorities does not start."""
import os
import socket
import struct
import subprocess
import uuid

from bookiewire import encode
from conftest import _free_port
from tcpproxy import TcpProxy
from test_cluster_ownership import _sql
from test_cluster_replication import (_bookie_id, _ledgers, kill_owner_and_read_all,
                                      send_to_an_owner)
from test_tls import make_certs

MARK = "plain-text-marker"
NODE_TOKEN = "node-token-in-the-clear-would-show"
APP_TOKEN = "app-s3cret"
ENV = {
    "LEDGERLAKE_METADATA__SESSION_TTL": "3s",
    "LEDGERLAKE_LAKE__ENABLED": "false",
    "LEDGERLAKE_BROKER__AUTHENTICATION__ENABLED": "true",
    "LEDGERLAKE_BROKER__AUTHENTICATION__TOKENS":
        f'{{{NODE_TOKEN}="ledgerlake-node", {APP_TOKEN}="app"}}',
    "LEDGERLAKE_BROKER__AUTHENTICATION__SUPERUSER_ROLES": '["ledgerlake-node", "app"]',
    "LEDGERLAKE_BROKER__AUTHENTICATION__NODE_TOKEN": NODE_TOKEN,
}


def _tls_env(certs, listener=None, via=None):
    """A node whose bookie speaks TLS; it dials the others by `listener`, and they reach it at
    localhost:`via` (when given)."""
    env = {**ENV,
           "LEDGERLAKE_SERVER__BOOKIE_TLS": "true",
           "LEDGERLAKE_SERVER__TLS_CERT_FILE": certs["cert"],
           "LEDGERLAKE_SERVER__TLS_KEY_FILE": certs["key"],
           "LEDGERLAKE_SERVER__BOOKIE_TLS_TRUST_CERTS_FILE": certs["ca"]}
    if listener:
        env["LEDGERLAKE_SERVER__BOOKIE_LISTENER_NAME"] = listener
    if via:
        env["LEDGERLAKE_SERVER__BOOKIE_ADVERTISED_LISTENERS__TAPPED"] = f"localhost:{via}"
    return env


def test_bookie_traffic_is_encrypted_and_recovery_runs_over_it(etcd, make_service, tmp_path):
    certs = make_certs(str(tmp_path / "certs"), san="DNS:localhost")
    prefix = f"/tls-{uuid.uuid4().hex[:6]}"
    ports = [_free_port() for _ in range(3)]
    taps = [TcpProxy(p, capture=4 << 20) for p in ports]
    try:
        nodes = [make_service(env=_tls_env(certs, "tapped", tap.port),
                              args=["--metadata-url", etcd.url(prefix),
                                    "--bookie-addr", f"127.0.0.1:{port}"])
                 for port, tap in zip(ports, taps)]
        for n in nodes:
            n.start()
        topic = f"persistent://public/default/sealed-{uuid.uuid4().hex[:6]}"
        client, producer, sent, owner = send_to_an_owner(etcd, prefix, nodes, topic, MARK,
                                                         APP_TOKEN)
        try:
            others = [n for n in nodes if n is not owner]
            ledger = max(_ledgers(etcd, prefix).values(), key=lambda r: r["id"])
            assert sorted(ledger["replicas"]) == sorted(_bookie_id(n) for n in others)
            # Replicated through the taps, and none of it readable there.
            peer_taps = [taps[nodes.index(n)] for n in others]
            assert all(t.forwarded() > 100 * len(MARK) for t in peer_taps), \
                [t.forwarded() for t in taps]
            for t in taps:
                wire = t.captured()
                assert MARK.encode() not in wire, "a message body crossed in the clear"
                assert NODE_TOKEN.encode() not in wire, "the node token crossed in the clear"
            kill_owner_and_read_all(etcd, prefix, client, producer, topic, owner, sent)
            for n in others:
                with open(n.log_path) as f:
                    log = f.read()
                assert "invalid peer certificate" not in log
                assert "bad credentials" not in log and "before credentials" not in log
            name = topic.rsplit("/", 1)[1]
            status, rows = _sql(others[0], f'SELECT count(*) AS n FROM "{name}"', APP_TOKEN)
            assert (status, rows) == (200, [{"n": len(sent)}]), rows
        finally:
            client.close()

        # Nodes that cannot authenticate the others' bookies read nothing from them: one
        # trusts another authority, one dials them at 127.0.0.1, which their certificates do
        # not name.
        stranger = make_certs(str(tmp_path / "other-ca"))
        # (Both authorities have the same name: the stranger's signature is what fails.)
        for env, why in [(_tls_env(stranger, "tapped"), ("BadSignature", "UnknownIssuer")),
                         (_tls_env(certs), ("not valid for name",))]:
            odd = make_service(env=env, args=["--metadata-url", etcd.url(prefix),
                                              "--bookie-addr", f"127.0.0.1:{_free_port()}"])
            odd.start()
            status, rows = _sql(odd, f'SELECT count(*) AS n FROM "{name}"', APP_TOKEN)
            assert status != 200, rows
            with open(odd.log_path) as f:
                log = f.read()
            assert "invalid peer certificate" in log and any(w in log for w in why), why
            odd.stop()

        # A plaintext bookie request to a TLS listener: no answer, the connection closed.
        port = ports[nodes.index(others[0])]
        frame = encode(0x02, 1, struct.pack(">H", 1) + b"t" + bytes(8))
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(frame)
            try:
                answer = s.recv(64)
            except ConnectionResetError:
                answer = b""
            # A TLS alert may come back, never a bookie frame (version byte 2 after the length).
            assert answer == b"" or answer[0] == 0x15, answer
    finally:
        for t in taps:
            t.stop()


def test_a_tls_bookie_needs_trusted_authorities(tmp_path):
    certs = make_certs(str(tmp_path / "certs"))
    env = {k: v for k, v in _tls_env(certs).items() if "TRUST" not in k}
    run = subprocess.run(
        [os.environ["LL_TEST_BIN"], "serve", "--data-dir", str(tmp_path / "data"),
         "--pulsar-addr", f"127.0.0.1:{_free_port()}", "--http-addr", f"127.0.0.1:{_free_port()}",
         "--pg-addr", f"127.0.0.1:{_free_port()}", "--bookie-addr", f"127.0.0.1:{_free_port()}"],
        capture_output=True, text=True, timeout=60, env=dict(os.environ, **env))
    assert run.returncode != 0
    assert "server.bookie_tls_trust_certs_file" in run.stderr, run.stderr


def _unfollowed(certs, url):
    """GET `url` without following a redirect, trusting the test authority: (status,
    Location, body)."""
    import ssl
    import urllib.error
    import urllib.request

    from test_cluster_ownership import _NoRedirect
    opener = urllib.request.build_opener(
        _NoRedirect, urllib.request.HTTPSHandler(
            context=ssl.create_default_context(cafile=certs["ca"])))
    try:
        with opener.open(url, timeout=10) as r:
            return r.status, r.headers.get("Location"), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Location"), e.read()


def test_an_admin_call_over_https_is_redirected_to_the_owners_https(etcd, make_service,
                                                                    tmp_path):
    """Two nodes serving HTTPS beside HTTP: an admin call about a topic another node owns is
    redirected (307) to the owner's HTTPS URL when it came over HTTPS (a token sent over TLS
    is not sent on in the clear), and to its HTTP URL when it came over HTTP."""
    import pulsar
    from test_cluster_ownership import _owners

    certs = make_certs(str(tmp_path / "certs"))
    prefix = f"/https-{uuid.uuid4().hex[:6]}"
    env = {"LEDGERLAKE_METADATA__SESSION_TTL": "3s", "LEDGERLAKE_LAKE__ENABLED": "false",
           "LEDGERLAKE_SERVER__TLS_CERT_FILE": certs["cert"],
           "LEDGERLAKE_SERVER__TLS_KEY_FILE": certs["key"]}
    nodes = []
    for _ in range(2):
        port = _free_port()
        node = make_service(env=env, args=["--metadata-url", etcd.url(prefix),
                                           "--bookie-addr", f"127.0.0.1:{_free_port()}",
                                           "--https-addr", f"127.0.0.1:{port}"])
        node.start()
        node.https = f"https://127.0.0.1:{port}"
        nodes.append(node)
    topic = f"persistent://public/default/https-{uuid.uuid4().hex[:6]}"
    client = pulsar.Client("pulsar://" + ",".join(f"127.0.0.1:{n.pulsar_port}" for n in nodes),
                           operation_timeout_seconds=30)
    try:
        client.create_producer(topic).send(b"owned")
        owner_id = _owners(etcd, prefix)[topic]
        (owner,) = [n for n in nodes if f"127.0.0.1:{n.http_port}" == owner_id]
        (elsewhere,) = [n for n in nodes if n is not owner]
        stats = f"/admin/v2/persistent/{topic[len('persistent://'):]}/stats"
        assert _unfollowed(certs, elsewhere.https + stats)[:2] == (307, owner.https + stats)
        assert _unfollowed(certs, elsewhere.http + stats)[:2] == (307, owner.http + stats)
        assert _unfollowed(certs, owner.https + stats)[0] == 200
    finally:
        client.close()


def test_an_admin_call_over_https_is_not_redirected_to_an_owner_without_https(
        etcd, make_service, tmp_path):
    """Of two nodes only one serves HTTPS: a call made to it over HTTPS about a topic the
    other owns gets 503 with the reason, not a redirect to the owner's plain-HTTP URL (where
    its token would go on in the clear); the same call over HTTP is redirected there."""
    import pulsar
    from test_cluster_ownership import _owners

    certs = make_certs(str(tmp_path / "certs"))
    prefix = f"/mixed-{uuid.uuid4().hex[:6]}"
    env = {"LEDGERLAKE_METADATA__SESSION_TTL": "3s", "LEDGERLAKE_LAKE__ENABLED": "false",
           "LEDGERLAKE_SERVER__TLS_CERT_FILE": certs["cert"],
           "LEDGERLAKE_SERVER__TLS_KEY_FILE": certs["key"]}
    port = _free_port()
    secure = make_service(env=env, args=["--metadata-url", etcd.url(prefix),
                                         "--bookie-addr", f"127.0.0.1:{_free_port()}",
                                         "--https-addr", f"127.0.0.1:{port}"])
    secure.start()
    secure.https = f"https://127.0.0.1:{port}"
    plain = make_service(env=env, args=["--metadata-url", etcd.url(prefix),
                                        "--bookie-addr", f"127.0.0.1:{_free_port()}"])
    plain.start()
    client = pulsar.Client(f"pulsar://127.0.0.1:{secure.pulsar_port},"
                           f"127.0.0.1:{plain.pulsar_port}", operation_timeout_seconds=30)
    try:
        topic = None
        for _ in range(40):
            candidate = f"persistent://public/default/mixed-{uuid.uuid4().hex[:6]}"
            client.create_producer(candidate).send(b"owned")
            if _owners(etcd, prefix)[candidate] == f"127.0.0.1:{plain.http_port}":
                topic = candidate
                break
        assert topic, "no topic landed on the node without HTTPS"
        stats = f"/admin/v2/persistent/{topic[len('persistent://'):]}/stats"
        status, location, body = _unfollowed(certs, secure.https + stats)
        assert (status, location) == (503, None), (status, location, body)
        assert b"without HTTPS" in body
        assert _unfollowed(certs, secure.http + stats)[:2] == (307, plain.http + stats)
    finally:
        client.close()
