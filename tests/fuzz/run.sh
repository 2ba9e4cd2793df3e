#!/usr/bin/env bash
# Coverage-guided fuzzing of every decoder of received or stored bytes, one target after the
# other, each for SECONDS (default 300), with libFuzzer through cargo-fuzz; then one line per
# target: runs, execs/s, coverage, corpus size and findings (crash/leak/timeout artifacts).
#
#   tests/fuzz/run.sh [SECONDS] [TARGET…]
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`). Works on the stable toolchain: RUSTC_BOOTSTRAP
# lets cargo-fuzz pass its nightly-only flags, and `-s none` builds without a sanitizer (the
# crate forbids unsafe code; libFuzzer still finds panics, aborts, timeouts and OOMs). A `--dev`
# build (dependencies optimised as in the service's own dev profile, see Cargo.toml here) takes
# about a quarter of an hour on 2 cores the first time; the instrumented build has its own target
# directory ($FUZZ_TARGET_DIR, default /var/tmp/ll-fuzz-target) so it never disturbs the main
# build's. Corpora grow in tests/fuzz/corpus/TARGET, findings land in tests/fuzz/artifacts/TARGET
# (both ignored by git); a finding makes this script exit non-zero.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_EACH="${1:-300}"
shift || true
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  TARGETS=(frame_decoder batch_entry single_message_view journal_record recovery_scan stored_formats)
fi
export RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-/var/tmp/ll-fuzz-target}"
FUZZ=(cargo fuzz run --dev --fuzz-dir tests/fuzz -s none)
cargo fuzz build --dev --fuzz-dir tests/fuzz -s none
LOGS="$(mktemp -d)"
status=0
for t in "${TARGETS[@]}"; do
  mkdir -p "tests/fuzz/corpus/$t" "tests/fuzz/artifacts/$t"
  before=$(ls "tests/fuzz/artifacts/$t" | wc -l)
  echo "fuzzing $t for ${SECONDS_EACH}s" >&2
  "${FUZZ[@]}" "$t" -- -max_total_time="$SECONDS_EACH" -print_final_stats=1 \
    >"$LOGS/$t.log" 2>&1 || true
  after=$(ls "tests/fuzz/artifacts/$t" | wc -l)
  runs=$(grep -a -o 'stat::number_of_executed_units: *[0-9]*' "$LOGS/$t.log" | grep -o '[0-9]*$' || echo '?')
  speed=$(grep -a -o 'stat::average_exec_per_sec: *[0-9]*' "$LOGS/$t.log" | grep -o '[0-9]*$' || echo '?')
  cov=$(grep -a -E '^#[0-9]+' "$LOGS/$t.log" | tail -1 | grep -a -o 'cov: [0-9]* ft: [0-9]*' || echo '?')
  corpus=$(ls "tests/fuzz/corpus/$t" | wc -l)
  findings=$((after - before))
  printf '%-20s runs %-10s execs/s %-7s %-22s corpus %-6s findings %s\n' \
    "$t" "$runs" "$speed" "$cov" "$corpus" "$findings"
  if [ "$findings" -ne 0 ]; then
    status=1
    echo "  see $LOGS/$t.log and tests/fuzz/artifacts/$t" >&2
  fi
done
exit "$status"
