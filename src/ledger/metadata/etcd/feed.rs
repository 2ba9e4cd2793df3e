//! The etcd store's feed of policies writes
//! ([`crate::ledger::MetadataStore::policy_changes`]): one etcd
//! watch over the policies prefix, started just after the revision read when the feed was
//! asked for, so every write the store applies later is reported.
//!
//! The feed ends (and the reader starts over) when the watch fails, is cancelled or its
//! revision was compacted; a member cut off from its leader ends its watches too (the client
//! asks for a leader), so a partitioned node's feed cannot go quiet while changes go on.

use etcd_client::{GetOptions, WatchOptions, WatchStream};
use tokio::sync::mpsc;

use super::{backend, EtcdMetadataStore};
use crate::ledger::metadata::{MetadataError, PolicyChange, PolicyChanges};

impl EtcdMetadataStore {
    /// See [`crate::ledger::MetadataStore::policy_changes`].
    pub(super) async fn watch_policies(&self) -> Result<PolicyChanges, MetadataError> {
        let prefix = self.keys.policies("");
        let read = self
            .client
            .kv_client()
            .get(
                prefix.clone(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await
            .map_err(backend("start the policies feed"))?;
        let revision = read.header().map_or(0, |h| h.revision());
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision + 1);
        let stream = self
            .client
            .watch_client()
            .watch(prefix.clone(), Some(options))
            .await
            .map_err(backend("watch policies"))?;
        let (tx, feed) = PolicyChanges::channel();
        tokio::spawn(forward(stream, prefix.len(), tx));
        Ok(feed)
    }
}

/// Reports every event of `stream` (keys `offset` bytes of prefix long) until the watch or the
/// reader ends.
async fn forward(mut stream: WatchStream, offset: usize, tx: mpsc::Sender<PolicyChange>) {
    loop {
        let resp = tokio::select! {
            _ = tx.closed() => return,
            resp = stream.message() => resp,
        };
        let resp = match resp {
            Ok(Some(resp)) if !resp.canceled() && resp.compact_revision() == 0 => resp,
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(error = %e, "the policies watch failed; caches start over");
                return;
            }
        };
        for event in resp.events() {
            let Some(scope) = event
                .kv()
                .and_then(|kv| kv.key().get(offset..))
                .and_then(|k| std::str::from_utf8(k).ok())
            else {
                continue;
            };
            let change = PolicyChange {
                scope: scope.to_string(),
            };
            if tx.send(change).await.is_err() {
                return;
            }
        }
    }
}
