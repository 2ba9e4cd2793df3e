//! `ledgerlake serve`.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::config::{
    self, AuthOverrides, BrokerOverrides, LogFormat, MetadataOverrides, Overrides, ServerOverrides,
    TelemetryOverrides,
};
use crate::service::{shutdown_signal, Service};
use crate::telemetry;

/// Logging flags shared by every subcommand.
#[derive(Debug, Clone, Default)]
pub struct GlobalLogFlags {
    pub log_format: Option<LogFormat>,
    pub log_level: Option<String>,
}

/// Flags of `ledgerlake serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML configuration file (see deploy/ledgerlake.toml). Values from `LEDGERLAKE_*`
    /// environment variables and from flags override it.
    #[arg(long, env = "LEDGERLAKE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Root of all local state (log, metadata.db, catalog.db, warehouse/). Default: ./data.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Pulsar binary-protocol listen address. Default: 127.0.0.1:6650.
    #[arg(long)]
    pub pulsar_addr: Option<SocketAddr>,
    /// HTTP listen address for health, admin, metrics and SQL. Default: 127.0.0.1:8080.
    #[arg(long)]
    pub http_addr: Option<SocketAddr>,
    /// PostgreSQL wire-protocol listen address for SQL. Default: 127.0.0.1:5433. (Served once
    /// the SQL issue lands.)
    #[arg(long)]
    pub pg_addr: Option<SocketAddr>,
    /// Pulsar-over-TLS (`pulsar+ssl://`) listen address; needs the certificate and key flags
    /// below. Pulsar's port is 6651. Default: off.
    #[arg(long)]
    pub pulsar_tls_addr: Option<SocketAddr>,
    /// Node-to-node bookie listen address of a cluster node (other nodes read this node's
    /// ledgers there). Default: off.
    #[arg(long)]
    pub bookie_addr: Option<SocketAddr>,
    /// HTTPS listen address (admin, SQL, health); needs the certificate. Pulsar's port is
    /// 8443. Default: off.
    #[arg(long)]
    pub https_addr: Option<SocketAddr>,
    /// PEM certificate chain of the TLS listeners (the PostgreSQL listener then offers SSL
    /// too).
    #[arg(long)]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of that certificate.
    #[arg(long)]
    pub tls_key_file: Option<PathBuf>,
    /// Turn authentication on and accept JWTs signed with this HS256 secret key (a file, or
    /// `data:;base64,…`). Sets `broker.authentication.token_secret_key`.
    #[arg(long)]
    pub auth_token_secret_key: Option<String>,
    /// Turn authentication on and accept JWTs signed with the private key of this public key (a
    /// DER or PEM file, or `data:;base64,…`). Sets `broker.authentication.token_public_key`.
    #[arg(long)]
    pub auth_token_public_key: Option<String>,
    /// Algorithm of `--auth-token-public-key` (RS256 by default; ES256, ES384, PS256, …).
    #[arg(long)]
    pub auth_token_public_alg: Option<String>,
    /// Roles allowed everything, comma-separated (`a,b`). Sets
    /// `broker.authentication.superuser_roles`.
    #[arg(long, value_delimiter = ',')]
    pub superuser_roles: Vec<String>,
    /// Metadata store: `sqlite:PATH`, or `etcd://host:port[,host:port…][/prefix]` for the
    /// nodes of a cluster. Sets `metadata.url`. Default: SQLite in the data directory.
    #[arg(long)]
    pub metadata_url: Option<String>,
}

/// Builds the effective configuration from a file, the environment and flags (`overrides`,
/// whose logging part comes from `global`).
pub(crate) fn load_config(
    file: Option<&std::path::Path>,
    overrides: Overrides,
    global: &GlobalLogFlags,
) -> anyhow::Result<config::Config> {
    let overrides = Overrides {
        telemetry: TelemetryOverrides {
            log_format: global.log_format,
            log_level: global.log_level.clone(),
        },
        ..overrides
    };
    Ok(config::load(file, &overrides)?)
}

pub fn run(args: ServeArgs, global: GlobalLogFlags) -> anyhow::Result<()> {
    let overrides = Overrides {
        data_dir: args.data_dir,
        server: ServerOverrides {
            pulsar_addr: args.pulsar_addr,
            http_addr: args.http_addr,
            pg_addr: args.pg_addr,
            pulsar_tls_addr: args.pulsar_tls_addr,
            bookie_addr: args.bookie_addr,
            https_addr: args.https_addr,
            tls_cert_file: args.tls_cert_file,
            tls_key_file: args.tls_key_file,
        },
        broker: BrokerOverrides {
            authentication: AuthOverrides::new(
                args.auth_token_secret_key,
                args.auth_token_public_key,
                args.auth_token_public_alg,
            )
            .with_superusers(args.superuser_roles),
        },
        metadata: MetadataOverrides {
            url: args.metadata_url,
        },
        ..Default::default()
    };
    let config = load_config(args.config.as_deref(), overrides, &global)?;

    telemetry::init(config.telemetry.log_format, &config.telemetry.log_level)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ledgerlake-worker")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let service = Service::start(&config).await?;
        // Like Pulsar's default `zookeeperSessionExpiredPolicy=shutdown`: a node that lost its
        // session stopped serving its topics already; it stops, and its supervisor restarts it
        // with a new session.
        let lost = tokio::select! {
            signal = shutdown_signal() => {
                let signal = signal.context("installing signal handlers")?;
                tracing::info!(signal, "shutting down");
                None
            }
            state = service.session_ended() => {
                tracing::error!(?state, "coordination session ended; shutting down");
                Some(state)
            }
        };
        service.shutdown().await?;
        if let Some(state) = lost {
            anyhow::bail!(
                "the node's coordination session ended ({state:?}); it stopped serving and exits (run it under a supervisor that restarts it)"
            );
        }
        Ok(())
    })
}
