//! Logging setup: `tracing` with a human format (colours only on a terminal) or JSON lines.
//! `RUST_LOG`, when set, overrides the configured filter.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The filter string does not parse.
    #[error("invalid log filter '{filter}': {reason}")]
    BadFilter {
        /// The filter.
        filter: String,
        /// Parser message.
        reason: String,
    },
}

/// Installs the global subscriber writing to stderr. Calling it twice keeps the first one.
pub fn init(format: LogFormat, level: &str) -> Result<(), TelemetryError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(env) if !env.is_empty() => EnvFilter::try_new(&env),
        _ => EnvFilter::try_new(level),
    }
    .map_err(|e| TelemetryError::BadFilter {
        filter: level.to_string(),
        reason: e.to_string(),
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Human => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder.json().with_current_span(false).try_init(),
    };
    Ok(())
}
