//! Helpers shared by the integration tests.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A two-worker runtime for tests that drive async code from a plain `#[test]`.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

/// Path of the `ledgerlake` binary built for these tests.
pub fn ledgerlake_bin() -> &'static str {
    env!("CARGO_BIN_EXE_ledgerlake")
}

/// A free port on 127.0.0.1 (bound then released).
pub fn free_addr() -> std::io::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    l.local_addr()
}

/// Minimal HTTP/1.1 GET returning (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Ok((status, body))
}

/// Polls `GET path` until it answers `want` or the deadline passes.
pub fn wait_for_status(addr: SocketAddr, path: &str, want: u16, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok((status, _)) = http_get(addr, path) {
            if status == want {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// A child process that is killed (by PID) when dropped, if still running.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Sends `signal` to the process `pid`.
pub fn signal(child: &Child, sig: rustix::process::Signal) -> std::io::Result<()> {
    let pid = rustix::process::Pid::from_raw(child.id() as i32)
        .ok_or_else(|| std::io::Error::other("invalid pid"))?;
    rustix::process::kill_process(pid, sig).map_err(std::io::Error::from)
}

/// Waits for the child to exit, up to `within`.
pub fn wait_exit(
    child: &mut Child,
    within: Duration,
) -> std::io::Result<Option<std::process::ExitStatus>> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(None)
}

/// Starts `ledgerlake serve` on `data_dir` with stderr captured to `log_path`.
pub fn spawn_serve(
    data_dir: &Path,
    http: SocketAddr,
    extra: &[&str],
    log_path: &Path,
) -> std::io::Result<ChildGuard> {
    let log = std::fs::File::create(log_path)?;
    let child = Command::new(ledgerlake_bin())
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--http-addr")
        .arg(http.to_string())
        .args(["--pg-addr", "127.0.0.1:0"])
        .args(extra)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?;
    Ok(ChildGuard(child))
}
