"""With authentication on, every admin route needs a valid token (401 without), health stays
open, and the same token works on the binary protocol, the admin API and SQL (issue 16)."""
import json
import urllib.error
import urllib.request

import pulsar


def _call(svc, method, path, body=None, token=None):
    req = urllib.request.Request(svc.http + path, method=method,
                                 data=body.encode() if body is not None else None)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_admin_routes_require_a_token_when_authentication_is_on(auth_service):
    svc = auth_service
    svc.start()
    topic = "persistent://public/default/guarded"
    client = pulsar.Client(svc.url, authentication=pulsar.AuthenticationToken("s3cret"),
                           operation_timeout_seconds=10)
    client.create_producer(topic).send(b"kept")
    client.close()

    assert _call(svc, "GET", "/health/live")[0] == 200
    assert _call(svc, "GET", "/health/ready")[0] == 200

    routes = [
        ("GET", "/admin/v2/persistent/public/default/guarded/stats", None),
        ("GET", "/admin/v2/namespaces/public/default/deduplication", None),
        ("POST", "/admin/v2/namespaces/public/default/deduplication", "true"),
        ("PUT", "/admin/v2/namespaces/public/default/offloadThreshold", "1"),
        ("PUT", "/admin/v2/persistent/public/default/other/partitions", "2"),
        ("PUT", "/admin/v2/persistent/public/default/guarded/offload", None),
        ("DELETE", "/admin/v2/persistent/public/default/guarded?force=true", None),
        ("POST", "/sql", "SELECT 1"),
    ]
    for method, path, body in routes:
        for token in (None, "wrong"):
            status, text = _call(svc, method, path, body, token)
            assert status == 401, (method, path, token, status, text)
            assert "reason" in json.loads(text), text

    # Nothing was changed by the refused requests.
    status, text = _call(svc, "GET", "/admin/v2/namespaces/public/default/deduplication",
                         token="s3cret")
    assert (status, text) == (200, "false")
    status, text = _call(svc, "GET", "/admin/v2/persistent/public/default/other/partitions",
                         token="s3cret")
    assert (status, json.loads(text)) == (200, {"partitions": 0}), text
    status, text = _call(svc, "POST", "/sql", "SELECT count(*) AS n FROM guarded",
                         token="s3cret")
    assert status == 200 and json.loads(text) == [{"n": 1}], text

    # With the token, a forced delete goes through.
    status, text = _call(svc, "DELETE", "/admin/v2/persistent/public/default/guarded?force=true",
                         token="s3cret")
    assert status == 204, text
