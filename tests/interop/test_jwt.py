"""JSON Web Tokens end to end: keys and tokens made with `ledgerlake token` (the verbs of
`pulsar tokens`), a service started with `--auth-token-secret-key` / `--auth-token-public-key`,
and the same token on every surface (Pulsar protocol, admin API, SQL over psql and HTTP).
Forged, expired, wrong-key, wrong-algorithm and `alg: none` tokens are refused everywhere;
an expiring token on a long-lived connection is refreshed through AUTH_CHALLENGE, or the
connection is closed."""
import base64
import json
import os
import subprocess
import time
import urllib.error
import urllib.request

import pulsar
import pytest

from conftest import _binary, eventually
from test_sql import psql, sql_http


# The roles these tests use may do everything; permissions are tested in test_tenancy.py.
SUPERUSERS = ["--superuser-roles", "app,svc,reader"]


def token_cli(*args, check=True):
    r = subprocess.run([_binary(), "token", *args], capture_output=True, text=True, timeout=60)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def make_token(*args):
    return token_cli("create", *args).stdout.strip()


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def alg_none_token(role):
    header = b64url(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    claims = b64url(json.dumps({"sub": role}).encode())
    return f"{header}.{claims}."


def admin_status(svc, token):
    req = urllib.request.Request(f"{svc.http}/admin/v2/namespaces/public/default/deduplication")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def produce_and_consume(svc, token, topic):
    """Produces and reads back one message with `token`; returns what was read."""
    client = pulsar.Client(svc.url, authentication=pulsar.AuthenticationToken(token),
                           operation_timeout_seconds=10)
    try:
        consumer = client.subscribe(topic, "s",
                                    initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic)
        producer.send(b"hello")
        msg = consumer.receive(timeout_millis=10_000)
        consumer.acknowledge(msg)
        return msg.data()
    finally:
        client.close()


def connect_fails(svc, token):
    client = pulsar.Client(svc.url, authentication=pulsar.AuthenticationToken(token),
                           operation_timeout_seconds=3)
    try:
        client.create_producer("refused")
    except pulsar.PulsarException as e:
        return str(e)
    else:
        return None
    finally:
        client.close()


def assert_refused_everywhere(svc, token):
    assert connect_fails(svc, token) is not None
    assert admin_status(svc, token) == 401
    assert psql(svc, "SELECT 1", password=token).returncode != 0
    assert sql_http(svc, "SELECT 1", token=token)[0] == 401


def test_secret_key_tokens_work_on_every_surface_and_forgeries_do_not(make_service, tmp_path):
    key = tmp_path / "secret.key"
    token_cli("create-secret-key", "--output", str(key))
    assert key.stat().st_size == 32 and (key.stat().st_mode & 0o777) == 0o600
    svc = make_service(args=["--auth-token-secret-key", str(key), *SUPERUSERS])
    svc.start()
    token = make_token("--secret-key", str(key), "--subject", "app")
    assert produce_and_consume(svc, token, "jwt-secret") == b"hello"
    assert admin_status(svc, token) == 200
    r = psql(svc, "SELECT 1", password=token)
    assert r.returncode == 0 and r.stdout.strip() == "1", r.stderr
    assert sql_http(svc, "SELECT 1", token=token)[0] == 200
    # Without a token.
    assert admin_status(svc, None) == 401
    assert sql_http(svc, "SELECT 1")[0] == 401
    # Signed with another secret key.
    other = tmp_path / "other.key"
    token_cli("create-secret-key", "--output", str(other))
    assert_refused_everywhere(svc, make_token("--secret-key", str(other), "--subject", "app"))
    # Expired (lifetime 1 s, used 2 s later).
    expired = make_token("--secret-key", str(key), "--subject", "app", "--expiry-time", "1s")
    time.sleep(2)
    assert_refused_everywhere(svc, expired)
    # alg: none, and a token whose payload was changed after signing.
    assert_refused_everywhere(svc, alg_none_token("app"))
    header, _, signature = token.split(".")
    evil = b64url(json.dumps({"sub": "root"}).encode())
    assert_refused_everywhere(svc, f"{header}.{evil}.{signature}")
    # The service still serves the good token.
    assert produce_and_consume(svc, token, "jwt-secret-2") == b"hello"


@pytest.mark.parametrize("alg", ["RS256", "ES256"])
def test_key_pair_tokens_and_the_wrong_key_or_algorithm(make_service, tmp_path, alg):
    private, public = tmp_path / "private.key", tmp_path / "public.key"
    token_cli("create-key-pair", "--algorithm", alg,
              "--output-private-key", str(private), "--output-public-key", str(public))
    svc = make_service(args=["--auth-token-public-key", str(public), *SUPERUSERS,
                             "--auth-token-public-alg", alg])
    svc.start()
    token = make_token("--private-key", str(private), "--algorithm", alg, "--subject", "svc")
    assert produce_and_consume(svc, token, f"jwt-{alg}") == b"hello"
    assert admin_status(svc, token) == 200
    # Another key pair's token.
    other_private, other_public = tmp_path / "o-private.key", tmp_path / "o-public.key"
    token_cli("create-key-pair", "--algorithm", alg,
              "--output-private-key", str(other_private),
              "--output-public-key", str(other_public))
    forged = make_token("--private-key", str(other_private), "--algorithm", alg,
                        "--subject", "svc")
    assert_refused_everywhere(svc, forged)
    # Key confusion: HS256 with the public key's bytes as the HMAC secret.
    confused = make_token("--secret-key", str(public), "--subject", "svc")
    assert_refused_everywhere(svc, confused)


def test_token_show_and_validate(tmp_path):
    key = tmp_path / "secret.key"
    token_cli("create-secret-key", "--output", str(key))
    token = make_token("--secret-key", str(key), "--subject", "reader", "--expiry-time", "1h")
    shown = token_cli("show", token).stdout
    header, claims = shown.split("---")
    assert json.loads(header)["alg"] == "HS256"
    claims = json.loads(claims)
    assert claims["sub"] == "reader" and claims["exp"] > time.time() + 3500
    ok = token_cli("validate", "--secret-key", str(key), token)
    assert "reader" in ok.stdout
    other = tmp_path / "other.key"
    token_cli("create-secret-key", "--output", str(other))
    bad = token_cli("validate", "--secret-key", str(other), token, check=False)
    assert bad.returncode != 0 and "signature" in bad.stderr, bad.stderr
    # base64 output as `pulsar tokens create-secret-key --base64` gives it.
    printed = token_cli("create-secret-key", "--base64").stdout.strip()
    assert len(base64.b64decode(printed)) == 32


def refresh_service(make_service, tmp_path):
    key = tmp_path / "secret.key"
    token_cli("create-secret-key", "--output", str(key))
    svc = make_service(
        env={"LEDGERLAKE_BROKER__AUTHENTICATION__REFRESH_CHECK_INTERVAL": "1s",
             "LEDGERLAKE_TELEMETRY__LOG_LEVEL": "ledgerlake::broker=debug,info"},
        args=["--auth-token-secret-key", str(key), *SUPERUSERS])
    svc.start()
    return svc, key


def test_an_expiring_token_is_refreshed_on_a_live_connection(make_service, tmp_path):
    svc, key = refresh_service(make_service, tmp_path)
    handed = []

    def supplier():
        # A token that expires in 3 s; every refresh gets a new one.
        t = make_token("--secret-key", str(key), "--subject", "app", "--expiry-time", "3s")
        handed.append(t)
        return t
    client = pulsar.Client(svc.url, authentication=pulsar.AuthenticationToken(supplier),
                           operation_timeout_seconds=10)
    try:
        producer = client.create_producer("refreshed", send_timeout_millis=10_000)
        for i in range(8):
            producer.send(f"m{i}".encode())
            time.sleep(1)
        log = open(svc.log_path).read()
        assert "credentials refreshed" in log, log[-3000:]
        assert "expired and the client sent no fresh ones" not in log
        assert len(handed) >= 2
    finally:
        client.close()


def test_a_connection_whose_token_expires_without_refresh_is_closed(make_service, tmp_path):
    svc, key = refresh_service(make_service, tmp_path)
    token = make_token("--secret-key", str(key), "--subject", "app", "--expiry-time", "3s")
    client = pulsar.Client(svc.url, authentication=pulsar.AuthenticationToken(token),
                           operation_timeout_seconds=3)
    try:
        producer = client.create_producer("expiring", send_timeout_millis=3000)
        producer.send(b"before expiry")

        def closed():
            log = open(svc.log_path).read()
            assert "refreshing credentials failed" in log, log[-3000:]
        eventually(closed, timeout=30)
        # Reconnecting with the expired token is refused, so sends fail.
        with pytest.raises(pulsar.PulsarException):
            producer.send(b"after expiry")
    finally:
        client.close()
