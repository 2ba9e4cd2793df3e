"""The Helm chart's cluster profile (cluster.enabled): its hand-rendered manifests make each pod
a node of one cluster, checked against the Kubernetes API schemas, the chart's values and the
config loader; and the chart's own etcd, whose rendered members' flags are run with a real etcd
under a real node."""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request

import kubernetes_validate
import pulsar

from conftest import _free_port, eventually
from deployfiles import (CHART_CLUSTER_CONFIG, CLUSTER_VALUES, COMPOSE_CLUSTER, K8S_VERSION,
                         RENDERED_CLUSTER, assert_plain_lines_rendered, config_check,
                         config_show, load_yaml_docs, rendered_docs, values)


def test_cluster_manifests_make_each_pod_a_node_of_one_cluster():
    """The chart with cluster.enabled (RENDERED_CLUSTER): `replicas` pods, each advertising its
    own pod DNS name (its node id) for Pulsar and its bookie listener, on the one etcd; what
    Kubernetes gives each pod goes through the config loader."""
    vals = values()
    vals["cluster"] = dict(vals["cluster"], **CLUSTER_VALUES)
    text = CHART_CLUSTER_CONFIG.read_text(encoding="utf-8")
    vals["config"] = text
    assert_plain_lines_rendered(RENDERED_CLUSTER, vals)
    docs = rendered_docs(RENDERED_CLUSTER)
    for doc in docs:
        if doc["kind"] != "ServiceMonitor":
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    # `helm template`'s order: by kind, then by template file (etcd.yaml first).
    etcd_pdb, pdb, cm, etcd_svc, svc, headless, etcd_sts, sts, sm = docs
    assert [d["kind"] for d in docs] == ["PodDisruptionBudget"] * 2 + ["ConfigMap"] + \
        ["Service"] * 3 + ["StatefulSet"] * 2 + ["ServiceMonitor"]
    assert [d["metadata"]["name"] for d in (etcd_pdb, etcd_svc, etcd_sts)] == \
        ["ledgerlake-etcd"] * 3
    # One node at a time may be stopped voluntarily, and the nodes spread over hosts.
    assert pdb["kind"] == "PodDisruptionBudget"
    assert pdb["spec"]["maxUnavailable"] == vals["cluster"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == sts["spec"]["selector"]
    assert vals["cluster"]["antiAffinity"] == "soft" and not vals["affinity"]
    (term,) = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"] == sts["spec"]["selector"]
    # The cluster's config (one lake every node reaches), as the ConfigMap and its checksum.
    assert cm["data"]["ledgerlake.toml"] == text
    assert sts["spec"]["template"]["metadata"]["annotations"]["checksum/config"] == \
        hashlib.sha256(text.encode()).hexdigest()
    shared = config_show(CHART_CLUSTER_CONFIG)["lake"]
    assert shared["warehouse"].startswith("s3://"), shared
    assert shared["catalog"]["uri"].startswith("postgres://"), shared
    assert sts["spec"]["replicas"] == CLUSTER_VALUES["replicas"]
    assert sts["spec"]["serviceName"] == headless["metadata"]["name"]
    assert headless["spec"]["publishNotReadyAddresses"] is True
    c = sts["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert {p["name"]: (p["port"], p["targetPort"]) for p in headless["spec"]["ports"]}[
        "bookie"] == (3181, "bookie") and ports["bookie"] == 3181
    assert "bookie" not in {p["name"] for p in svc["spec"]["ports"]}  # nodes only
    etcd_url = check_chart_etcd(vals, (etcd_pdb, etcd_svc, etcd_sts), (svc, headless, sts))
    # The nodes' ServiceMonitor scrapes the node Service only (not etcd's).
    sm_labels = sm["spec"]["selector"]["matchLabels"]
    assert sm_labels.items() <= svc["metadata"]["labels"].items()
    assert not sm_labels.items() <= etcd_svc["metadata"]["labels"].items()
    # Kubernetes expands $(VAR) from the variables defined before it, in order.
    env, pod_name = [], None
    for e in c["env"]:
        if "valueFrom" in e:
            assert e["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}, e
            pod_name = e["name"]
            continue
        for ref in re.findall(r"\$\((\w+)\)", e["value"]):
            assert ref == pod_name, (e, "refers to a variable not defined before it")
        env.append((e["name"], e["value"]))
    assert pod_name == "POD_NAME" and all(k.startswith("LEDGERLAKE_") for k, _ in env), env
    ids = set()
    for i in range(CLUSTER_VALUES["replicas"]):
        pod = f"{sts['metadata']['name']}-{i}"
        pod_env = {k: v.replace("$(POD_NAME)", pod) for k, v in env}
        config_check(CHART_CLUSTER_CONFIG, pod_env)
        cfg = config_show(CHART_CLUSTER_CONFIG, pod_env)
        host = f"{pod}.{headless['metadata']['name']}.default.svc"
        assert cfg["metadata"]["url"] == etcd_url
        assert cfg["broker"]["advertised_address"] == f"{host}:{ports['pulsar']}"
        server = cfg["server"]
        assert server["bookie_addr"] == f"0.0.0.0:{ports['bookie']}"
        listener = server["bookie_listener_name"]
        assert server["bookie_advertised_listeners"] == {listener: f"{host}:{ports['bookie']}"}
        # A node's id: its advertised host and its HTTP port.
        ids.add(f"{host}:{server['http_addr'].rsplit(':', 1)[1]}")
    assert len(ids) == CLUSTER_VALUES["replicas"], ids


def check_chart_etcd(vals, etcd_docs, node_docs):
    """The chart's etcd (no cluster.metadataUrl given): cluster.etcd.replicas members in a
    StatefulSet of their own, each named after its pod and listing every member's pod DNS name
    as its initial cluster; neither its selectors nor the nodes' select the other's pods.
    Returns the metadata URL the nodes get: every member's client address."""
    etcd = vals["cluster"]["etcd"]
    pdb, svc, sts = etcd_docs
    name, replicas = sts["metadata"]["name"], etcd["replicas"]
    assert sts["spec"]["replicas"] == replicas == 3
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"] == name
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    labels = sts["spec"]["template"]["metadata"]["labels"]
    for selector in (svc["spec"]["selector"], sts["spec"]["selector"]["matchLabels"],
                     pdb["spec"]["selector"]["matchLabels"]):
        assert selector.items() <= labels.items()
    node_svc, node_headless, node_sts = node_docs
    node_labels = node_sts["spec"]["template"]["metadata"]["labels"]
    for selector in (node_svc["spec"]["selector"], node_headless["spec"]["selector"]):
        assert not selector.items() <= labels.items(), "a node Service selects etcd's pods"
    assert not svc["spec"]["selector"].items() <= node_labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1, "a majority of 3 stays up"
    pod = sts["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == etcd["image"] == compose_etcd_image()
    assert c["resources"] == etcd["resources"]
    assert pod["securityContext"] == vals["podSecurityContext"]
    assert c["securityContext"] == vals["securityContext"]
    assert c["env"] == [{"name": "POD_NAME",
                         "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    flags = dict(f.removeprefix("--").split("=", 1) for f in c["command"][1:])
    assert c["command"][0] == "etcd"
    hosts = [f"{name}-{i}.{name}.default.svc" for i in range(replicas)]
    assert flags["name"] == "$(POD_NAME)"
    assert flags["initial-cluster"] == ",".join(
        f"{name}-{i}=http://{h}:2380" for i, h in enumerate(hosts))
    assert flags["initial-advertise-peer-urls"] == f"http://$(POD_NAME).{name}.default.svc:2380"
    assert flags["advertise-client-urls"] == f"http://$(POD_NAME).{name}.default.svc:2379"
    assert flags["initial-cluster-state"] == "new"
    assert (flags["auto-compaction-mode"], flags["auto-compaction-retention"]) == \
        ("periodic", "1h"), "history is dropped, or the database fills its quota"
    mount = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["data"]
    assert flags["data-dir"].startswith(mount + "/")
    pvc = sts["spec"]["volumeClaimTemplates"][0]
    assert pvc["metadata"]["name"] == "data"
    assert pvc["spec"]["resources"]["requests"]["storage"] == etcd["storage"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"client": 2379, "peer": 2380, "metrics": 2381}
    assert flags["listen-metrics-urls"].endswith(":2381")
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "metrics"}
    assert {p["name"]: p["targetPort"] for p in svc["spec"]["ports"]} == \
        {"client": "client", "peer": "peer"}
    return "etcd://" + ",".join(f"{h}:2379" for h in hosts)


def compose_etcd_image():
    return load_yaml_docs(COMPOSE_CLUSTER)[0]["services"]["etcd"]["image"]


def test_the_charts_etcd_members_form_one_cluster_that_a_node_uses(make_service, tmp_path):
    """The chart's etcd flags, run by the etcd the tests use: the rendered StatefulSet's three
    members, each given its pod's name, on 127.0.0.1 (each member DNS name and 0.0.0.0 listener
    mapped to a free loopback port, nothing else changed) form one cluster. A node given the
    rendered metadata URL, mapped the same way, joins it. It keeps serving new topics, and its
    session (the default lease of 10 s) lives on, while each member in turn hangs (SIGSTOP)
    and after one is killed."""
    docs = rendered_docs(RENDERED_CLUSTER)
    sts = sts_of(docs, "ledgerlake-etcd")
    name, replicas = sts["metadata"]["name"], sts["spec"]["replicas"]
    command = sts["spec"]["template"]["spec"]["containers"][0]["command"]
    pods = [f"{name}-{i}" for i in range(replicas)]
    ports = {p: {n: _free_port() for n in (2379, 2380, 2381)} for p in pods}

    def mapped(text, pod=None):
        for other, theirs in ports.items():
            for port in (2379, 2380):
                text = text.replace(f"{other}.{name}.default.svc:{port}",
                                    f"127.0.0.1:{theirs[port]}")
        if pod is not None:
            for port, mine in ports[pod].items():
                text = text.replace(f"0.0.0.0:{port}", f"127.0.0.1:{mine}")
        return text

    procs = []
    try:
        for pod in pods:
            args = [mapped(a.replace("$(POD_NAME)", pod), pod) for a in command[1:]]
            args = [a.replace("/var/lib/etcd/", f"{tmp_path}/{pod}/") for a in args]
            assert not any("0.0.0.0" in a or ".svc" in a for a in args), args
            procs.append(subprocess.Popen([shutil.which("etcd")] + args,
                                          stdout=subprocess.DEVNULL,
                                          stderr=open(tmp_path / f"{pod}.log", "ab")))

        def healthy():
            for pod in pods:
                url = f"http://127.0.0.1:{ports[pod][2381]}/health"
                try:
                    with urllib.request.urlopen(url, timeout=5) as r:
                        assert json.load(r)["health"] == "true"
                except OSError as e:
                    raise AssertionError(f"{pod}: {e}") from e
        eventually(healthy, timeout=60, interval=0.5)
        first = f"http://127.0.0.1:{ports[pods[0]][2379]}"
        req = urllib.request.Request(f"{first}/v3/cluster/member/list", data=b"{}")
        with urllib.request.urlopen(req, timeout=5) as r:
            members = json.load(r)["members"]
        assert sorted(m["name"] for m in members) == pods

        node_url = next(e["value"] for e in
                        sts_of(docs, "ledgerlake")["spec"]["template"]["spec"]["containers"][0]["env"]
                        if e["name"] == "LEDGERLAKE_METADATA__URL")
        ttl = 10  # metadata.session_ttl's default
        node = make_service(args=["--metadata-url", mapped(node_url) + "/chart",
                                  "--bookie-addr", f"127.0.0.1:{_free_port()}"])
        node.start()
        client = pulsar.Client(node.url, operation_timeout_seconds=30)

        def serves(topic):
            """A new topic (new metadata) takes a message, and the node's session outlives a
            lifetime of its lease (three renewals, by the members that answer)."""
            producer = client.create_producer(f"persistent://public/default/{topic}")
            producer.send(b"one")
            time.sleep(ttl)
            producer.send(b"two")
            log = open(node.log_path, errors="replace").read()
            assert "coordination session lost" not in log

        try:
            serves("chart-etcd-0")
            # Each member hangs in turn (whichever holds the node's lease stream or watches).
            for i, pod in enumerate(pods):
                os.kill(procs[i].pid, signal.SIGSTOP)
                try:
                    serves(f"chart-etcd-stopped-{i}")
                finally:
                    os.kill(procs[i].pid, signal.SIGCONT)
                eventually(healthy, timeout=30, interval=0.5)
            # A member of three lost: the other two are a majority, and the node goes on.
            procs[0].kill()
            procs[0].wait()
            serves("chart-etcd-killed")
            log = open(node.log_path, errors="replace").read()
            assert "does not answer; requests go to the others" in log
            assert "answers again; requests go to it" in log
        finally:
            client.close()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def sts_of(docs, name):
    return next(d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == name)
