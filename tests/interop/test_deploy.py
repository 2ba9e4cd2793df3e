"""The deployment files under deploy/ (Dockerfile, compose stack and three-node cluster,
Prometheus alert rules, Grafana dashboard, Helm chart and its rendered manifests; the chart's
cluster profile is test_deploy_cluster.py's) checked without a container engine or a cluster: every YAML parses; the compose
files and the chart are consistent with themselves, with the image and with the config loader
(`ledgerlake config check`, each cluster node's own variables included); the rendered Kubernetes
manifests pass the Kubernetes API schemas (kubernetes-validate); and every metric the alert
rules and the dashboard query is one that a live `GET /metrics` really serves."""
import hashlib
import json
import re
import shlex
import subprocess
import tomllib
import urllib.request

import kubernetes_validate
import promql_parser
import pulsar
from prometheus_client.parser import text_string_to_metric_families

from conftest import eventually
from deployfiles import (ALERTS, CHART, CHART_CONFIG, CLUSTER_CONFIG, COMPOSE_CLUSTER,
                         COMPOSE_CONFIG, DASHBOARD, DEPLOY, K8S_VERSION, RENDERED, ROOT,
                         assert_plain_lines_rendered, binary, compose, compose_env,
                         config_check, config_show, dockerfile_instructions, load_yaml_docs,
                         rendered_docs, values)

# What the brief of each file promises it covers.
ALERTED = {
    "ledgerlake_partition_hot", "ledgerlake_subscription_lag_growing",
    "pulsar_storage_backlog_age_seconds", "ledgerlake_offload_lag_seconds",
    "ledgerlake_offload_lag_bytes", "ledgerlake_lake_commit_failures_total",
    "ledgerlake_data_dir_available_bytes", "ledgerlake_data_dir_size_bytes",
}
CHARTED = {
    "ledgerlake_journal_fsync_seconds_bucket", "ledgerlake_journal_group_commit_batches_bucket",
    "ledgerlake_lake_commit_seconds_bucket", "ledgerlake_lake_commit_failures_total",
    "ledgerlake_replay_entries_total", "ledgerlake_sql_queries_total",
    "ledgerlake_sql_query_seconds_bucket", "ledgerlake_offload_lag_seconds",
    "ledgerlake_partition_hot", "ledgerlake_subscription_lag_growing",
    "ledgerlake_data_dir_available_bytes", "ledgerlake_data_dir_size_bytes",
    "pulsar_rate_in", "pulsar_rate_out", "pulsar_msg_backlog",
    "pulsar_storage_backlog_age_seconds",
}


# --- YAML, compose -------------------------------------------------------------------------


def test_every_yaml_under_deploy_parses():
    files = [p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml")
             and "templates" not in p.relative_to(DEPLOY).parts]
    expected = {"compose.yaml", "compose.cluster.yaml", "prometheus/prometheus.yml", "prometheus/alerts.yml",
                "grafana/provisioning/datasources/prometheus.yaml",
                "grafana/provisioning/dashboards/dashboards.yaml", "helm/ledgerlake/Chart.yaml",
                "helm/ledgerlake/values.yaml", "helm/rendered/ledgerlake.yaml"}
    assert expected <= {str(p.relative_to(DEPLOY)) for p in files}, files
    for path in files:
        docs = load_yaml_docs(path)
        assert docs and all(isinstance(d, dict) for d in docs), path
    json.loads(DASHBOARD.read_text())


def test_compose_stack_is_complete_and_consistent():
    c = compose()
    services = c["services"]
    main = {"ledgerlake", "minio", "postgres", "prometheus", "grafana"}
    assert main <= set(services), set(services)
    declared_volumes = set(c.get("volumes") or {})
    for name in main:
        s = services[name]
        assert s.get("image") or s.get("build"), name
        assert s.get("ports"), f"{name} publishes no port"
        for p in s["ports"]:
            assert str(p).startswith("127.0.0.1:"), f"{name}: {p} is not on loopback"
        assert s.get("volumes"), f"{name} has no volume"
        hc = s.get("healthcheck") or {}
        assert hc.get("test") and hc["test"][0] in ("CMD", "CMD-SHELL"), name
        for v in s["volumes"]:
            source = v.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in declared_volumes, f"{name}: volume {source} not declared"
    # The image, built from the repository root with deploy/Dockerfile.
    ll = services["ledgerlake"]
    build = ll["build"]
    assert (DEPLOY / build["context"]).resolve() == ROOT
    assert (ROOT / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
    assert {"6650", "8080", "5433"} == {str(p).rsplit(":", 1)[1] for p in ll["ports"]}
    assert "http://127.0.0.1:8080/health/ready" in ll["healthcheck"]["test"]
    deps = ll["depends_on"]
    assert deps["minio"]["condition"] == "service_healthy"
    assert deps["postgres"]["condition"] == "service_healthy"
    assert deps["minio-init"]["condition"] == "service_completed_successfully"
    assert any(v.endswith(":/var/lib/ledgerlake") for v in ll["volumes"])
    assert "./compose/ledgerlake.toml:/etc/ledgerlake/ledgerlake.toml:ro" in ll["volumes"]
    # Prometheus: the scrape target is the ledgerlake service's HTTP port; rules are mounted.
    prom = load_yaml_docs(DEPLOY / "prometheus" / "prometheus.yml")[0]
    job = prom["scrape_configs"][0]
    assert job["static_configs"][0]["targets"] == ["ledgerlake:8080"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services["prometheus"]["volumes"]}
    for rule_file in prom["rule_files"]:
        assert (DEPLOY / mounts[rule_file]).resolve() == ALERTS
    # Grafana: provisioning and the dashboard folder the provider reads are mounted.
    gmounts = {v.split(":")[1]: v.split(":")[0] for v in services["grafana"]["volumes"]}
    assert (DEPLOY / gmounts["/etc/grafana/provisioning"]).resolve() == \
        DEPLOY / "grafana" / "provisioning"
    provider = load_yaml_docs(DEPLOY / "grafana/provisioning/dashboards/dashboards.yaml")[0]
    path = provider["providers"][0]["options"]["path"]
    assert (DEPLOY / gmounts[path] / "ledgerlake.json").resolve() == DASHBOARD
    ds = load_yaml_docs(DEPLOY / "grafana/provisioning/datasources/prometheus.yaml")[0]
    assert ds["datasources"][0]["type"] == "prometheus"
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"


def test_compose_ledgerlake_config_loads_and_points_at_the_stack():
    """compose/ledgerlake.toml plus the service's LEDGERLAKE_* environment goes through the
    config loader, and names the stack's MinIO bucket and PostgreSQL database."""
    c = compose()
    services = c["services"]
    config_check(COMPOSE_CONFIG)
    env = compose_env(services["ledgerlake"])
    assert env and all(k.startswith("LEDGERLAKE_") for k in env), env
    config_check(COMPOSE_CONFIG, env)
    cfg = config_show(COMPOSE_CONFIG, env)
    assert cfg["data_dir"] == "/var/lib/ledgerlake"
    lake = cfg["lake"]
    assert lake["enabled"] is True
    assert lake["s3"]["endpoint"] == "http://minio:9000"
    assert lake["s3"]["path_style"] is True
    minio = compose_env(services["minio"])
    assert lake["s3"]["access_key_id"] == minio["MINIO_ROOT_USER"]
    assert lake["s3"]["secret_access_key"] == minio["MINIO_ROOT_PASSWORD"]
    bucket = re.match(r"s3://([^/]+)/", lake["warehouse"]).group(1)
    init = " ".join(services["minio-init"]["command"])
    assert f"mb --ignore-existing lake/{bucket}" in init, init
    pg = compose_env(services["postgres"])
    assert lake["catalog"]["kind"] == "sql"
    assert lake["catalog"]["uri"] == (f"postgres://{pg['POSTGRES_USER']}:"
                                      f"{pg['POSTGRES_PASSWORD']}@postgres:5432/"
                                      f"{pg['POSTGRES_DB']}")
    assert cfg["broker"]["advertised_address"] == "localhost:6650"


def test_compose_cluster_is_three_nodes_on_one_etcd_and_one_lake():
    """compose.cluster.yaml: three nodes of the single stack's image, each with its own
    listeners, volume and health check, on the one etcd its `etcd` service serves and the one
    lake (MinIO bucket, PostgreSQL catalog) of its other services; each node's configuration
    (cluster.toml plus its environment) goes through the config loader."""
    c = load_yaml_docs(COMPOSE_CLUSTER)[0]
    services = c["services"]
    nodes = [f"ledgerlake-{i}" for i in (1, 2, 3)]
    assert set(nodes) | {"etcd", "minio", "minio-init", "postgres"} <= set(services)
    single = compose()["services"]["ledgerlake"]
    etcd = services["etcd"]
    assert etcd["network_mode"] == "host" and etcd.get("healthcheck", {}).get("test")
    etcd_url = next(a.split("=", 1)[1] for a in etcd["command"]
                    if a.startswith("--advertise-client-urls="))
    assert etcd_url.startswith("http://127.0.0.1:")
    declared_volumes = set(c.get("volumes") or {})
    # host ip:port → service (the nodes, on the host's network, reach these).
    published = {str(p).rsplit(":", 1)[0]: name for name in ("minio", "postgres")
                 for p in services[name]["ports"]}
    configs, ids, addrs = [], set(), set()
    for name in nodes:
        n = services[name]
        assert (n["image"], n["build"]) == (single["image"], single["build"]), name
        assert n["network_mode"] == "host" and "ports" not in n, name
        assert n["entrypoint"] == ["ledgerlake", "serve", "--config",
                                   "/etc/ledgerlake/ledgerlake.toml"], name
        deps = {"etcd": {"condition": "service_healthy"},
                "minio-init": {"condition": "service_completed_successfully"},
                "postgres": {"condition": "service_healthy"}}
        if name != nodes[0]:  # the first node makes the catalog's tables
            deps[nodes[0]] = {"condition": "service_healthy"}
        assert n["depends_on"] == deps, name
        assert "./compose/cluster.toml:/etc/ledgerlake/ledgerlake.toml:ro" in n["volumes"]
        [data] = [v.split(":")[0] for v in n["volumes"] if v.endswith(":/var/lib/ledgerlake")]
        assert data in declared_volumes, name
        env = compose_env(n)
        assert env and all(k.startswith("LEDGERLAKE_") for k in env), env
        config_check(CLUSTER_CONFIG, env)
        cfg = config_show(CLUSTER_CONFIG, env)
        server = cfg["server"]
        for key in ("pulsar_addr", "http_addr", "pg_addr", "bookie_addr"):
            assert server[key].startswith("127.0.0.1:"), (name, key, server[key])
            addrs.add(server[key])
        advertised = cfg["broker"]["advertised_address"]
        assert advertised == server["pulsar_addr"], name
        # A node's id: its advertised host and its HTTP port.
        ids.add(advertised.rsplit(":", 1)[0] + ":" + server["http_addr"].rsplit(":", 1)[1])
        assert n["healthcheck"]["test"] == [
            "CMD", "curl", "-fsS", f"http://{server['http_addr']}/health/ready"], name
        assert cfg["metadata"]["url"] == etcd_url.replace("http://", "etcd://"), name
        lake = cfg["lake"]
        assert published.get(lake["s3"]["endpoint"].removeprefix("http://")) == "minio", lake
        catalog = re.search(r"@([^/]+)/", lake["catalog"]["uri"]).group(1)
        assert published.get(catalog) == "postgres", lake["catalog"]["uri"]
        configs.append(cfg)
    assert len(addrs) == 4 * len(nodes) and len(ids) == len(nodes), (addrs, ids)
    # One lake: the same warehouse and catalog on every node; its bucket is the one made.
    assert len({(c["lake"]["warehouse"], c["lake"]["catalog"]["uri"]) for c in configs}) == 1
    bucket = re.match(r"s3://([^/]+)/", configs[0]["lake"]["warehouse"]).group(1)
    init = " ".join(services["minio-init"]["command"])
    assert f"mb --ignore-existing lake/{bucket}" in init, init
    pg = compose_env(services["postgres"])
    assert configs[0]["lake"]["catalog"]["uri"].endswith(f"/{pg['POSTGRES_DB']}")


# --- Dockerfile ----------------------------------------------------------------------------


def test_dockerfile_is_multi_stage_non_root_and_healthchecked():
    ins = dockerfile_instructions()
    froms = [a for i, a in ins if i == "FROM"]
    assert len(froms) >= 2, froms
    assert re.match(r"rust:\S*bookworm AS builder$", froms[0]), froms[0]
    assert froms[-1] == "debian:bookworm-slim", froms[-1]
    runs = " ".join(a for i, a in ins if i == "RUN")
    assert "cargo build --release --locked --bin ledgerlake" in runs
    assert "ca-certificates" in runs and "curl" in runs
    assert "--uid 10001" in runs and "ledgerlake" in runs
    users = [a for i, a in ins if i == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), users
    assert users[-1].split(":")[0] in ("10001", "ledgerlake")
    hc = [a for i, a in ins if i == "HEALTHCHECK"]
    assert len(hc) == 1 and "curl -fsS http://127.0.0.1:8080/health/ready" in hc[0], hc
    expose = [a for i, a in ins if i == "EXPOSE"]
    assert expose and set(expose[-1].split()) == {"6650", "8080", "5433"}
    entry = json.loads([a for i, a in ins if i == "ENTRYPOINT"][-1])
    assert entry[:2] == ["ledgerlake", "serve"], entry
    flags = dict(zip(entry[2::2], entry[3::2]))
    assert flags == {"--config": "/etc/ledgerlake/ledgerlake.toml",
                     "--data-dir": "/var/lib/ledgerlake",
                     "--pulsar-addr": "0.0.0.0:6650", "--http-addr": "0.0.0.0:8080",
                     "--pg-addr": "0.0.0.0:5433"}, flags
    serve_help = subprocess.run([binary(), "serve", "--help"], capture_output=True,
                                text=True, timeout=60).stdout
    for flag in flags:
        assert flag in serve_help, flag
    # Every COPY from the build context exists; the config file is the chart's.
    for i, a in ins:
        if i == "COPY" and not a.startswith("--from"):
            src, dst = shlex.split(a)
            if src != ".":
                assert (ROOT / src).exists(), src
            if dst == "/etc/ledgerlake/ledgerlake.toml":
                assert (ROOT / src).resolve() == CHART_CONFIG
    ignored = (ROOT / ".dockerignore").read_text().split()
    for entry in (".git/", "target/", ".venv/", "data/"):
        assert entry in ignored, entry


# --- Helm chart ----------------------------------------------------------------------------


def test_chart_config_is_the_default_file_with_container_addresses():
    defaults = tomllib.loads((DEPLOY / "ledgerlake.toml").read_text())
    chart = tomllib.loads(CHART_CONFIG.read_text())
    assert chart["data_dir"] == "/var/lib/ledgerlake"
    for key, port in (("pulsar_addr", 6650), ("http_addr", 8080), ("pg_addr", 5433)):
        assert chart["server"][key] == f"0.0.0.0:{port}"
        chart["server"][key] = defaults["server"][key]
    chart["data_dir"] = defaults["data_dir"]
    assert chart == defaults, "files/ledgerlake.toml drifted from deploy/ledgerlake.toml"
    config_check(CHART_CONFIG)
    config_check(DEPLOY / "ledgerlake.toml")


def test_rendered_manifests_pass_the_kubernetes_schemas():
    docs = rendered_docs()
    assert [d["kind"] for d in docs] == ["ConfigMap", "Service", "Service", "StatefulSet",
                                         "ServiceMonitor"]
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":
            continue  # a CRD: no schema in kubernetes-validate; checked below
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    # The ServiceMonitor, by hand (monitoring.coreos.com/v1).
    cm, svc, headless, sts, sm = docs
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(sm) == {"apiVersion", "kind", "metadata", "spec"}
    spec = sm["spec"]
    assert set(spec) <= {"selector", "namespaceSelector", "endpoints", "jobLabel"}, spec
    assert spec["namespaceSelector"] == {"matchNames": ["default"]}

    def selects(service):
        labels = service["metadata"]["labels"]
        sel = spec["selector"]
        if any(labels.get(k) != v for k, v in sel.get("matchLabels", {}).items()):
            return False
        for e in sel.get("matchExpressions", []):
            op, key = e["operator"], e["key"]
            ok = {"Exists": lambda: key in labels,
                  "DoesNotExist": lambda: key not in labels,
                  "In": lambda: labels.get(key) in e["values"],
                  "NotIn": lambda: labels.get(key) not in e["values"]}[op]()
            if not ok:
                return False
        return True

    assert selects(svc) and not selects(headless), "scrape the pod once, through the Service"
    assert len(spec["endpoints"]) == 1
    ep = spec["endpoints"][0]
    assert set(ep) <= {"port", "path", "interval", "scrapeTimeout", "scheme"}, ep
    assert ep["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert ep["path"] == "/metrics"
    for key in ("interval", "scrapeTimeout"):
        assert re.fullmatch(r"[0-9]+(ms|s|m|h)", ep[key]), ep
    # The Services route to the container's named ports; the StatefulSet uses the headless one.
    container = sts["spec"]["template"]["spec"]["containers"][0]
    cports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert cports == {"pulsar": 6650, "http": 8080, "postgres": 5433}
    for s in (svc, headless):
        assert {p["targetPort"] for p in s["spec"]["ports"]} == set(cports)
        assert s["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    assert headless["spec"]["clusterIP"] == "None"
    assert sts["spec"]["serviceName"] == headless["metadata"]["name"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= \
        sts["spec"]["template"]["metadata"]["labels"].items()


def test_rendered_manifests_are_what_the_chart_renders_with_default_values():
    """No helm binary here: deploy/helm/rendered/ledgerlake.yaml is written by hand. It must
    hold every template's plain lines in order, and the values' figures where templates put
    them."""
    vals = values()
    chart = load_yaml_docs(CHART / "Chart.yaml")[0]
    assert_plain_lines_rendered(RENDERED, vals)
    cm, svc, headless, sts, sm = rendered_docs()
    # ConfigMap: the chart's file, byte for byte; the checksum annotation is its sha256.
    text = CHART_CONFIG.read_text(encoding="utf-8")
    assert vals["config"] == ""
    assert cm["data"]["ledgerlake.toml"] == text
    pod = sts["spec"]["template"]
    assert pod["metadata"]["annotations"]["checksum/config"] == \
        hashlib.sha256(text.encode()).hexdigest()
    # Labels and names of a release called ledgerlake.
    labels = {"helm.sh/chart": f"{chart['name']}-{chart['version']}",
              "app.kubernetes.io/name": chart["name"], "app.kubernetes.io/instance": "ledgerlake",
              "app.kubernetes.io/version": str(chart["appVersion"]),
              "app.kubernetes.io/managed-by": "Helm"}
    for doc in (cm, svc, sts, sm):
        assert doc["metadata"]["labels"] == labels, doc["kind"]
        assert doc["metadata"]["name"] == "ledgerlake"
    assert headless["metadata"]["name"] == "ledgerlake-headless"
    # Values where the templates use them.
    c = pod["spec"]["containers"][0]
    tag = vals["image"]["tag"] or chart["appVersion"]
    assert c["image"] == f"{vals['image']['repository']}:{tag}"
    assert c["imagePullPolicy"] == vals["image"]["pullPolicy"]
    assert c["resources"] == vals["resources"]
    assert c["securityContext"] == vals["securityContext"]
    assert pod["spec"]["securityContext"] == vals["podSecurityContext"]
    assert pod["spec"]["terminationGracePeriodSeconds"] == vals["terminationGracePeriodSeconds"]
    assert {e["name"]: e["value"] for e in c["env"]} == {
        "LEDGERLAKE_BROKER__ADVERTISED_ADDRESS":
            f"ledgerlake.default.svc:{vals['service']['ports']['pulsar']}"}
    assert "args" not in c and not vals["extraArgs"]
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == vals["service"]["ports"]
    assert svc["spec"]["type"] == vals["service"]["type"]
    pvc = sts["spec"]["volumeClaimTemplates"][0]
    assert pvc["spec"]["resources"]["requests"]["storage"] == vals["persistence"]["size"]
    assert pvc["spec"]["accessModes"] == vals["persistence"]["accessModes"]
    assert vals["serviceMonitor"]["enabled"] is True
    ep = sm["spec"]["endpoints"][0]
    assert ep["interval"] == vals["serviceMonitor"]["interval"]
    assert ep["scrapeTimeout"] == vals["serviceMonitor"]["scrapeTimeout"]
    # What the image needs: its uid, its data and config paths, its health endpoints.
    assert pod["spec"]["securityContext"]["runAsUser"] == 10001
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["data"] == "/var/lib/ledgerlake" and pvc["metadata"]["name"] == "data"
    assert mounts["config"] == "/etc/ledgerlake"
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["config"]["configMap"]["name"] == cm["metadata"]["name"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/health/ready", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/health/live", "port": "http"}
    assert sts["spec"]["replicas"] == 1
    # Output format of `helm template`: "---\n# Source: …\n<document>\n" per manifest.
    raw = RENDERED.read_text(encoding="utf-8")
    assert raw.startswith("---\n# Source: ") and raw.endswith("\n") and not raw.endswith("\n\n")
    # One node: no bookie listener, no cluster (test_cluster_manifests_… covers that mode).
    assert not vals["cluster"]["enabled"] and "bookie" not in {p["name"] for p in c["ports"]}
    assert "bookie" not in {p["name"] for p in headless["spec"]["ports"]}


# --- alert rules and dashboard -------------------------------------------------------------

TOKEN = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h",
                "$topic": ".*"}


def metric_names(expr):
    """Metric identifiers in a PromQL expression: tokens starting pulsar_ or ledgerlake_,
    outside quoted label values."""
    unquoted = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    return {t for t in TOKEN.findall(unquoted) if t.startswith(("pulsar_", "ledgerlake_"))}


def alert_rules():
    return [r for g in load_yaml_docs(ALERTS)[0]["groups"] for r in g["rules"]]


def dashboard_panels():
    def walk(panels):
        for p in panels:
            yield p
            yield from walk(p.get("panels", []))
    return list(walk(json.loads(DASHBOARD.read_text())["panels"]))


def dashboard_exprs():
    """Every PromQL query of the dashboard: panel targets and variable queries."""
    d = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard_panels() for t in p.get("targets", [])]
    variables = []
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            variables += [q, v.get("definition", q)]
    return exprs, variables


def test_alert_rules_and_dashboard_queries_are_well_formed():
    rules = alert_rules()
    names = set()
    for r in rules:
        assert r["alert"] and r["expr"], r
        promql_parser.parse(r["expr"])
        assert r["labels"]["severity"] in ("warning", "critical"), r
        assert r["annotations"]["summary"] and r["annotations"]["description"], r
        if "for" in r:
            assert re.fullmatch(r"[0-9]+[smh]", r["for"]), r
        names |= metric_names(r["expr"])
    assert ALERTED <= names, ALERTED - names
    assert any("increase(ledgerlake_lake_commit_failures_total[" in r["expr"] for r in rules)
    exprs, variables = dashboard_exprs()
    assert exprs
    for e in exprs:
        for var, sub in GRAFANA_VARS.items():
            e = e.replace(var, sub)
        assert "$" not in e, e
        promql_parser.parse(e)
    assert "label_values(pulsar_rate_in, topic)" in variables
    charted = set().union(*(metric_names(e) for e in exprs))
    assert CHARTED <= charted, CHARTED - charted
    d = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard_panels()]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for p in dashboard_panels():
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert all(t["datasource"] == p["datasource"] for t in p["targets"]), p["title"]
    assert {v["name"] for v in d["templating"]["list"]} == {"datasource", "topic"}


def scrape(svc):
    """{sample name: [labels]} of one GET /metrics."""
    with urllib.request.urlopen(f"{svc.http}/metrics", timeout=30) as r:
        text = r.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append(s.labels)
    return samples


def test_alerts_and_dashboard_query_only_metrics_that_metrics_serves(make_service):
    svc = make_service()
    svc.start()
    topic = "persistent://public/default/deploycheck"
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    try:
        # A subscription first, so that the subscription families have a series.
        consumer = client.subscribe(topic, "watch", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(20):
            producer.send(f"m{i}".encode())
        for _ in range(10):
            consumer.acknowledge(consumer.receive(timeout_millis=10_000))
        req = urllib.request.Request(f"{svc.http}/sql", method="POST",
                                     data=b"SELECT count(*) FROM deploycheck",
                                     headers={"Content-Type": "text/plain"})
        with urllib.request.urlopen(req, timeout=120) as r:
            assert r.status == 200

        def traffic_shows():
            samples = scrape(svc)
            assert any(l.get("topic") == topic for l in samples.get("pulsar_rate_in", []))
            assert any(l.get("subscription") == "watch"
                       for l in samples.get("ledgerlake_subscription_lag_growing", []))
            assert samples.get("ledgerlake_sql_queries_total")
            assert samples.get("ledgerlake_replay_entries_total")
            return samples

        samples = eventually(traffic_shows, timeout=30)
        producer.close()
        consumer.close()
    finally:
        client.close()

    # Labels the alert annotations name are labels of the series they alert on (or the
    # target labels Prometheus adds).
    for r in alert_rules():
        names = metric_names(r["expr"])
        if not names or not names <= set(samples):
            continue  # reported by the name check below
        have = {"instance", "job"}.union(*(set(l) for n in names for l in samples[n]))
        text = " ".join(r["annotations"].values())
        used = set(re.findall(r"\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)", text))
        assert used <= have, (r["alert"], used - have)

    exprs, variables = dashboard_exprs()
    wanted = {}
    for r in alert_rules():
        for n in metric_names(r["expr"]):
            wanted.setdefault(n, []).append(f"{ALERTS.name}: {r['alert']}")
    for e in exprs + variables:
        for n in metric_names(e):
            wanted.setdefault(n, []).append(f"{DASHBOARD.name}: {e}")
    missing = {n: wanted[n] for n in sorted(set(wanted) - set(samples))}
    assert not missing, ("metrics queried but not served by GET /metrics: "
                         + ", ".join(missing) + f"\n{json.dumps(missing, indent=1)}")
