//! `ledgerlake config show|check|schema`.

use std::path::PathBuf;

use clap::Subcommand;

use super::serve::{load_config, GlobalLogFlags};
use crate::config::Config;

/// Configuration helpers.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the effective configuration (defaults → file → LEDGERLAKE_* env) as TOML.
    Show {
        /// TOML configuration file to layer over the defaults.
        #[arg(long, env = "LEDGERLAKE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Validate a configuration file (with the environment applied); exit 1 with the reason if
    /// it is invalid.
    Check {
        /// TOML configuration file to check.
        #[arg(long)]
        config: PathBuf,
    },
    /// Print the JSON schema of the configuration file (schemas/config.schema.json).
    Schema,
}

pub fn run(cmd: ConfigCommand, global: GlobalLogFlags) -> anyhow::Result<()> {
    match cmd {
        ConfigCommand::Show { config } => {
            let c = load_config(config.as_deref(), Default::default(), &global)?;
            print!("{}", toml::to_string_pretty(&c)?);
        }
        ConfigCommand::Check { config } => {
            load_config(Some(&config), Default::default(), &global)?;
            println!("{}: ok", config.display());
        }
        ConfigCommand::Schema => {
            let schema = schemars::schema_for!(Config);
            println!("{}", serde_json::to_string_pretty(&schema)?);
        }
    }
    Ok(())
}
