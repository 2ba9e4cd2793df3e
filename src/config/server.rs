//! Configuration of the service's listeners: the addresses it binds, what it advertises to
//! the other nodes, and the TLS material its listeners share.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Listen addresses of the service's surfaces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Pulsar binary protocol listener (`pulsar://`).
    pub pulsar_addr: SocketAddr,
    /// HTTP: admin API, metrics, health (`/health/live`, `/health/ready`) and SQL.
    pub http_addr: SocketAddr,
    /// PostgreSQL wire protocol listener for SQL (also offers SSL when a certificate is set).
    pub pg_addr: SocketAddr,
    /// Pulsar binary protocol over TLS (`pulsar+ssl://`), with `tls_cert_file`. Unset: off.
    pub pulsar_tls_addr: Option<SocketAddr>,
    /// Node-to-node bookie listener: the other nodes of a cluster replicate ledgers to this
    /// node's bookie and read them there. With authentication on it serves only nodes that
    /// present a superuser token (`broker.authentication.node_token`); with `bookie_tls` it
    /// speaks TLS only. Unset: off (a single node needs none).
    pub bookie_addr: Option<SocketAddr>,
    /// Other addresses, by listener name, at which the other nodes can reach this node's bookie
    /// listener (through NAT, a load balancer or a proxy), advertised in its registration, as
    /// Pulsar's `advertisedListeners`. Empty: only the address it is bound to.
    pub bookie_advertised_listeners: BTreeMap<String, String>,
    /// The listener name this node reaches the other nodes' bookies by, as Pulsar's
    /// `internalListenerName`: a node that advertises a listener of this name is dialled there,
    /// any other at its bound bookie address. Unset: always the bound address.
    pub bookie_listener_name: Option<String>,
    /// The bookie listener speaks TLS only, with `tls_cert_file` and `tls_key_file` (its
    /// registration says so, and the other nodes dial it over TLS). Off: plain TCP.
    pub bookie_tls: bool,
    /// PEM file of the certificate authorities this node trusts for the other nodes' TLS bookie
    /// listeners; needed to reach any node with `bookie_tls` on.
    pub bookie_tls_trust_certs_file: Option<PathBuf>,
    /// HTTPS listener (the same routes as `http_addr`), with `tls_cert_file`. Unset: off.
    pub https_addr: Option<SocketAddr>,
    /// PEM file of the server's certificate chain (leaf first) for every TLS listener; with it
    /// the PostgreSQL listener accepts `sslmode=require` and stronger.
    pub tls_cert_file: Option<PathBuf>,
    /// PEM file of the certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub tls_key_file: Option<PathBuf>,
    /// Largest HTTP request body accepted (admin API, `POST /sql`): a larger one is refused
    /// with 413, from its `Content-Length` before any of it is read, or once a body sent
    /// without one passes the limit.
    #[schemars(with = "String")]
    pub max_request_body: ByteSize,
    /// How long an HTTP client has to send a request's head (its request line and headers);
    /// a slower one is disconnected (slow loris).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub http_header_read_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            pulsar_addr: SocketAddr::from(([127, 0, 0, 1], 6650)),
            http_addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            pg_addr: SocketAddr::from(([127, 0, 0, 1], 5433)),
            pulsar_tls_addr: None,
            bookie_addr: None,
            bookie_advertised_listeners: Default::default(),
            bookie_listener_name: None,
            bookie_tls: false,
            bookie_tls_trust_certs_file: None,
            https_addr: None,
            tls_cert_file: None,
            tls_key_file: None,
            max_request_body: ByteSize::mib(2),
            http_header_read_timeout: Duration::from_secs(30),
        }
    }
}

impl ServerConfig {
    /// Checks the listeners' values against each other.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !self.bookie_advertised_listeners.is_empty() && self.bookie_addr.is_none() {
            return Err(ConfigError::Invalid {
                key: "server.bookie_advertised_listeners".into(),
                reason: "advertises a bookie listener this node does not run (server.bookie_addr)"
                    .into(),
            });
        }
        for (name, addr) in &self.bookie_advertised_listeners {
            if name.is_empty() || !is_host_port(addr) {
                return Err(ConfigError::Invalid {
                    key: format!("server.bookie_advertised_listeners.{name}"),
                    reason: format!("{addr:?} is not host:port, or the name is empty"),
                });
            }
        }
        if self.bookie_listener_name.as_deref() == Some("") {
            return Err(ConfigError::Invalid {
                key: "server.bookie_listener_name".into(),
                reason: "is empty".into(),
            });
        }
        if self.bookie_tls && (self.bookie_addr.is_none() || self.tls_cert_file.is_none()) {
            return Err(ConfigError::Invalid {
                key: "server.bookie_tls".into(),
                reason: "needs server.bookie_addr and server.tls_cert_file / tls_key_file".into(),
            });
        }
        if self.bookie_tls && self.bookie_tls_trust_certs_file.is_none() {
            return Err(ConfigError::Invalid {
                key: "server.bookie_tls_trust_certs_file".into(),
                reason: "a node whose bookie speaks TLS dials its peers' over TLS: name the certificate authorities it trusts".into(),
            });
        }
        self.validate_tls()
    }

    fn validate_tls(&self) -> Result<(), ConfigError> {
        let s = self;
        let listener = s.pulsar_tls_addr.is_some() || s.https_addr.is_some();
        let reason = match (&s.tls_cert_file, &s.tls_key_file) {
            (Some(_), Some(_)) => return Ok(()),
            (Some(_), None) => "a certificate needs its key (server.tls_key_file)",
            (None, Some(_)) => "a key needs its certificate (server.tls_cert_file)",
            (None, None) if listener => {
                "a TLS listener (server.pulsar_tls_addr, server.https_addr) needs \
                 server.tls_cert_file and server.tls_key_file"
            }
            (None, None) => return Ok(()),
        };
        Err(ConfigError::Invalid {
            key: "server.tls_cert_file".into(),
            reason: reason.into(),
        })
    }
}

/// `host:port`: a port number after a DNS name, an IPv4 address or a bracketed IPv6 one.
fn is_host_port(addr: &str) -> bool {
    super::split_host_port(addr).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listener_addresses_must_be_host_port() {
        let mut s = ServerConfig::default();
        s.bookie_advertised_listeners
            .insert("wan".into(), "nat.example:3181".into());
        s.bookie_listener_name = Some("wan".into());
        s.bookie_addr = Some(SocketAddr::from(([127, 0, 0, 1], 3181)));
        assert!(s.validate().is_ok());
        s.bookie_addr = Some(SocketAddr::from(([127, 0, 0, 1], 3181)));
        for good in ["10.0.0.7:1", "[::1]:3181", "node-1.example:3181"] {
            s.bookie_advertised_listeners
                .insert("wan".into(), good.into());
            assert!(s.validate().is_ok(), "{good}");
        }
        let bad_ones = [
            "nat.example",
            ":3181",
            "host:port",
            "h:70000",
            "a:b:1",
            "[::1:1",
            "::1:3181",
            "tls://h:1",
            "h h:1",
        ];
        for bad in bad_ones {
            s.bookie_advertised_listeners
                .insert("wan".into(), bad.into());
            let err = s
                .validate()
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                err.contains("bookie_advertised_listeners.wan"),
                "{bad}: {err}"
            );
        }
        s.bookie_advertised_listeners
            .insert("wan".into(), "10.0.0.7:1".into());
        s.bookie_addr = None;
        let err = s
            .validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("does not run"), "{err}");
        s.bookie_advertised_listeners.clear();
        s.bookie_listener_name = Some(String::new());
        assert!(s.validate().is_err());
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API fixes the closure's error type
    fn listeners_come_from_the_environment_by_name() {
        figment::Jail::expect_with(|jail| {
            jail.set_env(
                "LEDGERLAKE_SERVER__BOOKIE_ADVERTISED_LISTENERS__PEERS",
                "127.0.0.1:4000",
            );
            jail.set_env("LEDGERLAKE_SERVER__BOOKIE_LISTENER_NAME", "cut");
            jail.set_env("LEDGERLAKE_SERVER__BOOKIE_ADDR", "127.0.0.1:3181");
            let c = super::super::load(None, &Default::default()).map_err(|e| e.to_string())?;
            let peers = c.server.bookie_advertised_listeners.get("peers");
            assert_eq!(peers.map(String::as_str), Some("127.0.0.1:4000"));
            assert_eq!(c.server.bookie_listener_name.as_deref(), Some("cut"));
            Ok(())
        });
    }
}
