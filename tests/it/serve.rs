//! `ledgerlake serve`: zero-config start, health endpoints, graceful shutdown on SIGTERM and
//! SIGINT, config refusal, and `--help` everywhere.

use std::process::Command;
use std::time::Duration;

use rustix::process::Signal;

use crate::common::*;

#[test]
fn serve_reports_health_and_shuts_down_gracefully() -> TestResult {
    for (sig, name) in [(Signal::TERM, "SIGTERM"), (Signal::INT, "SIGINT")] {
        let dir = tempfile::tempdir()?;
        let data = dir.path().join("data");
        let http = free_addr()?;
        let log_path = dir.path().join("serve.log");
        let mut child = spawn_serve(&data, http, &["--log-format", "json"], &log_path)?;
        assert!(
            wait_for_status(http, "/health/ready", 200, Duration::from_secs(60)),
            "service never became ready; log:\n{}",
            std::fs::read_to_string(&log_path)?
        );
        let (status, body) = http_get(http, "/health/live")?;
        assert_eq!(status, 200);
        assert!(body.contains("live"), "{body}");
        assert!(data.join("ledger/segments").is_dir());
        assert!(data.join("metadata.db").is_file());

        signal(&child.0, sig)?;
        let status = wait_exit(&mut child.0, Duration::from_secs(30))?
            .ok_or("serve did not exit after the signal")?;
        let log = std::fs::read_to_string(&log_path)?;
        assert!(
            status.success(),
            "exit status {status:?} after {name}; log:\n{log}"
        );
        assert!(
            log.contains("shutdown complete"),
            "no clean shutdown after {name}:\n{log}"
        );
        for line in log.lines().filter(|l| !l.trim().is_empty()) {
            serde_json::from_str::<serde_json::Value>(line)
                .map_err(|e| format!("--log-format json wrote a non-JSON line ({e}): {line}"))?;
        }
    }
    Ok(())
}

#[test]
fn serve_refuses_unknown_config_keys_naming_them() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "[ledger]\nrolover_size = \"1 MiB\"\n")?;
    let out = Command::new(ledgerlake_bin())
        .args(["serve", "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(dir.path().join("d"))
        .output()?;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("rolover_size"),
        "error does not name the key: {err}"
    );

    let out = Command::new(ledgerlake_bin())
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("d"))
        .env("LEDGERLAKE_LEDGER__SEGMENT_SIZE", "8 GiB")
        .output()?;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ledger.segment_size"), "{err}");
    Ok(())
}

#[test]
fn a_taken_port_is_reported_as_such_after_the_lake_started() -> TestResult {
    // The PostgreSQL port is bound last, after the lake, replay and SQL runtimes started: the
    // failure must be the bind error, not a panic from dropping those runtimes.
    let dir = tempfile::tempdir()?;
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = taken.local_addr()?.port();
    let out = Command::new(ledgerlake_bin())
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("d"))
        .args(["--pulsar-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .args(["--pg-addr", &format!("127.0.0.1:{port}")])
        .output()?;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains(&port.to_string()) && err.contains("postgres"),
        "{err}"
    );
    drop(taken);
    Ok(())
}

#[test]
fn every_subcommand_has_help() -> TestResult {
    for args in [
        vec!["--help"],
        vec!["serve", "--help"],
        vec!["config", "--help"],
        vec!["config", "show", "--help"],
        vec!["config", "check", "--help"],
        vec!["config", "schema", "--help"],
        vec!["perf", "--help"],
        vec!["perf", "log", "--help"],
    ] {
        let out = Command::new(ledgerlake_bin()).args(&args).output()?;
        assert!(out.status.success(), "{args:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Usage:"), "{args:?}: {text}");
        // Every flag (except clap's own) is followed by an explanation line.
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let t = line.trim_start();
            let is_flag =
                t.starts_with("--") || (t.starts_with('-') && t.chars().nth(2) == Some(','));
            if !is_flag || t.contains("--help") || t.contains("--version") {
                continue;
            }
            let explained = lines
                .get(i + 1)
                .is_some_and(|next| !next.trim().is_empty() && !next.trim_start().starts_with('-'));
            assert!(explained, "{args:?}: flag without explanation: {t}");
        }
    }
    let out = Command::new(ledgerlake_bin())
        .args(["config", "check", "--config"])
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/deploy/ledgerlake.toml"
        ))
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
