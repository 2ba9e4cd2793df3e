//! Configuration of SQL over topics: where the PostgreSQL-protocol listener binds and the limits
//! every query runs under (whichever surface it came from: psql, HTTP or the CLI).

use std::time::Duration;

use bytesize::ByteSize;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// SQL over each topic (lake and live tail together), read-only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SqlConfig {
    /// Serve SQL at all: the PostgreSQL-protocol listener on `server.pg_addr` and `POST /sql`.
    pub enabled: bool,
    /// Worker threads of the SQL runtime (planning, scans, decoding the live tail). Separate
    /// from the broker's and the lake's workers, so a heavy query cannot slow producers.
    pub threads: usize,
    /// Memory one query may hold in its operators (sorts, joins, aggregates); over it the query
    /// fails with a clear error.
    #[schemars(with = "String")]
    pub memory_limit: ByteSize,
    /// Longest a query may run; over it the query is cancelled with a clear error.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub query_timeout: Duration,
    /// Queries running at the same time, service-wide (further queries wait their turn).
    pub max_concurrent_queries: usize,
    /// Nice value (0-19, Linux: per thread) of the query threads. Above 0 the kernel runs the
    /// broker's and the log's threads first when queries keep every core busy, so a storm of
    /// heavy queries does not delay producers; 0 runs queries at the service's own priority.
    pub thread_niceness: i32,
}

impl Default for SqlConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            threads: 2,
            memory_limit: ByteSize::gib(1),
            query_timeout: Duration::from_secs(300),
            max_concurrent_queries: 8,
            thread_niceness: 19,
        }
    }
}
