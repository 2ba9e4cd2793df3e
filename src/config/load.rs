//! Layered loading of [`Config`]: defaults → TOML file → environment → flags.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::Serialize;

use super::{Config, LogFormat};

/// Prefix of environment variables read as configuration.
pub const ENV_PREFIX: &str = "LEDGERLAKE_";

/// Why the configuration was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The config file does not exist.
    #[error("config file {} does not exist", .0.display())]
    MissingFile(PathBuf),
    /// A layer could not be parsed, has an unknown key or a value of the wrong type.
    #[error("invalid configuration: {0}")]
    Parse(String),
    /// A value is out of range or inconsistent with another.
    #[error("invalid configuration: {key}: {reason}")]
    Invalid {
        /// Dotted key, e.g. `ledger.segment_size`.
        key: String,
        /// Why.
        reason: String,
    },
}

/// Values given on the command line; `None` leaves the lower layers' value.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Overrides {
    /// `--data-dir`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// `--pulsar-addr`, `--http-addr`, `--pg-addr`.
    #[serde(skip_serializing_if = "ServerOverrides::is_empty")]
    pub server: ServerOverrides,
    /// `--log-format`, `--log-level`.
    #[serde(skip_serializing_if = "TelemetryOverrides::is_empty")]
    pub telemetry: TelemetryOverrides,
    /// `--auth-token-*`.
    #[serde(skip_serializing_if = "BrokerOverrides::is_empty")]
    pub broker: BrokerOverrides,
    /// Metadata store flags.
    #[serde(skip_serializing_if = "MetadataOverrides::is_empty")]
    pub metadata: MetadataOverrides,
}

/// Broker flags.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BrokerOverrides {
    /// Authentication flags.
    pub authentication: AuthOverrides,
}

impl BrokerOverrides {
    fn is_empty(&self) -> bool {
        self.authentication.is_empty()
    }
}

/// `--auth-token-secret-key`, `--auth-token-public-key` (each turns authentication on),
/// `--auth-token-public-alg`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AuthOverrides {
    /// Set when a key flag was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// HS256 secret key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_secret_key: Option<String>,
    /// Public key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_public_key: Option<String>,
    /// Its algorithm.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_public_alg: Option<String>,
    /// Roles allowed everything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub superuser_roles: Option<Vec<String>>,
}

impl AuthOverrides {
    /// The key flags as given: a key flag turns authentication on.
    pub fn new(secret: Option<String>, public: Option<String>, alg: Option<String>) -> Self {
        AuthOverrides {
            enabled: (secret.is_some() || public.is_some()).then_some(true),
            token_secret_key: secret,
            token_public_key: public,
            token_public_alg: alg,
            superuser_roles: None,
        }
    }

    /// With `--superuser-roles` (an empty list changes nothing).
    pub fn with_superusers(self, roles: Vec<String>) -> Self {
        AuthOverrides {
            superuser_roles: (!roles.is_empty()).then_some(roles),
            ..self
        }
    }

    fn is_empty(&self) -> bool {
        self.enabled.is_none()
            && self.token_secret_key.is_none()
            && self.token_public_key.is_none()
            && self.token_public_alg.is_none()
            && self.superuser_roles.is_none()
    }
}

/// Metadata store flags.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MetadataOverrides {
    /// `metadata.url`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

impl MetadataOverrides {
    fn is_empty(&self) -> bool {
        self.url.is_none()
    }
}

/// Listen-address flags.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServerOverrides {
    /// Pulsar listener.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pulsar_addr: Option<SocketAddr>,
    /// HTTP listener.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_addr: Option<SocketAddr>,
    /// PostgreSQL-wire listener.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pg_addr: Option<SocketAddr>,
    /// Pulsar-over-TLS listener.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pulsar_tls_addr: Option<SocketAddr>,
    /// Node-to-node bookie listener.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bookie_addr: Option<SocketAddr>,
    /// HTTPS listener.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub https_addr: Option<SocketAddr>,
    /// PEM certificate chain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert_file: Option<std::path::PathBuf>,
    /// PEM private key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key_file: Option<std::path::PathBuf>,
}

impl ServerOverrides {
    fn is_empty(&self) -> bool {
        self.pulsar_addr.is_none()
            && self.http_addr.is_none()
            && self.pg_addr.is_none()
            && self.pulsar_tls_addr.is_none()
            && self.bookie_addr.is_none()
            && self.https_addr.is_none()
            && self.tls_cert_file.is_none()
            && self.tls_key_file.is_none()
    }
}

/// Logging flags.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TelemetryOverrides {
    /// Log format.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_format: Option<LogFormat>,
    /// Log filter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_level: Option<String>,
}

impl TelemetryOverrides {
    fn is_empty(&self) -> bool {
        self.log_format.is_none() && self.log_level.is_none()
    }
}

/// Builds the configuration from all layers and validates it.
pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
    let mut fig = Figment::from(Serialized::defaults(Config::default()));
    if let Some(path) = file {
        if !path.exists() {
            return Err(ConfigError::MissingFile(path.to_path_buf()));
        }
        fig = fig.merge(Toml::file_exact(path));
    }
    fig = fig
        .merge(Env::prefixed(ENV_PREFIX).split("__").ignore(&["config"]))
        .merge(Serialized::defaults(overrides));
    let config: Config = fig.extract().map_err(|e| {
        ConfigError::Parse(
            e.into_iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; "),
        )
    })?;
    config.validate()?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        assert_eq!(Config::default().validate().ok(), Some(()));
    }

    #[test]
    fn shipped_default_file_equals_built_in_defaults() -> Result<(), Box<dyn std::error::Error>> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/ledgerlake.toml");
        let text = std::fs::read_to_string(&path)?;
        let parsed: Config = toml::from_str(&text)?;
        assert_eq!(
            parsed,
            Config::default(),
            "deploy/ledgerlake.toml drifted from the defaults"
        );
        Ok(())
    }

    #[test]
    fn committed_schema_is_current() -> Result<(), Box<dyn std::error::Error>> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/config.schema.json");
        let committed: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        let current = serde_json::to_value(schemars::schema_for!(Config))?;
        assert_eq!(
            committed, current,
            "schemas/config.schema.json is stale: run `ledgerlake config schema > schemas/config.schema.json`"
        );
        Ok(())
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API fixes the closure's error type
    fn layers_apply_in_order_and_unknown_keys_are_named() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "ll.toml",
                "data_dir = \"/from/file\"\n[ledger]\nsync = \"never\"\nsegment_size = \"32 MiB\"\n",
            )?;
            jail.set_env("LEDGERLAKE_LEDGER__SYNC", "interval_ms");
            jail.set_env("LEDGERLAKE_DATA_DIR", "/from/env");
            let overrides = Overrides {
                data_dir: Some(PathBuf::from("/from/flag")),
                ..Default::default()
            };
            let c = load(Some(Path::new("ll.toml")), &overrides).map_err(|e| e.to_string())?;
            assert_eq!(c.data_dir, PathBuf::from("/from/flag"));
            assert_eq!(c.ledger.sync, super::super::SyncPolicy::IntervalMs);
            assert_eq!(c.ledger.segment_size, bytesize::ByteSize::mib(32));

            jail.create_file("bad.toml", "[ledger]\nsegmnt_size = 5\n")?;
            let err = load(Some(Path::new("bad.toml")), &Overrides::default())
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                err.contains("segmnt_size"),
                "error does not name the key: {err}"
            );

            jail.set_env("LEDGERLAKE_LEDGER__NOPE", "1");
            let err = load(None, &Overrides::default())
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                err.contains("nope"),
                "error does not name the env key: {err}"
            );
            Ok(())
        });
    }

    #[test]
    fn rates_need_samples_within_their_window() {
        let mut c = Config::default();
        c.broker.cursor_persist_interval = c.metrics.rate_window;
        let err = c.validate().err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("broker.cursor_persist_interval")));
        c.metrics.enabled = false;
        assert!(c.validate().is_ok(), "no rates without metrics");
        c.metrics.enabled = true;
        c.broker.cursor_persist_interval = c.metrics.rate_window / 2;
        assert!(c.validate().is_ok());
    }

    #[test]
    fn the_advertised_address_is_host_and_port() {
        for good in [
            "node-1.example:6650",
            "10.0.0.7:6650",
            "[::1]:6650",
            "[fd00::7]:1",
        ] {
            let mut c = Config::default();
            c.broker.advertised_address = good.into();
            assert!(c.validate().is_ok(), "{good}");
        }
        for bad in [
            "node-1",
            "::1",
            "fd00::7:6650",
            ":6650",
            "node:",
            "node:x",
            "[]:1",
            "[node]:1",
            "[::1:1",
            "node:+6650",
            "no de:6650",
            "node/x:6650",
            "[fe80::1%2]:6650",
        ] {
            let mut c = Config::default();
            c.broker.advertised_address = bad.into();
            let err = c.validate().err().map(|e| e.to_string());
            assert!(
                err.is_some_and(|e| e.contains("broker.advertised_address")),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_node_bound_everywhere_must_name_its_host() {
        let mut c = Config::default();
        c.server.bookie_addr = Some(SocketAddr::from(([0, 0, 0, 0], 3181)));
        c.server.pulsar_addr = SocketAddr::from(([0, 0, 0, 0], 6650));
        let err = c.validate().err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("broker.advertised_address")));
        c.broker.advertised_address = "node-1.example:6650".into();
        assert!(c.validate().is_ok());
        // Any one listener bound everywhere is enough: the Pulsar one (the advertised host
        // when none is set), or the HTTP one (the node's id and the others' redirects).
        for (pulsar, http) in [
            ([0, 0, 0, 0], [127, 0, 0, 1]),
            ([127, 0, 0, 1], [0, 0, 0, 0]),
        ] {
            let mut c = Config::default();
            c.server.bookie_addr = Some(SocketAddr::from(([127, 0, 0, 1], 3181)));
            c.server.pulsar_addr = SocketAddr::from((pulsar, 6650));
            c.server.http_addr = SocketAddr::from((http, 8080));
            let err = c.validate().err().map(|e| e.to_string());
            assert!(err.is_some_and(|e| e.contains("broker.advertised_address")));
        }
        // A single node bound everywhere is reached by its clients only: no host is needed.
        let mut c = Config::default();
        c.server.pulsar_addr = SocketAddr::from(([0, 0, 0, 0], 6650));
        c.server.http_addr = SocketAddr::from(([0, 0, 0, 0], 8080));
        assert!(c.validate().is_ok());
    }

    #[test]
    fn inconsistent_values_are_refused_with_the_key() {
        let mut c = Config::default();
        c.ledger.segment_size = bytesize::ByteSize::gib(8);
        let err = c
            .validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("ledger.segment_size"), "{err}");
        let mut c = Config::default();
        c.server.https_addr = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 8443)));
        let err = c
            .validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("server.tls_cert_file"),
            "TLS without a certificate: {err}"
        );
        c.server.tls_cert_file = Some(PathBuf::from("cert.pem"));
        assert!(c.validate().is_err(), "a certificate without its key");
        c.server.tls_key_file = Some(PathBuf::from("key.pem"));
        assert!(c.validate().is_ok());
        assert!(load(
            Some(Path::new("/nonexistent/ll.toml")),
            &Overrides::default()
        )
        .is_err());
    }
}
