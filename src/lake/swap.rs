//! Committing a table metadata file we built ourselves: the catalog's compare-and-swap of a
//! table's metadata location.
//!
//! iceberg-rust 0.10.1 commits only through its own transaction actions (fast append, schema
//! and property updates, snapshot expiry); none removes data files, and both `TableCommit`'s
//! builder and the action trait are crate-private. Removing expired files therefore writes its
//! manifests, manifest list and metadata file with iceberg's public writers
//! ([`super::expire`]) and swaps the metadata pointer here, exactly as the SQL catalog's own
//! `update_table` does: one `UPDATE … WHERE metadata_location = <the one we started from>`.
//!
//! Invariants:
//! - A swap succeeds only if the table still points at the metadata file the new one was built
//!   from; otherwise nothing changes and [`SwapError::Conflict`] is returned (the caller retries
//!   from a fresh load on its next pass).
//! - Only the SQL catalog (SQLite, PostgreSQL) is supported: a REST catalog's commit endpoint
//!   needs the catalog client's authentication, which iceberg-rust does not expose.

use std::str::FromStr;
use std::time::Duration;

use iceberg::TableIdent;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

/// Why a swap did not happen.
#[derive(Debug, thiserror::Error)]
pub enum SwapError {
    /// The table moved on (another commit landed first).
    #[error("table {0} changed since it was loaded; the commit was not applied")]
    Conflict(String),
    /// This catalog cannot be swapped by us.
    #[error("{0}")]
    Unsupported(String),
    /// The catalog database failed.
    #[error("catalog database: {0}")]
    Database(#[from] sqlx::Error),
}

/// How to swap a table's metadata location in the configured catalog.
#[derive(Debug)]
pub enum MetadataSwap {
    /// SQL catalog on SQLite.
    Sqlite {
        /// Connections to the catalog database (lazy).
        pool: sqlx::SqlitePool,
        /// Catalog name (`catalog_name` column).
        catalog: String,
    },
    /// SQL catalog on PostgreSQL.
    Postgres {
        /// Connections to the catalog database (lazy).
        pool: sqlx::PgPool,
        /// Catalog name.
        catalog: String,
    },
    /// Not available for this catalog, with the reason.
    Unsupported(String),
}

const UPDATE_SQLITE: &str = "UPDATE iceberg_tables
    SET metadata_location = ?, previous_metadata_location = ?
    WHERE catalog_name = ? AND table_namespace = ? AND table_name = ?
      AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL)
      AND metadata_location = ?";

const UPDATE_POSTGRES: &str = "UPDATE iceberg_tables
    SET metadata_location = $1, previous_metadata_location = $2
    WHERE catalog_name = $3 AND table_namespace = $4 AND table_name = $5
      AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL)
      AND metadata_location = $6";

impl MetadataSwap {
    /// The swap for a SQL catalog at `uri` named `catalog` (connections are opened on first
    /// use, on the runtime that uses them: the lake runtime).
    pub fn sql(uri: &str, catalog: &str) -> Result<MetadataSwap, SwapError> {
        if uri.starts_with("sqlite:") {
            let options =
                SqliteConnectOptions::from_str(uri)?.busy_timeout(Duration::from_secs(30));
            let pool = SqlitePoolOptions::new()
                .max_connections(1)
                .connect_lazy_with(options);
            Ok(MetadataSwap::Sqlite {
                pool,
                catalog: catalog.to_string(),
            })
        } else if uri.starts_with("postgres:") || uri.starts_with("postgresql:") {
            let pool = PgPoolOptions::new().max_connections(1).connect_lazy(uri)?;
            Ok(MetadataSwap::Postgres {
                pool,
                catalog: catalog.to_string(),
            })
        } else {
            Ok(MetadataSwap::Unsupported(format!(
                "removing lake files needs a SQLite or PostgreSQL catalog, not {}",
                super::redact(uri)
            )))
        }
    }

    /// Points `table` at `new` if it still points at `old`.
    pub async fn swap(&self, table: &TableIdent, old: &str, new: &str) -> Result<(), SwapError> {
        let namespace = table.namespace().join(".");
        let affected = match self {
            MetadataSwap::Sqlite { pool, catalog } => sqlx::query(UPDATE_SQLITE)
                .bind(new)
                .bind(old)
                .bind(catalog)
                .bind(&namespace)
                .bind(table.name())
                .bind(old)
                .execute(pool)
                .await?
                .rows_affected(),
            MetadataSwap::Postgres { pool, catalog } => sqlx::query(UPDATE_POSTGRES)
                .bind(new)
                .bind(old)
                .bind(catalog)
                .bind(&namespace)
                .bind(table.name())
                .bind(old)
                .execute(pool)
                .await?
                .rows_affected(),
            MetadataSwap::Unsupported(why) => return Err(SwapError::Unsupported(why.clone())),
        };
        if affected == 1 {
            Ok(())
        } else {
            Err(SwapError::Conflict(table.to_string()))
        }
    }
}
