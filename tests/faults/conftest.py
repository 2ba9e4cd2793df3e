"""Fixtures of the fault suite (issue 20): the interop suite's fixtures (services started by PID,
the S3 and PostgreSQL servers), plus the checks every fault test ends with.

The fault tests run in their own pytest session (`tests/run.sh` runs `pytest tests/faults`
after the interop tests), so this file loads the interop conftest under another module name
and re-exports it; the interop helpers (`lake`, `servers`) are importable as in interop tests.

Environment:
  LL_TEST_BIN        the ledgerlake binary (a debug build: failpoints are compiled in)
  LL_SOAK=1          the long mode: every round count multiplied (see `rounds`)
"""
import importlib.util
import json
import os
import subprocess
import sys
import urllib.request

import pulsar

HERE = os.path.dirname(os.path.abspath(__file__))
INTEROP = os.path.join(os.path.dirname(HERE), "interop")
sys.path.insert(0, INTEROP)

_spec = importlib.util.spec_from_file_location("interop_conftest",
                                               os.path.join(INTEROP, "conftest.py"))
_interop = importlib.util.module_from_spec(_spec)
sys.modules["interop_conftest"] = _interop
_spec.loader.exec_module(_interop)

# Fixtures and hooks: pytest collects them from this module's namespace.
fresh_service = _interop.fresh_service
dedup_service = _interop.dedup_service
make_service = _interop.make_service
s3_server = _interop.s3_server
postgres = _interop.postgres
pytest_runtest_makereport = _interop.pytest_runtest_makereport
# Helpers the tests import with `from conftest import …`.
Service = _interop.Service
Sends = _interop.Sends
eventually = _interop.eventually
_binary = _interop._binary


def soak():
    """True in the long mode (`LL_SOAK=1`)."""
    return os.environ.get("LL_SOAK", "0") not in ("", "0")


def rounds(normal, soak_rounds):
    """How many rounds a repeated fault runs: `normal` in the test command, `soak_rounds` with
    LL_SOAK=1; `LL_FAULT_ROUNDS` overrides both."""
    if os.environ.get("LL_FAULT_ROUNDS"):
        return int(os.environ["LL_FAULT_ROUNDS"])
    return soak_rounds if soak() else normal


def verify_clean(svc, *topics, deep=True):
    """Runs `ledgerlake verify --json` against `svc` (every topic unless `topics` are given) and
    asserts it found nothing: no gap, no duplicate, no missing or unreadable file. Returns the
    report."""
    args = [_binary(), "verify", "--url", svc.http, "--json"]
    if deep:
        args.append("--deep")
    args += list(topics) if topics else ["--all"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    try:
        doc = json.loads(r.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"verify printed no JSON (exit {r.returncode}): {r.stdout}{r.stderr}")
    assert r.returncode == 0 and doc["clean"], json.dumps(doc, indent=1)[:4000] + r.stderr
    return doc


def read_all(client, topic):
    """Every message's payload from the earliest, read with a reader."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    while reader.has_message_available():
        got.append(reader.read_next(timeout_millis=30000).data())
    reader.close()
    return got


def close_quietly(client):
    """Closes a Pulsar client whose service may be gone (killed by the test): the client's
    close then fails (NotConnected), which says nothing about the service."""
    try:
        client.close()
    except Exception:  # pulsar's errors for a service that is gone
        pass


def metric(svc, name):
    """Sum of the samples of metric `name` (no labels expected)."""
    with urllib.request.urlopen(f"{svc.http}/metrics", timeout=30) as r:
        text = r.read().decode()
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    assert found, f"no metric {name}"
    return total
