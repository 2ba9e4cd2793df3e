//! `ledgerlake perf log` runs end to end and reports consistent figures.

use std::process::Command;

use crate::common::*;

/// Runs `ledgerlake perf <args> --json` and returns its JSON report (stderr on failure).
fn perf_json(args: &[&str]) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let out = Command::new(ledgerlake_bin())
        .arg("perf")
        .args(args)
        .arg("--json")
        .output()?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned().into());
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

#[test]
fn perf_log_reports_throughput_latency_and_baseline() -> TestResult {
    let dir = tempfile::tempdir()?;
    let dir_arg = dir.path().to_string_lossy().into_owned();
    let report = perf_json(&[
        "log",
        "--dir",
        &dir_arg,
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
    ])?;
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

#[test]
fn perf_produce_and_consume_against_a_running_service() -> TestResult {
    let dir = tempfile::tempdir()?;
    let http = free_addr()?;
    let pulsar = free_addr()?;
    let mut service = spawn_serve(
        &dir.path().join("data"),
        http,
        &["--pulsar-addr", &pulsar.to_string()],
        &dir.path().join("serve.log"),
    )?;
    assert!(wait_for_status(
        http,
        "/health/ready",
        200,
        std::time::Duration::from_secs(60)
    ));
    let url = format!("pulsar://{pulsar}");
    let produced = perf_json(&[
        "produce",
        "--service-url",
        &url,
        "--duration",
        "1s",
        "--rate",
        "5000",
        "--batch-max-messages",
        "10",
    ])?;
    let sent = produced["messages"].as_u64().ok_or("messages")?;
    assert!(sent >= 1000, "{produced}");
    assert!(produced["latency"]["count"].as_u64() > Some(0));

    let consumed = perf_json(&["consume", "--service-url", &url, "--duration", "2s"])?;
    assert_eq!(consumed["messages"].as_u64(), Some(sent), "{consumed}");

    // A partitioned topic: created through the admin API, produced to and consumed from every
    // partition.
    let topic = "persistent://public/default/perf-parts";
    let admin = format!("http://{http}");
    let run = |args: &[&str]| {
        let common = ["--service-url", &url, "--topic", topic, "--partitions", "3"];
        perf_json(&[args, &common[..]].concat())
    };
    let produced = run(&[
        "produce",
        "--admin-url",
        &admin,
        "--duration",
        "1s",
        "--rate",
        "3000",
        "--batch-max-messages",
        "10",
    ])?;
    let sent = produced["messages"].as_u64().ok_or("messages")?;
    let (status, body) = http_get(
        http,
        "/admin/v2/persistent/public/default/perf-parts/partitions",
    )?;
    assert_eq!((status, body.as_str()), (200, r#"{"partitions":3}"#));
    let consumed = run(&["consume", "--duration", "2s"])?;
    assert_eq!(consumed["messages"].as_u64(), Some(sent), "{consumed}");

    signal(&service.0, rustix::process::Signal::TERM)?;
    assert!(
        wait_exit(&mut service.0, std::time::Duration::from_secs(30))?.is_some_and(|s| s.success())
    );
    Ok(())
}
