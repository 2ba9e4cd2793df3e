//! Committing changes we built ourselves (requirements + updates, as Iceberg's REST protocol
//! names them) to the table's catalog.
//!
//! iceberg-rust 0.10.1 commits only through its own transaction actions (fast append, schema
//! and property updates, snapshot expiry); none removes data files, and both `TableCommit`'s
//! builder and the action trait are crate-private. Removing expired files ([`super::expire`])
//! therefore writes its manifests and manifest list with iceberg's public writers and commits
//! the new snapshot here:
//! - **SQL catalog** (SQLite, PostgreSQL): the requirements are checked against the loaded
//!   metadata, the updates applied with iceberg's `TableMetadataBuilder`, the new metadata file
//!   written, and the table's pointer swapped with one
//!   `UPDATE … WHERE metadata_location = <the one we started from>`, as the SQL catalog's own
//!   `update_table` does, but as one autocommit statement whose failure is reported (the SQL
//!   catalog ignores the error of its COMMIT). iceberg's own transactions reach the same swap
//!   through [`super::pinned`] ([`CatalogCommit::publish`]).
//! - **REST catalog**: the REST protocol's own commit, `POST /v1/{prefix}/namespaces/{ns}/
//!   tables/{table}` with the requirements and updates; the server checks and applies them.
//!   Authentication follows the catalog properties: `token`, or `credential` exchanged at
//!   `oauth2-server-uri` (default `{uri}/v1/oauth/tokens`) with `scope` (default `catalog`);
//!   `header.*` are sent too; `prefix` comes from the properties or from `GET /v1/config`.
//!
//! Invariant: a commit applies only if the table still is what the changes were built from
//! (the SQL swap compares the metadata location, the REST server checks the requirements);
//! otherwise nothing changes and [`CommitError::Conflict`] is returned, and the caller retries
//! from a fresh load on its next pass. Any other error leaves the outcome unknown (the
//! database may have applied the swap before the connection failed): the new metadata file
//! is kept.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use iceberg::spec::TableMetadata;
use iceberg::table::Table;
use iceberg::{MetadataLocation, TableIdent, TableRequirement, TableUpdate};
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

/// Why a commit did not happen.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// The table moved on (another commit landed first).
    #[error("table {0} changed since it was loaded; the commit was not applied")]
    Conflict(String),
    /// The catalog database failed.
    #[error("catalog database: {0}")]
    Database(#[from] sqlx::Error),
    /// Building or writing the new metadata failed.
    #[error("table metadata: {0}")]
    Iceberg(#[from] iceberg::Error),
    /// The REST catalog refused or could not be reached.
    #[error("REST catalog: {0}")]
    Rest(String),
}

/// How changes reach the configured catalog.
#[derive(Debug)]
pub enum CatalogCommit {
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
    /// REST catalog.
    Rest(RestCommit),
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

impl CatalogCommit {
    /// Commits for a SQL catalog at `uri` named `catalog` (connections are opened on first
    /// use, on the runtime that uses them: the lake runtime).
    pub fn sql(uri: &str, catalog: &str) -> Result<CatalogCommit, CommitError> {
        if uri.starts_with("sqlite:") {
            let options =
                SqliteConnectOptions::from_str(uri)?.busy_timeout(Duration::from_secs(30));
            let pool = SqlitePoolOptions::new()
                .max_connections(1)
                .connect_lazy_with(options);
            Ok(CatalogCommit::Sqlite {
                pool,
                catalog: catalog.to_string(),
            })
        } else {
            let pool = PgPoolOptions::new().max_connections(1).connect_lazy(uri)?;
            Ok(CatalogCommit::Postgres {
                pool,
                catalog: catalog.to_string(),
            })
        }
    }

    /// Commits for the REST catalog at `uri` with the catalog `props` (and `warehouse`).
    pub fn rest(uri: &str, props: BTreeMap<String, String>) -> CatalogCommit {
        CatalogCommit::Rest(RestCommit {
            http: reqwest::Client::new(),
            uri: uri.trim_end_matches('/').to_string(),
            props,
            prefix: tokio::sync::OnceCell::new(),
        })
    }

    /// Applies `updates` to `table` if `requirements` hold (see the module docs).
    pub async fn commit(
        &self,
        table: &Table,
        requirements: Vec<TableRequirement>,
        updates: Vec<TableUpdate>,
    ) -> Result<(), CommitError> {
        match self {
            CatalogCommit::Rest(rest) => {
                rest.commit(table.identifier(), requirements, updates).await
            }
            _ => self.commit_sql(table, requirements, updates).await,
        }
    }

    async fn commit_sql(
        &self,
        table: &Table,
        requirements: Vec<TableRequirement>,
        updates: Vec<TableUpdate>,
    ) -> Result<(), CommitError> {
        let metadata = table.metadata();
        let conflict = || CommitError::Conflict(table.identifier().to_string());
        for r in &requirements {
            r.check(Some(metadata)).map_err(|_| conflict())?;
        }
        let old = table.metadata_location().ok_or_else(conflict)?.to_string();
        let mut builder = metadata.clone().into_builder(Some(old.clone()));
        for u in updates {
            builder = u.apply(builder)?;
        }
        let new_metadata = builder.build()?.metadata;
        let location = MetadataLocation::from_str(&old)?
            .with_next_version()
            .with_new_metadata(&new_metadata);
        self.publish(table, &new_metadata, &location).await
    }

    /// SQL catalogs: writes `metadata` at `location` and points the table at it if the
    /// catalog still points at `base`'s metadata location. The new metadata file is deleted
    /// only when the swap provably did not happen ([`CommitError::Conflict`]); after any
    /// other failure the catalog may already point at it.
    pub(super) async fn publish(
        &self,
        base: &Table,
        metadata: &TableMetadata,
        location: &MetadataLocation,
    ) -> Result<(), CommitError> {
        let conflict = || CommitError::Conflict(base.identifier().to_string());
        let old = base.metadata_location().ok_or_else(conflict)?;
        metadata.write_to(base.file_io(), location).await?;
        let new = location.to_string();
        let result = self.swap(base.identifier(), old, &new).await;
        if matches!(result, Err(CommitError::Conflict(_))) {
            let _ = base.file_io().delete(&new).await;
        }
        result
    }

    /// Points `table` at `new` if it still points at `old`.
    async fn swap(&self, table: &TableIdent, old: &str, new: &str) -> Result<(), CommitError> {
        let namespace = table.namespace().join(".");
        // The same statement and binds on either database; only the placeholders differ.
        macro_rules! compare_and_set {
            ($sql:expr, $pool:expr, $catalog:expr) => {
                sqlx::query($sql)
                    .bind(new)
                    .bind(old)
                    .bind($catalog)
                    .bind(&namespace)
                    .bind(table.name())
                    .bind(old)
                    .execute($pool)
                    .await?
                    .rows_affected()
            };
        }
        let affected = match self {
            CatalogCommit::Sqlite { pool, catalog } => {
                compare_and_set!(UPDATE_SQLITE, pool, catalog)
            }
            CatalogCommit::Postgres { pool, catalog } => {
                compare_and_set!(UPDATE_POSTGRES, pool, catalog)
            }
            CatalogCommit::Rest(_) => 0,
        };
        if affected == 1 {
            Ok(())
        } else {
            Err(CommitError::Conflict(table.to_string()))
        }
    }
}

/// The REST protocol's table commit.
#[derive(Debug)]
pub struct RestCommit {
    http: reqwest::Client,
    uri: String,
    props: BTreeMap<String, String>,
    /// The path prefix, from the properties or the server's config (fetched once).
    prefix: tokio::sync::OnceCell<Option<String>>,
}

impl RestCommit {
    fn request(
        &self,
        method: reqwest::Method,
        url: &str,
        token: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let mut req = self.http.request(method, url);
        for (k, v) in &self.props {
            if let Some(name) = k.strip_prefix("header.") {
                req = req.header(name, v);
            }
        }
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req
    }

    async fn token(&self) -> Result<Option<String>, CommitError> {
        if let Some(t) = self.props.get("token") {
            return Ok(Some(t.clone()));
        }
        let Some(credential) = self.props.get("credential") else {
            return Ok(None);
        };
        let (id, secret) = match credential.split_once(':') {
            Some((id, secret)) => (Some(id), secret),
            None => (None, credential.as_str()),
        };
        let mut form: Vec<(&str, &str)> = vec![("grant_type", "client_credentials")];
        if let Some(id) = id {
            form.push(("client_id", id));
        }
        form.push(("client_secret", secret));
        form.push((
            "scope",
            self.props.get("scope").map_or("catalog", String::as_str),
        ));
        let url = self
            .props
            .get("oauth2-server-uri")
            .cloned()
            .unwrap_or_else(|| format!("{}/v1/oauth/tokens", self.uri));
        let resp = self
            .request(reqwest::Method::POST, &url, None)
            .form(&form)
            .send()
            .await
            .map_err(|e| CommitError::Rest(format!("token request to {url}: {e}")))?;
        let status = resp.status();
        let body: serde_json::Value = resp
            .json()
            .await
            .map_err(|e| CommitError::Rest(format!("token response from {url}: {e}")))?;
        match body.get("access_token").and_then(|t| t.as_str()) {
            Some(t) if status.is_success() => Ok(Some(t.to_string())),
            _ => Err(CommitError::Rest(format!(
                "token request to {url} answered {status}: {body}"
            ))),
        }
    }

    async fn prefix(&self, token: Option<&str>) -> Result<Option<String>, CommitError> {
        if let Some(p) = self.props.get("prefix") {
            return Ok(Some(p.clone()));
        }
        let fetched = self
            .prefix
            .get_or_try_init(|| async {
                let mut url = format!("{}/v1/config", self.uri);
                if let Some(w) = self.props.get("warehouse") {
                    url = format!("{url}?warehouse={}", urlencode(w));
                }
                let resp = self
                    .request(reqwest::Method::GET, &url, token)
                    .send()
                    .await
                    .map_err(|e| CommitError::Rest(format!("GET {url}: {e}")))?;
                let body: serde_json::Value = resp
                    .json()
                    .await
                    .map_err(|e| CommitError::Rest(format!("GET {url}: {e}")))?;
                Ok::<_, CommitError>(
                    body.pointer("/overrides/prefix")
                        .or_else(|| body.pointer("/defaults/prefix"))
                        .and_then(|p| p.as_str())
                        .map(str::to_string),
                )
            })
            .await?;
        Ok(fetched.clone())
    }

    async fn commit(
        &self,
        table: &TableIdent,
        requirements: Vec<TableRequirement>,
        updates: Vec<TableUpdate>,
    ) -> Result<(), CommitError> {
        let token = self.token().await?;
        let prefix = self.prefix(token.as_deref()).await?;
        let mut url = format!("{}/v1", self.uri);
        if let Some(p) = prefix.filter(|p| !p.is_empty()) {
            url = format!("{url}/{p}");
        }
        let url = format!(
            "{url}/namespaces/{}/tables/{}",
            urlencode(&table.namespace().to_url_string()),
            urlencode(table.name())
        );
        let body = serde_json::json!({
            "identifier": {"namespace": table.namespace().as_ref(), "name": table.name()},
            "requirements": requirements,
            "updates": updates,
        });
        let resp = self
            .request(reqwest::Method::POST, &url, token.as_deref())
            .json(&body)
            .send()
            .await
            .map_err(|e| CommitError::Rest(format!("POST {url}: {e}")))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        if status == reqwest::StatusCode::CONFLICT {
            return Err(CommitError::Conflict(table.to_string()));
        }
        let text = resp.text().await.unwrap_or_default();
        Err(CommitError::Rest(format!(
            "POST {url} answered {status}: {text}"
        )))
    }
}

/// Bytes a path segment or query value keeps as they are (RFC 3986 unreserved).
const UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Percent-encodes a path segment or query value.
fn urlencode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, UNRESERVED).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(urlencode("public\u{1f}default"), "public%1Fdefault");
        assert_eq!(urlencode("a b/c"), "a%20b%2Fc");
        assert_eq!(urlencode("my_topic-1.x~"), "my_topic-1.x~");
    }
}
