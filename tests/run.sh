#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine: installs what the tests need, then runs the
# lints, builds every test once and runs them. `.ci/run` calls exactly this script.
#
#   tests/run.sh
#
# Environment:
#   CARGO_TARGET_DIR   build directory (default /var/tmp/ledgerlake-target, outside the clone,
#                      so CI reuses the previous build; a cold build also fits CI's limit)
#   LEDGERLAKE_SKIP_INSTALL=1   do not try to install system packages
#   LL_SOAK=1          the long mode (the fault suite's 200 SIGKILL rounds and more, 50 rounds
#                      of killing a cluster's writer; about an hour more)
#   LL_FAULT_ROUNDS=N  the SIGKILL rounds of the fault suite, whatever the mode
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/ledgerlake-target}"
export CARGO_TERM_COLOR=never
export CARGO_INCREMENTAL=0
export RUST_BACKTRACE=1

step() { printf '\n==> %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }

# --- 1. System packages (only what is missing) --------------------------------------------
if [ "${LEDGERLAKE_SKIP_INSTALL:-0}" != 1 ]; then
  missing=()
  command -v cc >/dev/null 2>&1 || missing+=(build-essential)
  command -v git >/dev/null 2>&1 || missing+=(git)
  command -v python3 >/dev/null 2>&1 || missing+=(python3)
  python3 -m venv --help >/dev/null 2>&1 || missing+=(python3-venv)
  # The pulsar crate (a test client) generates its protocol code with protoc at build time.
  command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
  # A real PostgreSQL server (Iceberg SQL catalog tests) and psql.
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
  command -v psql >/dev/null 2>&1 || missing+=(postgresql-client)
  command -v runuser >/dev/null 2>&1 || missing+=(util-linux)
  # A real etcd server: the cluster's metadata store and coordination (started by the tests on
  # 127.0.0.1, on ports of their own).
  command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
  # RSA keys for the encrypted-topic replay test.
  command -v openssl >/dev/null 2>&1 || missing+=(openssl)
  if [ ${#missing[@]} -gt 0 ]; then
    step "installing system packages: ${missing[*]}"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
  fi
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: install the Rust toolchain (https://rustup.rs) first" >&2
  exit 1
fi

# --- 2. Python side: the official Pulsar client and pytest, in a venv inside the clone --------
VENV=".venv"
if [ ! -x "$VENV/bin/python" ]; then
  step "creating $VENV"
  python3 -m venv "$VENV"
fi
step "installing Python test packages"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r tests/interop/requirements.txt

# --- 3. Lints -----------------------------------------------------------------------------
step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy -D warnings"
cargo clippy --locked --all-targets -- -D warnings

# --- 4. Build once, then run everything ------------------------------------------------------
step "cargo test --no-run"
cargo test --locked --no-run
step "cargo test"
cargo test --locked -- --test-threads 2
step "interop tests (official Python pulsar-client, PyIceberg, DuckDB, S3 and PostgreSQL servers)"
PATH="$PWD/$VENV/bin:$PATH" LL_TEST_BIN="$CARGO_TARGET_DIR/debug/ledgerlake" "$VENV/bin/python" -m pytest -q -p no:logging \
  -p no:cacheprovider --durations=15 tests/interop
step "fault suite (SIGKILL rounds, failpoints, S3 and catalog faults, full disk; LL_SOAK=1: the long soak)"
PATH="$PWD/$VENV/bin:$PATH" LL_TEST_BIN="$CARGO_TARGET_DIR/debug/ledgerlake" "$VENV/bin/python" -m pytest -q -p no:logging \
  -p no:cacheprovider --durations=15 tests/faults
step "done"
