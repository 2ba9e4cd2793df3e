//! A real etcd server process on 127.0.0.1 for tests (the Debian package `etcd-server`, which
//! `tests/run.sh` installs; `LL_ETCD_BIN` names another binary). Stopped by its PID on drop.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

type TestResult<T> = Result<T, Box<dyn std::error::Error>>;

/// One single-member etcd cluster in a temporary directory.
pub(crate) struct TestEtcd {
    /// Invariant: running until drop.
    child: Child,
    dir: tempfile::TempDir,
    /// `host:port` of the client listener.
    pub(crate) client_addr: SocketAddr,
}

fn free_port() -> TestResult<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl TestEtcd {
    /// Starts etcd and waits until it accepts connections. The ports are picked free and then
    /// released, so another test may take one first: etcd then exits with "address already in
    /// use", and it is started again on new ports (up to three tries).
    pub(crate) fn start() -> TestResult<Self> {
        let mut tries = 0;
        loop {
            tries += 1;
            match Self::start_once() {
                Err(e) if tries < 3 && e.to_string().contains("address already in use") => {}
                started => return started,
            }
        }
    }

    fn start_once() -> TestResult<Self> {
        let bin = std::env::var("LL_ETCD_BIN").unwrap_or_else(|_| "etcd".into());
        let dir = tempfile::tempdir()?;
        let client = format!("http://127.0.0.1:{}", free_port()?);
        let peer = format!("http://127.0.0.1:{}", free_port()?);
        let log = std::fs::File::create(dir.path().join("etcd.log"))?;
        let child = Command::new(&bin)
            .arg("--name=default")
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=default={peer}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| {
                format!(
                    "starting '{bin}' (Debian package etcd-server; tests/run.sh installs it): {e}"
                )
            })?;
        let client_addr: SocketAddr = client.trim_start_matches("http://").parse()?;
        let mut server = TestEtcd {
            child,
            dir,
            client_addr,
        };
        server.wait_ready()?;
        Ok(server)
    }

    fn wait_ready(&mut self) -> TestResult<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                let log = std::fs::read_to_string(self.dir.path().join("etcd.log"))?;
                return Err(format!("etcd exited ({status}): {log}").into());
            }
            if TcpStream::connect_timeout(&self.client_addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err("etcd did not listen within 30 s".into())
    }

    /// An `etcd://` URL of this server with a key prefix.
    pub(crate) fn url(&self, prefix: &str) -> String {
        format!("etcd://{}{prefix}", self.client_addr)
    }
}

impl Drop for TestEtcd {
    fn drop(&mut self) {
        // Best effort: the process may have exited already.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
