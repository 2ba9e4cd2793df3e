//! The lake with the runtime it lives on: catalog connections, Parquet encoding and object
//! store I/O run on the lake runtime (`ll-lake`), never on the broker's or SQL's workers. Every
//! caller on another runtime (replay, SQL, admin, offload) hops through [`LakeHandle`].
//!
//! Invariant: the catalog is only called from the lake runtime; a table handle returned to
//! another runtime is rebuilt read-only there ([`super::read_only_here`]), so its scans run
//! where the caller is.

use std::future::Future;
use std::sync::Arc;

use iceberg::table::Table;
use iceberg::TableIdent;

use super::naming::TopicTable;
use super::{Lake, LakeError};
use crate::naming::TopicName;
use crate::policies::PolicyStore;

/// The lake and its runtime. Cheap to clone.
#[derive(Clone)]
pub struct LakeHandle {
    lake: Arc<Lake>,
    runtime: tokio::runtime::Handle,
    /// Namespace policies: which table a topic's rows are in (`lakeTableLayout`).
    policies: Arc<PolicyStore>,
}

impl std::fmt::Debug for LakeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LakeHandle")
            .field("lake", &self.lake)
            .finish_non_exhaustive()
    }
}

impl LakeHandle {
    /// `lake`, whose work runs on `runtime` (the lake runtime); `policies` say which table
    /// holds a topic.
    pub fn new(
        lake: Arc<Lake>,
        runtime: tokio::runtime::Handle,
        policies: Arc<PolicyStore>,
    ) -> Self {
        LakeHandle {
            lake,
            runtime,
            policies,
        }
    }

    /// The table holding `topic`'s rows under its namespace's `lakeTableLayout` (policies are
    /// cached: no store round trip once the namespace was read).
    pub async fn table_of(&self, topic: &TopicName) -> Result<TopicTable, LakeError> {
        let layout = self
            .policies
            .effective(&topic.namespace)
            .await
            .map_err(|e| LakeError::Config(format!("namespace policies of {topic}: {e}")))?
            .lake_table_layout;
        Ok(TopicTable::of(topic, layout))
    }

    /// The lake (call it from the lake runtime, e.g. inside [`LakeHandle::run`]).
    pub fn lake(&self) -> &Arc<Lake> {
        &self.lake
    }

    /// The lake runtime.
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }

    /// The catalog's name (for messages).
    pub fn catalog_name(&self) -> &str {
        self.lake.catalog_name()
    }

    /// Runs `fut` on the lake runtime and waits for it.
    pub async fn run<T: Send + 'static>(
        &self,
        fut: impl Future<Output = T> + Send + 'static,
    ) -> Result<T, LakeError> {
        self.runtime
            .spawn(fut)
            .await
            .map_err(|_| LakeError::Stopped)
    }

    /// Loads a table on the lake runtime and returns a read-only handle whose scans run on the
    /// caller's runtime; `None` when it does not exist.
    pub async fn load_table_here(&self, ident: &TableIdent) -> Result<Option<Table>, LakeError> {
        let lake = self.lake.clone();
        let owned = ident.clone();
        let loaded = self
            .run(async move { lake.load_table(&owned).await })
            .await??;
        loaded.map(|t| super::read_only_here(&t)).transpose()
    }
}
