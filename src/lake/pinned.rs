//! A catalog view pinned at one version of one table: every iceberg transaction we run
//! (offload's append, schema evolution, snapshot expiry) commits through it, so that it applies
//! to exactly the table version it was built from, or not at all.
//!
//! Why not commit through the catalog itself (iceberg-rust 0.10.1):
//! - `Transaction::commit` reloads the table first and, when it moved, silently re-applies the
//!   actions to the newer version, retrying on conflicts. Offload computes its watermark (an
//!   absolute value) from the version it loaded, so a re-based commit can set a watermark over
//!   ledgers whose rows are in no snapshot.
//! - The SQL catalog's `update_table` runs its pointer swap in a database transaction and
//!   ignores the error of that transaction's COMMIT: a swap lost when the database crashes is
//!   reported as done (found by the fault suite's catalog-kill test: a later commit then
//!   started from the old version and the lake lost a ledger's rows).
//!
//! Through [`Pinned`]:
//! - `load_table` of the pinned table answers the pinned version, so the transaction never
//!   re-bases;
//! - `update_table` checks the requirements against the pinned version, writes the new
//!   metadata, and swaps the catalog's pointer only if it still is the pinned version's
//!   ([`CatalogCommit::publish`]: one autocommit compare-and-set whose failure is reported);
//!   on a REST catalog the server checks the requirements the actions built against the
//!   pinned version ([`CatalogCommit::commit`]): the table's uuid, and for appends and
//!   snapshot expiry its branch head (a change of properties alone by another writer is not
//!   detected there);
//! - nothing is retried here: the caller reloads and starts again on its next pass.
//!
//! Invariant: `update_table` returns `Ok` only when the catalog acknowledged the new version.
//! Its errors are [`ErrorKind::CatalogCommitConflicts`] only when the commit provably did not
//! apply; any other error counts as of unknown outcome ([`outcome_unknown`]: the catalog may
//! point at the new version, so nothing it references may be deleted). Errors are never
//! retryable.

use std::str::FromStr;

use async_trait::async_trait;
use iceberg::table::Table;
use iceberg::{
    Catalog, Error, ErrorKind, MetadataLocation, Namespace, NamespaceIdent, Result, TableCommit,
    TableCreation, TableIdent,
};

use super::catalog_commit::{CatalogCommit, CommitError};

/// The catalog as seen by one transaction on `base`.
#[derive(Debug)]
pub(super) struct Pinned<'a> {
    /// Everything but the pinned table's loads and commits goes here.
    inner: &'a dyn Catalog,
    committer: &'a CatalogCommit,
    /// Invariant: the version every commit through this view is built from and checked
    /// against.
    base: Table,
}

impl<'a> Pinned<'a> {
    pub(super) fn new(inner: &'a dyn Catalog, committer: &'a CatalogCommit, base: Table) -> Self {
        Pinned {
            inner,
            committer,
            base,
        }
    }

    fn is_base(&self, ident: &TableIdent) -> bool {
        ident == self.base.identifier()
    }

    async fn commit_sql(&self, commit: TableCommit) -> Result<Table> {
        // Checks the requirements against the pinned version and builds the new one; an error
        // here means nothing was written.
        let staged = commit
            .apply(self.base.clone())
            .map_err(|e| not_applied(self.base.identifier(), e))?;
        let location = MetadataLocation::from_str(staged.metadata_location_result()?)?;
        self.committer
            .publish(&self.base, staged.metadata(), &location)
            .await
            .map_err(commit_error)?;
        Ok(staged)
    }

    async fn commit_rest(&self, mut commit: TableCommit) -> Result<Table> {
        let requirements = commit.take_requirements();
        let updates = commit.take_updates();
        self.committer
            .commit(&self.base, requirements, updates)
            .await
            .map_err(commit_error)?;
        self.inner
            .load_table(self.base.identifier())
            .await
            .map_err(|e| {
                Error::new(
                    ErrorKind::Unexpected,
                    format!("committed, but reloading the table failed: {e}"),
                )
            })
    }
}

/// Whether a commit error leaves the commit's outcome unknown (see the module docs).
pub fn outcome_unknown(e: &Error) -> bool {
    e.kind() != ErrorKind::CatalogCommitConflicts
}

/// An error from building the new version (nothing was written): a failed requirement is a
/// conflict; any other error keeps its kind. Never retryable here.
fn not_applied(table: &TableIdent, e: Error) -> Error {
    Error::new(e.kind(), format!("commit to {table} not applied: {e}"))
}

fn commit_error(e: CommitError) -> Error {
    match e {
        CommitError::Conflict(table) => Error::new(
            ErrorKind::CatalogCommitConflicts,
            format!("table {table} changed since it was loaded; the commit was not applied"),
        ),
        other => Error::new(
            ErrorKind::Unexpected,
            format!("commit outcome unknown: {other}"),
        ),
    }
}

#[async_trait]
impl Catalog for Pinned<'_> {
    async fn list_namespaces(
        &self,
        parent: Option<&NamespaceIdent>,
    ) -> Result<Vec<NamespaceIdent>> {
        self.inner.list_namespaces(parent).await
    }

    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: std::collections::HashMap<String, String>,
    ) -> Result<Namespace> {
        self.inner.create_namespace(namespace, properties).await
    }

    async fn get_namespace(&self, namespace: &NamespaceIdent) -> Result<Namespace> {
        self.inner.get_namespace(namespace).await
    }

    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> Result<bool> {
        self.inner.namespace_exists(namespace).await
    }

    async fn update_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: std::collections::HashMap<String, String>,
    ) -> Result<()> {
        self.inner.update_namespace(namespace, properties).await
    }

    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> Result<()> {
        self.inner.drop_namespace(namespace).await
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> Result<Vec<TableIdent>> {
        self.inner.list_tables(namespace).await
    }

    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        creation: TableCreation,
    ) -> Result<Table> {
        self.inner.create_table(namespace, creation).await
    }

    async fn load_table(&self, table: &TableIdent) -> Result<Table> {
        if self.is_base(table) {
            return Ok(self.base.clone());
        }
        self.inner.load_table(table).await
    }

    async fn drop_table(&self, table: &TableIdent) -> Result<()> {
        self.inner.drop_table(table).await
    }

    async fn purge_table(&self, table: &TableIdent) -> Result<()> {
        self.inner.purge_table(table).await
    }

    async fn table_exists(&self, table: &TableIdent) -> Result<bool> {
        self.inner.table_exists(table).await
    }

    async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> Result<()> {
        self.inner.rename_table(src, dest).await
    }

    async fn register_table(&self, table: &TableIdent, metadata_location: String) -> Result<Table> {
        self.inner.register_table(table, metadata_location).await
    }

    async fn update_table(&self, commit: TableCommit) -> Result<Table> {
        if !self.is_base(commit.identifier()) {
            return Err(Error::new(
                ErrorKind::Unexpected,
                format!(
                    "a transaction pinned to {} tried to commit to {}",
                    self.base.identifier(),
                    commit.identifier()
                ),
            ));
        }
        if matches!(self.committer, CatalogCommit::Rest(_)) {
            self.commit_rest(commit).await
        } else {
            self.commit_sql(commit).await
        }
    }
}
