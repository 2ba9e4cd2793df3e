//! `ledgerlake perf log` runs end to end and reports consistent figures.

use std::process::Command;

use crate::common::*;

#[test]
fn perf_log_reports_throughput_latency_and_baseline() -> TestResult {
    let dir = tempfile::tempdir()?;
    let out = Command::new(ledgerlake_bin())
        .args(["perf", "log", "--dir"])
        .arg(dir.path())
        .args([
            "--writers",
            "1,4",
            "--size",
            "100",
            "--duration",
            "1s",
            "--warmup",
            "200ms",
            "--window",
            "64",
            "--json",
        ])
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let runs = report["runs"].as_array().ok_or("no runs")?;
    assert_eq!(runs.len(), 2);
    for run in runs {
        let messages = run["messages"].as_u64().ok_or("messages")?;
        assert!(messages > 0, "{run}");
        assert_eq!(run["latency"]["count"].as_u64(), Some(messages));
        assert!(run["latency"]["p99_us"].as_u64() >= run["latency"]["p50_us"].as_u64());
        assert_eq!(run["sync"], "always");
    }
    assert!(
        report["baseline"]["bandwidth"]["mb_per_s"]
            .as_f64()
            .ok_or("baseline")?
            > 0.0
    );
    // The run directories are removed afterwards.
    let left: Vec<_> = std::fs::read_dir(dir.path())?.collect();
    assert!(left.is_empty(), "perf left files behind: {left:?}");
    Ok(())
}
