//! `[autorecovery]`: restoring the copies of sealed ledgers a lost bookie held (issue 19,
//! ADR 0011), BookKeeper's autorecovery (`autoRecoveryDaemonEnabled`,
//! `lostBookieRecoveryDelay`, `auditorPeriodicCheckInterval`). Only nodes of a cluster (with a
//! bookie listener) run it.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// When and how often under-replicated ledgers are looked for and copied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AutoRecoveryConfig {
    /// Copy sealed ledgers that have fewer copies than their write quorum to other bookies.
    pub enabled: bool,
    /// How long a bookie must be gone (no live member advertises it) before its copies count
    /// as lost and are made again elsewhere; a node back within it keeps its copies.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub delay: Duration,
    /// How often every sealed ledger is checked although no bookie left (a writer may have
    /// sealed a ledger without a replica that failed during its writes).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub audit_interval: Duration,
}

impl Default for AutoRecoveryConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            delay: Duration::from_secs(60),
            audit_interval: Duration::from_secs(300),
        }
    }
}
