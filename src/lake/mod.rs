//! The lake: Iceberg tables (one per topic, or one per namespace in the shared layout) in a
//! catalog, with data on local disk or S3.
//!
//! Owns the connection to the catalog (SQL on SQLite or PostgreSQL, or REST), the warehouse's
//! storage (Iceberg FileIO through OpenDAL for table files; `object_store` for listing and
//! deleting orphans), the table layout ([`schema`], [`naming`]) and the conversion of log
//! entries into rows ([`rows`], [`typed`]). The offload engine (`crate::offload`) decides what
//! to write and when; [`commit`] writes and commits exactly once.
//!
//! Invariants:
//! - Every catalog call runs on the lake runtime (its own threads), so Parquet encoding and
//!   catalog I/O never run on the broker's async workers.
//! - Local and S3 warehouses go through the same code path; only the storage factory and its
//!   properties differ.
//! - Every commit applies to the table version it was built from or not at all: iceberg
//!   transactions commit through [`Lake::commit`] ([`pinned`]), our own changes through
//!   [`catalog_commit`]; neither re-bases nor retries.

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::io::StorageFactory;
use iceberg::table::Table;
use iceberg::transaction::Transaction;
use iceberg::{Catalog, CatalogBuilder, NamespaceIdent, TableCreation, TableIdent};
use iceberg_catalog_rest::RestCatalogBuilder;
use iceberg_catalog_sql::{SqlBindStyle, SqlCatalogBuilder};
use iceberg_storage_opendal::OpenDalStorageFactory;
use object_store::ObjectStore;

use crate::config::{CatalogKind, Config, LakePartitioning};
use crate::naming::TopicName;

pub mod catalog_commit;
pub mod commit;
pub mod expire;
pub mod finish;
mod handle;
pub mod history;
pub mod inspect;
pub mod naming;
pub mod orphans;
mod pinned;
pub mod rows;
pub mod schema;
mod snapshots;
pub mod typed;
pub mod upload;
mod write;

pub use handle::LakeHandle;
pub use pinned::outcome_unknown;

/// Errors of lake operations, with the operation that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LakeError {
    /// The lake configuration cannot be used.
    #[error("lake configuration: {0}")]
    Config(String),
    /// An Iceberg (catalog, FileIO, writer) call failed.
    #[error("{op}: {source}")]
    Iceberg {
        /// What was being done.
        op: String,
        /// The error.
        #[source]
        source: Box<iceberg::Error>,
    },
    /// An object-store call failed.
    #[error("{op}: {source}")]
    ObjectStore {
        /// What was being done.
        op: String,
        /// The error.
        #[source]
        source: Box<object_store::Error>,
    },
    /// A commit we built ourselves (retention) could not be applied.
    #[error("committing to {table}: {source}")]
    Commit {
        /// Table.
        table: String,
        /// Why.
        #[source]
        source: Box<catalog_commit::CommitError>,
    },
    /// Rows could not be assembled.
    #[error(transparent)]
    Rows(#[from] rows::RowsError),
    /// Reading the log failed.
    #[error("reading ledger {ledger}: {source}")]
    Read {
        /// Ledger.
        ledger: u64,
        /// Error.
        #[source]
        source: crate::ledger::ReadError,
    },
    /// The table holds something this build does not understand.
    #[error("table {table}: {reason}")]
    Table {
        /// Table.
        table: String,
        /// Why.
        reason: String,
    },
    /// The lake runtime is gone (shutdown).
    #[error("the lake runtime stopped")]
    Stopped,
}

impl LakeError {
    /// Whether this is a commit of ours refused because the table changed since it was read
    /// (another writer committed first): nothing was applied, and the same change built on
    /// the new version may succeed.
    pub fn is_commit_conflict(&self) -> bool {
        matches!(self, LakeError::Commit { source, .. }
            if matches!(**source, catalog_commit::CommitError::Conflict(_)))
    }

    /// Wraps an Iceberg error with the operation.
    pub fn iceberg(op: impl Into<String>) -> impl FnOnce(iceberg::Error) -> LakeError {
        let op = op.into();
        move |source| LakeError::Iceberg {
            op,
            source: Box::new(source),
        }
    }

    /// Wraps an object-store error with the operation.
    pub fn store(op: impl Into<String>) -> impl FnOnce(object_store::Error) -> LakeError {
        let op = op.into();
        move |source| LakeError::ObjectStore {
            op,
            source: Box::new(source),
        }
    }
}

/// Connection to the catalog and warehouse.
pub struct Lake {
    catalog: Arc<dyn Catalog>,
    catalog_name: String,
    warehouse: String,
    /// Invariant: rooted so that [`Lake::object_path`] maps every table file location into it.
    store: Arc<dyn ObjectStore>,
    /// A second client of the same store, rooted the same way, for reads from other runtimes
    /// (SQL scans): its connections are made and driven there, not on the lake runtime.
    scan_store: Arc<dyn ObjectStore>,
    /// Invariant: prefix stripped from a location to get its object-store path.
    location_prefix: String,
    /// Our own commits (file removal) go through this, never around the catalog.
    committer: catalog_commit::CatalogCommit,
}

impl std::fmt::Debug for Lake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lake")
            .field("catalog", &self.catalog_name)
            .field("warehouse", &self.warehouse)
            .finish()
    }
}

/// FileIO properties for the warehouse (S3 keys only for an s3:// warehouse).
fn file_io_props(config: &Config, warehouse: &str) -> HashMap<String, String> {
    let mut props = HashMap::new();
    if !is_s3(warehouse) {
        return props;
    }
    let s3 = &config.lake.s3;
    let mut set = |k: &str, v: &str| {
        if !v.is_empty() {
            props.insert(k.to_string(), v.to_string());
        }
    };
    set("s3.endpoint", &s3.endpoint);
    set("s3.region", &s3.region);
    set("s3.access-key-id", &s3.access_key_id);
    set("s3.secret-access-key", &s3.secret_access_key);
    set("s3.session-token", &s3.session_token);
    set(
        "s3.path-style-access",
        if s3.path_style { "true" } else { "" },
    );
    set(
        "s3.allow-anonymous",
        if s3.allow_anonymous { "true" } else { "" },
    );
    if !s3.access_key_id.is_empty() {
        // Explicit credentials: do not let the machine's AWS config or EC2 metadata override.
        set("s3.disable-config-load", "true");
        set("s3.disable-ec2-metadata", "true");
    }
    props
}

fn is_s3(location: &str) -> bool {
    location.starts_with("s3://") || location.starts_with("s3a://")
}

fn env_or(value: &str, var: &str) -> Option<String> {
    if !value.is_empty() {
        return Some(value.to_string());
    }
    std::env::var(var).ok().filter(|v| !v.is_empty())
}

/// The object store of the warehouse and the location prefix its paths are relative to.
fn object_store_for(
    config: &Config,
    warehouse: &str,
) -> Result<(Arc<dyn ObjectStore>, String), LakeError> {
    if let Some(rest) = warehouse
        .strip_prefix("s3://")
        .or_else(|| warehouse.strip_prefix("s3a://"))
    {
        let bucket = rest.split('/').next().unwrap_or_default();
        if bucket.is_empty() {
            return Err(LakeError::Config(format!("'{warehouse}' names no bucket")));
        }
        let scheme = &warehouse[..warehouse.find("://").unwrap_or(0) + 3];
        let s3 = &config.lake.s3;
        let mut b = object_store::aws::AmazonS3Builder::new()
            .with_bucket_name(bucket)
            .with_region(env_or(&s3.region, "AWS_REGION").unwrap_or_else(|| "us-east-1".into()))
            .with_virtual_hosted_style_request(!s3.path_style)
            .with_skip_signature(s3.allow_anonymous);
        if !s3.endpoint.is_empty() {
            b = b
                .with_endpoint(&s3.endpoint)
                .with_allow_http(s3.endpoint.starts_with("http://"));
        }
        if let Some(k) = env_or(&s3.access_key_id, "AWS_ACCESS_KEY_ID") {
            b = b.with_access_key_id(k);
        }
        if let Some(k) = env_or(&s3.secret_access_key, "AWS_SECRET_ACCESS_KEY") {
            b = b.with_secret_access_key(k);
        }
        if let Some(k) = env_or(&s3.session_token, "AWS_SESSION_TOKEN") {
            b = b.with_token(k);
        }
        let store = b.build().map_err(LakeError::store("configure S3"))?;
        return Ok((Arc::new(store), format!("{scheme}{bucket}/")));
    }
    let store = object_store::local::LocalFileSystem::new();
    Ok((Arc::new(store), "file:/".into()))
}

impl Lake {
    /// Connects to the configured catalog and warehouse. Must run on the lake runtime (the
    /// catalog's connection pool lives there).
    pub async fn open(config: &Config) -> Result<Lake, LakeError> {
        let warehouse = config.warehouse_location();
        if let Some(dir) = warehouse.strip_prefix("file:") {
            std::fs::create_dir_all(dir)
                .map_err(|e| LakeError::Config(format!("creating warehouse {dir}: {e}")))?;
        }
        let factory: Arc<dyn StorageFactory> = if is_s3(&warehouse) {
            Arc::new(upload::PartSizedStorageFactory {
                inner: OpenDalStorageFactory::S3 {
                    customized_credential_load: None,
                },
            })
        } else {
            Arc::new(OpenDalStorageFactory::Fs)
        };
        let mut props = file_io_props(config, &warehouse);
        for (k, v) in &config.lake.catalog.properties {
            props.insert(k.clone(), v.clone());
        }
        let name = config.lake.catalog.name.clone();
        let committer = match config.lake.catalog.kind {
            CatalogKind::Sql => catalog_commit::CatalogCommit::sql(&config.catalog_uri(), &name)
                .map_err(|e| LakeError::Config(e.to_string()))?,
            CatalogKind::Rest => {
                let mut rest_props = config.lake.catalog.properties.clone();
                if !config.lake.warehouse.is_empty() {
                    rest_props
                        .entry("warehouse".into())
                        .or_insert(warehouse.clone());
                }
                catalog_commit::CatalogCommit::rest(&config.lake.catalog.uri, rest_props)
            }
        };
        let catalog: Arc<dyn Catalog> = match config.lake.catalog.kind {
            CatalogKind::Sql => {
                let uri = config.catalog_uri();
                if let Some(path) = uri
                    .strip_prefix("sqlite:")
                    .map(|p| p.split('?').next().unwrap_or(p))
                {
                    if let Some(parent) = std::path::Path::new(path).parent() {
                        std::fs::create_dir_all(parent).map_err(|e| {
                            LakeError::Config(format!("creating {}: {e}", parent.display()))
                        })?;
                    }
                }
                let style = if uri.starts_with("sqlite:") {
                    SqlBindStyle::QMark
                } else {
                    SqlBindStyle::DollarNumeric
                };
                let c = SqlCatalogBuilder::default()
                    .uri(uri.clone())
                    .warehouse_location(warehouse.clone())
                    .sql_bind_style(style)
                    .props(props)
                    .with_storage_factory(factory)
                    .load(name.clone(), HashMap::new())
                    .await
                    .map_err(LakeError::iceberg(format!(
                        "opening SQL catalog {}",
                        redact(&uri)
                    )))?;
                Arc::new(c)
            }
            CatalogKind::Rest => {
                props.insert("uri".into(), config.lake.catalog.uri.clone());
                if !config.lake.warehouse.is_empty() {
                    props.entry("warehouse".into()).or_insert(warehouse.clone());
                }
                let c = RestCatalogBuilder::default()
                    .with_storage_factory(factory)
                    .load(name.clone(), props)
                    .await
                    .map_err(LakeError::iceberg(format!(
                        "opening REST catalog {}",
                        config.lake.catalog.uri
                    )))?;
                Arc::new(c)
            }
        };
        let (store, location_prefix) = object_store_for(config, &warehouse)?;
        let (scan_store, _) = object_store_for(config, &warehouse)?;
        Ok(Lake {
            catalog,
            catalog_name: name,
            warehouse,
            store,
            scan_store,
            location_prefix,
            committer,
        })
    }

    /// Commits of changes we build ourselves (by [`expire`]).
    pub fn committer(&self) -> &catalog_commit::CatalogCommit {
        &self.committer
    }

    /// Commits `tx`, built on `base`, to exactly that version of the table: it applies only if
    /// the catalog still points at `base`, and is never re-based on a newer version (see
    /// [`pinned`]). On error, [`outcome_unknown`] tells whether the commit may have applied.
    pub async fn commit(&self, tx: Transaction, base: &Table) -> Result<Table, iceberg::Error> {
        tx.commit(&pinned::Pinned::new(
            self.catalog.as_ref(),
            &self.committer,
            base.clone(),
        ))
        .await
    }

    /// The catalog.
    pub fn catalog(&self) -> &Arc<dyn Catalog> {
        &self.catalog
    }

    /// The catalog's name.
    pub fn catalog_name(&self) -> &str {
        &self.catalog_name
    }

    /// The warehouse location.
    pub fn warehouse(&self) -> &str {
        &self.warehouse
    }

    /// The warehouse's object store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The warehouse's object store for reads running on another runtime than the lake's
    /// (SQL scans); paths as [`Lake::object_path`] gives them.
    pub fn scan_store(&self) -> &Arc<dyn ObjectStore> {
        &self.scan_store
    }

    /// The object-store path of a table file location, `None` when outside the warehouse's
    /// store (another bucket or scheme).
    pub fn object_path(&self, location: &str) -> Option<object_store::path::Path> {
        let rest = location.strip_prefix(&self.location_prefix)?;
        object_store::path::Path::parse(rest.trim_start_matches('/')).ok()
    }

    /// The location of an object-store path (inverse of [`Lake::object_path`]).
    pub fn location_of(&self, path: &object_store::path::Path) -> String {
        format!("{}{}", self.location_prefix, path)
    }

    /// Every object under the directory `dir` (a location ending in `/`); empty when the
    /// directory does not exist or lies outside the warehouse's store.
    pub async fn list_under(&self, dir: &str) -> Result<Vec<object_store::ObjectMeta>, LakeError> {
        use futures::TryStreamExt;
        let Some(prefix) = self.object_path(dir) else {
            return Ok(Vec::new());
        };
        self.store()
            .list(Some(&prefix))
            .try_collect()
            .await
            .or_else(|e| match e {
                object_store::Error::NotFound { .. } => Ok(Vec::new()),
                e => Err(LakeError::store(format!("listing {dir}"))(e)),
            })
    }

    /// Deletes every object under `location` (a table's directory); returns how many.
    pub async fn delete_all_under(&self, location: &str) -> Result<usize, LakeError> {
        use object_store::ObjectStoreExt;
        let listing = self
            .list_under(&format!("{}/", location.trim_end_matches('/')))
            .await?;
        for meta in &listing {
            self.store()
                .delete(&meta.location)
                .await
                .map_err(LakeError::store(format!("deleting {}", meta.location)))?;
        }
        Ok(listing.len())
    }

    /// Drops a table from the catalog and deletes its files; `false` when it did not exist.
    pub async fn drop_table(&self, ident: &TableIdent) -> Result<bool, LakeError> {
        let Some(table) = self.load_table(ident).await? else {
            return Ok(false);
        };
        if let Err(e) = self.catalog.drop_table(ident).await {
            // Dropped meanwhile by another node (a deletion and a redo of its record, ADR
            // 0015): that node deletes the files.
            if self.load_table(ident).await?.is_none() {
                return Ok(false);
            }
            return Err(LakeError::iceberg(format!("dropping table {ident}"))(e));
        }
        let files = self.delete_all_under(table.metadata().location()).await?;
        tracing::info!(table = %ident, files, "dropped lake table and deleted its files");
        Ok(true)
    }

    /// Loads a table; `None` when it does not exist.
    pub async fn load_table(&self, ident: &TableIdent) -> Result<Option<Table>, LakeError> {
        match self.catalog.load_table(ident).await {
            Ok(t) => Ok(Some(t)),
            Err(e) if e.kind() == iceberg::ErrorKind::TableNotFound => Ok(None),
            Err(e) if e.kind() == iceberg::ErrorKind::NamespaceNotFound => Ok(None),
            Err(e) => Err(LakeError::iceberg(format!("loading table {ident}"))(e)),
        }
    }

    /// Loads the topic's own table, creating it (and its namespaces) with the envelope schema
    /// and `partitioning` when absent.
    pub async fn load_or_create_table(
        &self,
        topic: &TopicName,
        partitioning: LakePartitioning,
    ) -> Result<Table, LakeError> {
        let own = naming::TopicTable::of(topic, crate::config::LakeTableLayout::PerTopic);
        self.load_or_create_table_at(topic, &own, partitioning)
            .await
    }

    /// Loads `table`, the table of `topic` (its own, or its namespace's shared table),
    /// creating it (and its namespaces) with its schema and `partitioning` when absent.
    pub async fn load_or_create_table_at(
        &self,
        topic: &TopicName,
        table: &naming::TopicTable,
        partitioning: LakePartitioning,
    ) -> Result<Table, LakeError> {
        let ident = table.ident.clone();
        if let Some(t) = self.load_table(&ident).await? {
            return Ok(t);
        }
        let ns = ident.namespace().clone();
        self.ensure_namespace(&ns).await?;
        let base = topic.base();
        let (schema, spec, owner) = if table.is_shared() {
            (
                schema::shared_schema(),
                schema::shared_partition_spec(partitioning),
                format!("persistent://{}", base.namespace),
            )
        } else {
            (
                schema::envelope_schema(),
                schema::partition_spec(partitioning),
                base.to_string(),
            )
        };
        let creation = TableCreation::builder()
            .name(ident.name().to_string())
            .schema(schema)
            .partition_spec(spec)
            .sort_order(schema::sort_order())
            .properties(schema::table_properties(&owner))
            .build();
        let base = owner;
        match self.catalog.create_table(&ns, creation).await {
            Ok(t) => {
                tracing::info!(table = %ident, topic = %base, "created lake table");
                Ok(t)
            }
            // Created concurrently (another process sharing the catalog): use it.
            Err(e) if e.kind() == iceberg::ErrorKind::TableAlreadyExists => self
                .load_table(&ident)
                .await?
                .ok_or_else(|| LakeError::Table {
                    table: ident.to_string(),
                    reason: "exists but cannot be loaded".into(),
                }),
            Err(e) => Err(LakeError::iceberg(format!("creating table {ident}"))(e)),
        }
    }

    async fn ensure_namespace(&self, ns: &NamespaceIdent) -> Result<(), LakeError> {
        let levels = ns.as_ref();
        for depth in 1..=levels.len() {
            let prefix = NamespaceIdent::from_strs(&levels[..depth])
                .map_err(LakeError::iceberg("namespace name"))?;
            let exists = self
                .catalog
                .namespace_exists(&prefix)
                .await
                .map_err(LakeError::iceberg(format!("checking namespace {prefix:?}")))?;
            if exists {
                continue;
            }
            match self.catalog.create_namespace(&prefix, HashMap::new()).await {
                Ok(_) => {}
                Err(e) if e.kind() == iceberg::ErrorKind::NamespaceAlreadyExists => {}
                // Another table's first offload created it meanwhile (the SQL catalog reports
                // that as a database error, not NamespaceAlreadyExists).
                Err(_)
                    if self
                        .catalog
                        .namespace_exists(&prefix)
                        .await
                        .unwrap_or(false) => {}
                Err(e) => {
                    return Err(LakeError::iceberg(format!("creating namespace {prefix:?}"))(e))
                }
            }
        }
        Ok(())
    }
}

/// A read-only handle on `table` whose scans run on the current runtime (a table loaded on the
/// lake runtime carries that runtime; readers on the replay or SQL runtime rebuild it here).
pub fn read_only_here(table: &Table) -> Result<Table, LakeError> {
    let runtime = iceberg::Runtime::try_current().map_err(LakeError::iceberg("current runtime"))?;
    let mut builder = Table::builder()
        .file_io(table.file_io().clone())
        .metadata(table.metadata_ref())
        .identifier(table.identifier().clone())
        .readonly(true)
        .runtime(runtime);
    if let Some(loc) = table.metadata_location() {
        builder = builder.metadata_location(loc);
    }
    builder.build().map_err(LakeError::iceberg("table handle"))
}

/// A connection URI with any password removed (for messages and logs).
pub fn redact(uri: &str) -> String {
    match (uri.find("://"), uri.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &uri[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{}:***{}", &uri[..s + 3], user, &uri[at..]),
                None => uri.to_string(),
            }
        }
        _ => uri.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            super::redact("postgres://u:secret@127.0.0.1:5432/db"),
            "postgres://u:***@127.0.0.1:5432/db"
        );
        assert_eq!(
            super::redact("sqlite:/x/catalog.db"),
            "sqlite:/x/catalog.db"
        );
    }
}
