"""TLS on every surface (issue 17) with certificate verification on: the Python client over
`pulsar+ssl://` (lookup answers the TLS URL), the admin API over `https://`, and psql with
`sslmode=verify-full`; a token travels over each. A client that does not trust the CA is
refused, and the plain listeners keep working beside the TLS ones."""
import json
import os
import ssl
import subprocess
import urllib.error
import urllib.request

import pulsar
import pytest

from conftest import _free_port

TOKEN = "s3cret"
AUTH = {
    "LEDGERLAKE_BROKER__AUTHENTICATION__ENABLED": "true",
    "LEDGERLAKE_BROKER__AUTHENTICATION__TOKENS": f'{{{TOKEN}="app"}}',
    "LEDGERLAKE_BROKER__AUTHENTICATION__SUPERUSER_ROLES": '["app"]',
}


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certs(d, san="IP:127.0.0.1,DNS:localhost"):
    """A CA and a server certificate for `san` (127.0.0.1 and localhost) signed by it."""
    os.makedirs(d, exist_ok=True)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.pem", "-days", "2", "-subj", "/CN=ledgerlake test CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
            "server.csr", "-subj", "/CN=localhost", cwd=d)
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write(f"subjectAltName={san}\nbasicConstraints=CA:FALSE\n"
                "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf", cwd=d)
    return {k: os.path.join(d, f) for k, f in
            [("ca", "ca.pem"), ("cert", "server.pem"), ("key", "server.key")]}


@pytest.fixture
def tls_service(make_service, tmp_path):
    certs = make_certs(str(tmp_path))
    tls_port, https_port = _free_port(), _free_port()
    svc = make_service(AUTH, args=[
        "--pulsar-tls-addr", f"127.0.0.1:{tls_port}", "--https-addr", f"127.0.0.1:{https_port}",
        "--tls-cert-file", certs["cert"], "--tls-key-file", certs["key"]])
    svc.start()
    svc.tls_url = f"pulsar+ssl://127.0.0.1:{tls_port}"
    svc.https = f"https://127.0.0.1:{https_port}"
    svc.certs = certs
    return svc


def https_get(url, cafile=None):
    ctx = ssl.create_default_context(cafile=cafile)
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30, context=ctx) as r:
        return r.status, json.loads(r.read().decode() or "null")


def test_pulsar_https_and_psql_over_verified_tls(tls_service):
    svc = tls_service
    ca = svc.certs["ca"]
    # Pulsar over TLS: lookup, produce and consume with the CA and hostname checks on.
    client = pulsar.Client(svc.tls_url, tls_trust_certs_file_path=ca, tls_validate_hostname=True,
                           authentication=pulsar.AuthenticationToken(TOKEN),
                           operation_timeout_seconds=30)
    topic = "persistent://public/default/over-tls"
    consumer = client.subscribe(topic, "s")
    producer = client.create_producer(topic)
    for i in range(10):
        producer.send(f"m-{i}".encode())
    got = [consumer.receive(timeout_millis=10_000) for _ in range(10)]
    assert [m.data().decode() for m in got] == [f"m-{i}" for i in range(10)]
    client.close()
    # A client that does not trust the CA cannot connect.
    other_ca = make_certs(os.path.join(os.path.dirname(ca), "other"))["ca"]
    untrusting = pulsar.Client(svc.tls_url, operation_timeout_seconds=5,
                               tls_trust_certs_file_path=other_ca,
                               authentication=pulsar.AuthenticationToken(TOKEN))
    with pytest.raises(pulsar.ConnectError):
        untrusting.create_producer(topic)
    untrusting.close()
    # The plain listener still serves.
    plain = pulsar.Client(svc.url, authentication=pulsar.AuthenticationToken(TOKEN),
                          operation_timeout_seconds=30)
    plain.create_producer(topic).send(b"plain")
    plain.close()

    # HTTPS: the cluster record names the TLS URLs.
    status, cluster = https_get(f"{svc.https}/admin/v2/clusters/standalone", cafile=ca)
    assert status == 200
    assert cluster["brokerServiceUrlTls"] == svc.tls_url, cluster
    assert cluster["serviceUrlTls"] == svc.https, cluster
    with pytest.raises(urllib.error.URLError) as refused:
        https_get(f"{svc.https}/admin/v2/clusters")
    assert isinstance(refused.value.reason, ssl.SSLCertVerificationError), refused.value

    # psql with full verification; the token is the password.
    env = dict(os.environ, PGPASSWORD=TOKEN, PGCONNECT_TIMEOUT="10")
    conn = (f"host=127.0.0.1 port={svc.pg_port} user=app dbname=lake sslmode=verify-full "
            f"sslrootcert={ca}")
    r = subprocess.run(["psql", conn, "-X", "-A", "-t", "-w", "-c", "\\conninfo", "-c",
                        'SELECT count(*) FROM "over-tls"'],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "SSL connection" in r.stdout, r.stdout
    assert r.stdout.strip().splitlines()[-1] == "11", r.stdout
    # Trusting another CA, verify-full fails on the certificate; plain-text psql still works.
    r = subprocess.run(["psql", f"host=127.0.0.1 port={svc.pg_port} user=app dbname=lake "
                        f"sslmode=verify-full sslrootcert={other_ca}", "-X", "-w", "-c",
                        "SELECT 1"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode != 0 and "certificate verify failed" in r.stderr, r.stderr
    r = subprocess.run(["psql", f"host=127.0.0.1 port={svc.pg_port} user=app dbname=lake "
                        "sslmode=disable", "-X", "-A", "-t", "-w", "-c", "SELECT 1"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "1", r.stderr
