"""Tenants, namespaces, clusters and permissions, as Pulsar has them (issue 17).

- The admin API's shapes and rules: `standalone` and `public/default` exist from the start;
  404/409/412/405/501 where Pulsar answers them; a topic is created only in a namespace that
  exists; everything survives a SIGKILL.
- The isolation matrix: with authentication on, a role of tenant A can neither produce to,
  consume from, look up, read or change through the admin API, nor query with SQL (psql and
  HTTP) anything of tenant B; the superuser and the roles B granted can. Grants, revocations
  and the subscription `Prefix` rule take effect on the live service at once.
(Forged, expired, wrong-key, wrong-algorithm and `alg: none` tokens: test_jwt.py.)
"""
import json
import signal
import subprocess
import urllib.error
import urllib.request

import pulsar
import pytest

from conftest import _binary
from test_jwt import make_token, token_cli
from test_sql import psql, sql_http


def call(svc, method, path, body=None, token=None):
    data = body.encode() if isinstance(body, str) else (
        json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(f"{svc.http}/admin/v2{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read().decode()
            return r.status, json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        return e.code, json.loads(text) if text else None


TENANT = {"adminRoles": [], "allowedClusters": ["standalone"]}


def test_tenants_namespaces_and_clusters_follow_pulsar(fresh_service):
    svc = fresh_service
    svc.start()
    assert call(svc, "GET", "/clusters") == (200, ["standalone"])
    status, cluster = call(svc, "GET", "/clusters/standalone")
    assert status == 200 and cluster["brokerServiceUrl"] == svc.url, cluster
    assert call(svc, "GET", "/clusters/mars")[0] == 404
    assert call(svc, "GET", "/tenants") == (200, ["public"])
    assert call(svc, "GET", "/namespaces/public") == (200, ["public/default"])

    # Tenants: Pulsar's 412 and 409 cases.
    status, body = call(svc, "PUT", "/tenants/acme", {"adminRoles": [], "allowedClusters": []})
    assert status == 412 and body["reason"] == "Clusters can not be empty", body
    assert call(svc, "PUT", "/tenants/acme", {"allowedClusters": ["mars"]})[0] == 412
    assert call(svc, "PUT", "/tenants/acme", "{not json")[0] == 400
    assert call(svc, "PUT", "/tenants/acme", {"adminRoles": ["ops"],
                                              "allowedClusters": ["standalone"]})[0] == 204
    assert call(svc, "PUT", "/tenants/acme", TENANT)[0] == 409
    assert call(svc, "GET", "/tenants/acme") == (
        200, {"adminRoles": ["ops"], "allowedClusters": ["standalone"]})
    assert call(svc, "GET", "/tenants/nope")[0] == 404
    assert call(svc, "GET", "/namespaces/nope")[0] == 404

    # No topic outside a namespace that exists.
    client = pulsar.Client(svc.url, operation_timeout_seconds=10)
    with pytest.raises(pulsar.exceptions.TopicNotFound):
        client.create_producer("persistent://acme/orders/x")
    assert call(svc, "PUT", "/persistent/acme/orders/y/partitions", "2")[0] == 404
    assert call(svc, "POST", "/namespaces/acme/orders/deduplication", "true")[0] == 404

    assert call(svc, "PUT", "/namespaces/acme/orders")[0] == 204
    assert call(svc, "PUT", "/namespaces/acme/orders")[0] == 409
    assert call(svc, "PUT", "/namespaces/ghost/orders")[0] == 404
    producer = client.create_producer("persistent://acme/orders/x")
    producer.send(b"one")
    producer.close()
    status, policies = call(svc, "GET", "/namespaces/acme/orders")
    assert status == 200 and policies["replication_clusters"] == ["standalone"], policies
    assert policies["bundles"]["numBundles"] == 1
    assert policies["auth_policies"] == {"namespace_auth": {}, "destination_auth": {},
                                         "subscription_auth_roles": {}}

    # A whole Pulsar `Policies` document is accepted on creation; the fields ledgerlake
    # applies are applied.
    full = {"auth_policies": {"namespace_auth": {}, "destination_auth": {},
                              "subscription_auth_roles": {}},
            "replication_clusters": ["standalone"], "bundles": {"numBundles": 4},
            "backlog_quota_map": {}, "deleted": False, "deduplicationEnabled": True,
            "retention_policies": {"retentionTimeInMinutes": 5, "retentionSizeInMB": -1}}
    assert call(svc, "PUT", "/namespaces/acme/full", full)[0] == 204
    assert call(svc, "GET", "/namespaces/acme/full/retention")[1] == {
        "retentionTimeInMinutes": 5, "retentionSizeInMB": -1}
    assert call(svc, "GET", "/namespaces/acme/full/deduplication")[1] is True
    assert call(svc, "GET", "/namespaces/acme") == (200, ["acme/full", "acme/orders"])

    # Deletion rules.
    assert call(svc, "DELETE", "/namespaces/acme/orders")[0] == 409
    assert call(svc, "DELETE", "/tenants/acme")[0] == 409
    assert call(svc, "DELETE", "/tenants/acme?force=true")[0] == 405
    assert call(svc, "DELETE", "/namespaces/acme/orders?force=true")[0] == 405
    assert call(svc, "DELETE", "/clusters/standalone")[0] == 412
    # Granting needs authorization, which is off here.
    assert call(svc, "POST", "/namespaces/acme/full/permissions/app", ["produce"])[0] == 501

    # Everything survives a SIGKILL.
    client.close()
    svc.stop(signal.SIGKILL)
    svc.start()
    assert call(svc, "GET", "/tenants") == (200, ["acme", "public"])
    assert call(svc, "GET", "/namespaces/acme/full/retention")[1]["retentionTimeInMinutes"] == 5

    assert call(svc, "DELETE", "/persistent/acme/orders/x")[0] == 204
    assert call(svc, "DELETE", "/namespaces/acme/orders")[0] == 204
    assert call(svc, "DELETE", "/namespaces/acme/full")[0] == 204
    assert call(svc, "GET", "/namespaces/acme/full")[0] == 404
    assert call(svc, "DELETE", "/tenants/acme")[0] == 204
    assert call(svc, "GET", "/tenants/acme")[0] == 404
    assert call(svc, "GET", "/tenants") == (200, ["public"])


def produce(svc, token, topic, payload=b"x"):
    """Produces one message with `token`; the exception's class name when refused."""
    client = pulsar.Client(svc.url, authentication=pulsar.AuthenticationToken(token),
                           operation_timeout_seconds=10)
    try:
        client.create_producer(topic).send(payload)
        return None
    except pulsar.PulsarException as e:
        return type(e).__name__
    finally:
        client.close()


def subscribe(svc, token, topic, sub="s"):
    client = pulsar.Client(svc.url, authentication=pulsar.AuthenticationToken(token),
                           operation_timeout_seconds=10)
    try:
        consumer = client.subscribe(topic, sub, initial_position=pulsar.InitialPosition.Earliest)
        return consumer.receive(timeout_millis=10_000).data()
    except pulsar.PulsarException as e:
        return type(e).__name__
    finally:
        client.close()


def lookup(svc, token, topic):
    client = pulsar.Client(svc.url, authentication=pulsar.AuthenticationToken(token),
                           operation_timeout_seconds=10)
    try:
        return client.get_topic_partitions(topic)
    except pulsar.PulsarException as e:
        return type(e).__name__
    finally:
        client.close()


@pytest.fixture
def tenants(make_service, tmp_path):
    """A service with authentication on, superuser `root`, tenants `a` and `b` (admins
    `a-admin`, `b-admin`, namespace `ns` each, role `<t>-app` granted produce and consume on
    it) and one message in topic `<t>/ns/t` of each."""
    key = tmp_path / "secret.key"
    token_cli("create-secret-key", "--output", str(key))
    svc = make_service(args=["--auth-token-secret-key", str(key), "--superuser-roles", "root"])
    svc.start()
    tok = {role: make_token("--secret-key", str(key), "--subject", role)
           for role in ["root", "a-admin", "a-app", "b-admin", "b-app", "auditor", "nobody"]}
    for t in ["a", "b"]:
        body = {"adminRoles": [f"{t}-admin"], "allowedClusters": ["standalone"]}
        assert call(svc, "PUT", f"/tenants/{t}", body, token=tok["root"])[0] == 204
        # The tenant's admin creates its namespace and grants its application role.
        assert call(svc, "PUT", f"/namespaces/{t}/ns", token=tok[f"{t}-admin"])[0] == 204
        assert call(svc, "POST", f"/namespaces/{t}/ns/permissions/{t}-app",
                    ["produce", "consume"], token=tok[f"{t}-admin"])[0] == 204
        assert produce(svc, tok[f"{t}-app"], f"persistent://{t}/ns/t", t.encode()) is None
    return svc, tok


def sql_refused(svc, token, table):
    r = psql(svc, f"SELECT count(*) FROM {table}", password=token)
    assert r.returncode != 0 and r.stdout == "", (table, r.stdout)
    assert "not found or not authorized" in r.stderr, r.stderr
    status, body = sql_http(svc, f"SELECT count(*) FROM {table}", token=token)
    assert status == 404 and b"not found or not authorized" in body, (status, body)


def test_isolation_matrix(tenants):
    svc, tok = tenants
    b_topic = "persistent://b/ns/t"
    for role in ["a-admin", "a-app", "nobody"]:
        t = tok[role]
        assert produce(svc, t, b_topic) == "AuthorizationError", role
        assert subscribe(svc, t, b_topic) == "AuthorizationError", role
        assert lookup(svc, t, b_topic) == "AuthorizationError", role
        for path in ["/namespaces/b/ns", "/namespaces/b/ns/permissions", "/namespaces/b",
                     "/persistent/b/ns/t/partitions", "/persistent/b/ns/t/permissions",
                     "/namespaces/b/ns/retention", "/tenants/b", "/tenants", "/clusters"]:
            status, body = call(svc, "GET", path, token=t)
            assert status == 403 and "reason" in body, (role, path, status, body)
        for method, path, body in [
                ("PUT", "/namespaces/b/other", None),
                ("DELETE", "/namespaces/b/ns", None),
                ("POST", f"/namespaces/b/ns/permissions/{role}", ["consume"]),
                ("POST", "/namespaces/b/ns/retention",
                 {"retentionTimeInMinutes": 1, "retentionSizeInMB": 1}),
                ("DELETE", "/persistent/b/ns/t", None),
                ("PUT", "/tenants/c", TENANT),
                ("DELETE", "/tenants/b", None)]:
            status, _ = call(svc, method, path, body, token=t)
            assert status == 403, (role, method, path, status)
        sql_refused(svc, t, "b.ns.t")
        sql_refused(svc, t, '"b"."ns"."t$snapshots"')
        # B's topics are not even listed.
        r = psql(svc, "SELECT table_catalog FROM information_schema.tables "
                 "WHERE table_schema <> 'information_schema'", password=t)
        assert r.returncode == 0 and "b" not in r.stdout.split(), (role, r.stdout)
    assert call(svc, "GET", "/namespaces/b/ns")[0] == 401, "no token at all"

    # A's own roles see A; the app role does not administer it.
    assert subscribe(svc, tok["a-app"], "persistent://a/ns/t") == b"a"
    r = psql(svc, "SELECT count(*) FROM a.ns.t", password=tok["a-app"])
    assert r.returncode == 0 and r.stdout.strip() == "1", r.stderr
    assert call(svc, "GET", "/namespaces/a/ns/permissions", token=tok["a-app"])[0] == 403
    assert call(svc, "GET", "/namespaces/a/ns/permissions", token=tok["a-admin"]) == (
        200, {"a-app": ["produce", "consume"]})

    # The superuser and B's granted role are allowed everything above.
    for role in ["root", "b-app"]:
        assert produce(svc, tok[role], b_topic) is None, role
        assert subscribe(svc, tok[role], b_topic, sub=f"{role}-sub") == b"b", role
        assert lookup(svc, tok[role], b_topic) == [b_topic]
        r = psql(svc, "SELECT count(*) FROM b.ns.t", password=tok[role])
        assert r.returncode == 0 and int(r.stdout.strip()) >= 2, r.stderr
        assert sql_http(svc, "SELECT count(*) AS n FROM b.ns.t", token=tok[role])[0] == 200
    assert call(svc, "GET", "/namespaces/b/ns", token=tok["root"])[0] == 200
    assert call(svc, "GET", "/tenants", token=tok["root"]) == (200, ["a", "b", "public"])

    # Quotas are the superuser's: a tenant admin can neither define a resource group nor attach
    # or detach its own namespace (it may read which one applies).
    quota = {"publishRateInMsgs": 100}
    assert call(svc, "PUT", "/resourcegroups/q", quota, token=tok["b-admin"])[0] == 403
    assert call(svc, "PUT", "/resourcegroups/q", quota, token=tok["root"])[0] == 204
    assert call(svc, "POST", "/namespaces/b/ns/resourcegroup/q", token=tok["b-admin"])[0] == 403
    assert call(svc, "POST", "/namespaces/b/ns/resourcegroup/q", token=tok["root"])[0] == 204
    assert call(svc, "GET", "/namespaces/b/ns/resourcegroup", token=tok["b-admin"]) == (200, "q")
    assert call(svc, "DELETE", "/namespaces/b/ns/resourcegroup", token=tok["b-admin"])[0] == 403
    assert call(svc, "GET", "/namespaces/b/ns/resourcegroup", token=tok["a-admin"])[0] == 403
    assert call(svc, "POST", "/tenants/b/resourcegroup/q", token=tok["b-admin"])[0] == 403
    assert call(svc, "DELETE", "/tenants/b/resourcegroup", token=tok["b-admin"])[0] == 403
    assert call(svc, "POST", "/tenants/b/resourcegroup/q", token=tok["root"])[0] == 204
    # Nor lift a publish rate the operator set, on the namespace or on one topic.
    unlimited = {"publishThrottlingRateInMsg": -1, "publishThrottlingRateInByte": -1}
    for path in ["/namespaces/b/ns/publishRate", "/persistent/b/ns/t/publishRate"]:
        assert call(svc, "POST", path, unlimited, token=tok["b-admin"])[0] == 403, path
        assert call(svc, "DELETE", path, token=tok["b-admin"])[0] == 403, path
        assert call(svc, "POST", path, unlimited, token=tok["root"])[0] == 204, path
    assert call(svc, "GET", "/namespaces/b/ns/publishRate", token=tok["b-admin"]) == (
        200, unlimited)


def test_grants_and_subscription_rules_apply_live_and_persist(tenants):
    svc, tok = tenants
    b_admin, topic = tok["b-admin"], "persistent://b/ns/t"
    # A topic-level grant covers that topic only; it cannot be revoked where it is not set.
    assert call(svc, "POST", "/persistent/b/ns/t/permissions/auditor", ["consume"],
                token=b_admin)[0] == 204
    assert subscribe(svc, tok["auditor"], topic, sub="audit") == b"b"
    assert produce(svc, tok["auditor"], topic) == "AuthorizationError"
    assert subscribe(svc, tok["auditor"], "persistent://b/ns/other") == "AuthorizationError"
    assert call(svc, "GET", "/persistent/b/ns/t/permissions", token=b_admin) == (
        200, {"auditor": ["consume"], "b-app": ["produce", "consume"]})
    assert call(svc, "DELETE", "/persistent/b/ns/t/permissions/b-app", token=b_admin)[0] == 412
    assert call(svc, "POST", "/namespaces/b/ns/permissions/x", ["fly"], token=b_admin)[0] == 400

    # Prefix mode: a subscription's name starts with the role (admins excepted).
    assert call(svc, "POST", "/namespaces/b/ns/subscriptionAuthMode", '"Prefix"',
                token=b_admin)[0] == 204
    assert call(svc, "GET", "/namespaces/b/ns/subscriptionAuthMode", token=b_admin) == (
        200, "Prefix")
    assert subscribe(svc, tok["b-app"], topic, sub="other") == "AuthorizationError"
    assert subscribe(svc, tok["b-app"], topic, sub="b-app-1") == b"b"
    assert subscribe(svc, b_admin, topic, sub="anything") == b"b"
    # Roles listed for a subscription are the only ones that may use it.
    assert call(svc, "POST", "/namespaces/b/ns/permissions/subscription/b-app-locked",
                ["someone-else"], token=b_admin)[0] == 204
    assert subscribe(svc, tok["b-app"], topic, sub="b-app-locked") == "AuthorizationError"
    assert call(svc, "DELETE", "/namespaces/b/ns/permissions/b-app-locked/someone-else",
                token=b_admin)[0] == 204
    assert subscribe(svc, tok["b-app"], topic, sub="b-app-locked") == b"b"

    # Revoking applies to the next request, without restart; the state survives a SIGKILL.
    assert call(svc, "DELETE", "/namespaces/b/ns/permissions/b-app", token=b_admin)[0] == 204
    assert produce(svc, tok["b-app"], topic) == "AuthorizationError"
    sql_refused(svc, tok["b-app"], "b.ns.t")
    svc.stop(signal.SIGKILL)
    svc.start()
    assert produce(svc, tok["b-app"], topic) == "AuthorizationError"
    assert subscribe(svc, tok["auditor"], topic, sub="auditor-2") == b"b"
    assert call(svc, "GET", "/namespaces/b/ns/subscriptionAuthMode", token=b_admin)[1] == "Prefix"
    assert produce(svc, tok["a-app"], "persistent://a/ns/t") is None


def admin_cli(svc, *args, token=None):
    cmd = [_binary(), "admin", "--url", svc.http, *args]
    if token:
        cmd += ["--token", token]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def admin_ok(svc):
    """`ok(*args)`: runs `ledgerlake admin` and returns its stdout, failing on a refusal."""
    def ok(*args):
        r = admin_cli(svc, *args)
        assert r.returncode == 0, (args, r.stderr)
        return r.stdout
    return ok


def test_admin_cli_speaks_pulsar_admins_verbs(fresh_service):
    svc = fresh_service
    svc.start()
    ok = admin_ok(svc)

    ok("tenants", "create", "acme", "--admin-roles", "ops,dev", "--allowed-clusters", "standalone")
    assert ok("tenants", "list") == "acme\npublic\n"
    table = ok("tenants", "get", "acme")
    assert "adminRoles" in table and "ops" in table and "allowedClusters" in table, table
    assert json.loads(ok("tenants", "get", "acme", "--json")) == {
        "adminRoles": ["dev", "ops"], "allowedClusters": ["standalone"]}
    again = admin_cli(svc, "tenants", "create", "acme")
    assert again.returncode != 0 and "409" in again.stderr and "already exists" in again.stderr
    ok("namespaces", "create", "acme/ns")
    assert ok("namespaces", "list", "acme") == "acme/ns\n"
    ok("topics", "create-partitioned-topic", "persistent://acme/ns/p", "-p", "3")
    assert ok("topics", "list-partitioned-topics", "acme/ns") == "persistent://acme/ns/p\n"
    ok("namespaces", "set-publish-rate", "acme/ns", "--msg-publish-rate", "100")
    assert json.loads(ok("namespaces", "get-publish-rate", "acme/ns", "--json")) == {
        "publishThrottlingRateInMsg": 100, "publishThrottlingRateInByte": -1}
    ok("namespaces", "set-backlog-quota", "acme/ns", "--limitSize", "1000000", "--policy",
       "producer_exception")
    assert json.loads(ok("namespaces", "get-backlog-quotas", "acme/ns", "--json")) == {
        "destination_storage": {"limitSize": 1000000, "limitTime": -1,
                                "policy": "producer_exception"}}
    ok("namespaces", "set-message-ttl", "acme/ns", "--messageTTL", "60")
    assert json.loads(ok("namespaces", "get-message-ttl", "acme/ns", "--json")) == 60
    ok("namespaces", "set-dispatch-rate", "acme/ns", "--msg-dispatch-rate", "100")
    assert json.loads(ok("namespaces", "get-dispatch-rate", "acme/ns", "--json"))[
        "dispatchThrottlingRateInMsg"] == 100
    ok("namespaces", "set-max-consumers-per-topic", "acme/ns", "4")
    assert json.loads(ok("namespaces", "get-limit", "acme/ns", "max-consumers-per-topic",
                         "--json")) == 4
    refused = admin_cli(svc, "namespaces", "grant-permission", "acme/ns", "--role", "app",
                        "--actions", "produce")
    assert refused.returncode != 0 and "501" in refused.stderr, refused.stderr
    assert admin_cli(svc, "namespaces", "create", "not-a-namespace").returncode != 0
    ok("topics", "delete", "persistent://acme/ns/p", "--partitioned")
    ok("namespaces", "delete", "acme/ns")
    ok("tenants", "delete", "acme")
    assert ok("tenants", "list") == "public\n"
