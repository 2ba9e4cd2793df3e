//! The `ledgerlake` command line (clap derive). `anyhow` is allowed here and in `main.rs` only.
//!
//! Subcommands: `serve` runs the service; `config` shows, checks and describes configuration;
//! `perf` runs load generators; `offload` asks a running service to offload a topic; `lake`
//! prints the lake layout; `top` shows the busiest topics live. Client subcommands (`sql`,
//! `admin`, `top`, `verify`) talk to a running service through
//! `--url http://127.0.0.1:8080` / `--service-url pulsar://127.0.0.1:6650`.

use clap::{Parser, Subcommand};

use crate::config::LogFormat;

mod admin;
mod config_cmd;
mod lake_cmd;
mod offload;
mod perf;
mod serve;
mod sql;
mod token;
mod top;
mod verify;

/// ledgerlake: Pulsar-protocol streaming with infinite retention in Apache Iceberg.
#[derive(Debug, Parser)]
#[command(name = "ledgerlake", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// Log line format: `human` (colours on a terminal) or `json`. Overrides
    /// `telemetry.log_format`.
    #[arg(long, global = true, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Log filter in tracing env-filter syntax (e.g. `debug`, `ledgerlake=debug,info`).
    /// Overrides `telemetry.log_level`; `RUST_LOG` wins over both.
    #[arg(long, global = true)]
    pub log_level: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the service (Pulsar listener, HTTP admin/health, log, lake) until SIGINT/SIGTERM.
    Serve(serve::ServeArgs),
    /// Show the effective configuration, check a file, or print the JSON schema.
    #[command(subcommand)]
    Config(config_cmd::ConfigCommand),
    /// Load generators and benchmarks.
    #[command(subcommand)]
    Perf(perf::PerfCommand),
    /// Offload everything written to a topic so far into its lake table (running service).
    Offload(offload::OffloadArgs),
    /// Lake layout helpers.
    #[command(subcommand)]
    Lake(lake_cmd::LakeCommand),
    /// Run read-only SQL over topics on a running service (interactive without a query).
    Sql(sql::SqlArgs),
    /// Create and inspect authentication keys and tokens (the verbs of `pulsar tokens`).
    #[command(subcommand)]
    Token(token::TokenCommand),
    /// Tenants, namespaces, topics, permissions and quotas of a running service (the verbs of
    /// `pulsar-admin`).
    Admin(admin::AdminArgs),
    /// A live view of the busiest topic partitions of a running service: rates, backlog,
    /// offload lag, hot-partition and lag-spiral flags, refreshed every second.
    Top(top::TopArgs),
    /// Check that topics' messages are held exactly once across log and lake (every id of
    /// both tiers read); exits non-zero on any gap, duplicate or unreadable file.
    Verify(verify::VerifyArgs),
}

/// Parses the command line and runs the chosen subcommand.
pub fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let global = serve::GlobalLogFlags {
        log_format: cli.log_format,
        log_level: cli.log_level,
    };
    match cli.command {
        Command::Serve(args) => serve::run(args, global),
        Command::Config(cmd) => config_cmd::run(cmd, global),
        Command::Perf(cmd) => perf::run(cmd, global),
        Command::Offload(args) => offload::run(args),
        Command::Lake(cmd) => lake_cmd::run(cmd),
        Command::Sql(args) => sql::run(args),
        Command::Token(cmd) => token::run(cmd),
        Command::Admin(args) => admin::run(args),
        Command::Top(args) => top::run(args),
        Command::Verify(args) => verify::run(args),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_command_line_is_consistent() {
        // clap's own checks: no two arguments of a subcommand share a name or short flag,
        // every `requires`/`conflicts_with` names an argument that exists, and so on.
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
