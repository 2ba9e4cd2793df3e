"""What the deployment tests read of deploy/ (compose files, the chart, its hand-rendered
manifests, the Dockerfile), and the config loader they check it against
(`ledgerlake config check` / `config show` of the binary under test)."""
import os
import re
import subprocess
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "ledgerlake"
CHART_CONFIG = CHART / "files" / "ledgerlake.toml"
RENDERED = DEPLOY / "helm" / "rendered" / "ledgerlake.yaml"
# `helm template ledgerlake deploy/helm/ledgerlake --set cluster.enabled=true
#  --set-file config=deploy/helm/ledgerlake/files/cluster.toml`, written by hand as RENDERED is
# (the nodes on the chart's own etcd).
RENDERED_CLUSTER = DEPLOY / "helm" / "rendered" / "ledgerlake-cluster.yaml"
CHART_CLUSTER_CONFIG = CHART / "files" / "cluster.toml"
CLUSTER_VALUES = {"enabled": True, "replicas": 3}
COMPOSE = DEPLOY / "compose.yaml"
COMPOSE_CONFIG = DEPLOY / "compose" / "ledgerlake.toml"
COMPOSE_CLUSTER = DEPLOY / "compose.cluster.yaml"
CLUSTER_CONFIG = DEPLOY / "compose" / "cluster.toml"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "ledgerlake.json"

# The Kubernetes version the rendered manifests are validated against (kubernetes-validate's
# bundled schemas, strict: unknown fields are errors).
K8S_VERSION = "1.32.0"


def binary():
    return os.environ["LL_TEST_BIN"]


def clean_env(extra=None):
    """The environment without LEDGERLAKE_* (`config check` applies the environment)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERLAKE_")}
    env.update(extra or {})
    return env


def config_check(path, env=None):
    run = subprocess.run([binary(), "config", "check", "--config", str(path)],
                         capture_output=True, text=True, env=clean_env(env), timeout=60)
    assert run.returncode == 0, (path, run.stdout, run.stderr)


def config_show(path, env=None):
    run = subprocess.run([binary(), "config", "show", "--config", str(path)],
                         capture_output=True, text=True, env=clean_env(env), timeout=60)
    assert run.returncode == 0, (path, run.stdout, run.stderr)
    return tomllib.loads(run.stdout)


def load_yaml_docs(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def compose():
    return load_yaml_docs(COMPOSE)[0]


def interpolate(value):
    """Compose's variable interpolation with nothing set: `${V:-default}` is the default,
    `${V}` empty, `$$` a literal `$`."""
    value = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}",
                   lambda m: m.group(2) or "", value)
    return value.replace("$$", "$")


def compose_env(service):
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    return {k: interpolate(str(v)) for k, v in env.items()}


def rendered(path=RENDERED):
    """[(source template, document)] of the rendered chart, in order."""
    text = path.read_text(encoding="utf-8")
    out = []
    for chunk in re.split(r"(?m)^---\n(?=# Source: )", text)[1:]:
        first, _, rest = chunk.partition("\n")
        assert first.startswith("# Source: ledgerlake/templates/"), first
        out.append((first.removeprefix("# Source: ledgerlake/"), rest))
    return out


def rendered_docs(path=RENDERED):
    return [yaml.safe_load(body) for _, body in rendered(path)]


def values():
    return load_yaml_docs(CHART / "values.yaml")[0]


def dockerfile_instructions():
    """[(INSTRUCTION, arguments)] with line continuations joined and comments dropped."""
    lines, cur = [], ""
    for raw in (DEPLOY / "Dockerfile").read_text().splitlines():
        if not cur and (raw.strip().startswith("#") or not raw.strip()):
            continue
        if raw.rstrip().endswith("\\"):
            cur += raw.rstrip()[:-1] + " "
            continue
        cur += raw
        word, _, args = cur.strip().partition(" ")
        lines.append((word.upper(), args.strip()))
        cur = ""
    return lines


def template_literal_lines(path, vals):
    """The lines of a template that are plain text (no action) and that default values render:
    blocks of `{{- with .Values.x }}` / `{{- if .Values.x }}` are kept when x is truthy, and of
    `{{- if not .Values.x }}` when it is not."""
    stack, out = [], []
    for line in path.read_text().splitlines():
        s = line.strip()
        m = re.fullmatch(r"\{\{-? (with|if|if not) \.Values\.([A-Za-z0-9_.]+) -?\}\}", s)
        if m:
            v = vals
            for part in m.group(2).split("."):
                v = (v or {}).get(part)
            stack.append(bool(v) != (m.group(1) == "if not"))
            continue
        if re.fullmatch(r"\{\{-? end -?\}\}", s):
            stack.pop()
            continue
        assert not re.search(r"\{\{-? ?(if|with|range|else)\b", s), f"{path}: {s}"
        if "{{" in s or not s or s == "---" or not all(stack):
            continue
        out.append(line)
    assert not stack, path
    return out


def assert_plain_lines_rendered(path, vals):
    """Every template's plain lines that `vals` render are in rendered file `path`, in order."""
    parts = rendered(path)
    templates = sorted(p for p in (CHART / "templates").glob("*.yaml"))
    # A template renders unless all of it is in a block `vals` leave out (helm then prints
    # nothing of it).
    expected = {p: template_literal_lines(p, vals) for p in templates}
    assert sorted({src for src, _ in parts}) == \
        sorted(f"templates/{p.name}" for p, lines in expected.items() if lines)
    for template in templates:
        body = "\n".join(b for src, b in parts if src == f"templates/{template.name}")
        body = body.splitlines()
        i = 0
        for line in expected[template]:
            while i < len(body) and body[i] != line:
                i += 1
            assert i < len(body), f"{template.name}: {line!r} missing or out of order in {path}"
            i += 1
