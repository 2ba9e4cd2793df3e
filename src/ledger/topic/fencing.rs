//! The topic's writer epoch: a view that writes the topic fences it at its ownership epoch, so
//! writers of earlier owners can create no ledger and write no cursor from then on.

use super::TopicLog;
use crate::ledger::metadata::MetadataError;

impl TopicLog {
    /// Makes this log the topic's writer at ownership `epoch`: writers of lower epochs (earlier
    /// owners on other nodes) can create no ledger from now on, and neither can this one once a
    /// later owner fences it in turn ([`crate::ledger::MetadataStore::fence_writers`]).
    pub async fn fence(&self, epoch: u64) -> Result<(), MetadataError> {
        let _guard = self.inner.roll_lock.lock().await;
        self.inner
            .shared
            .meta
            .fence_writers(self.inner.id, epoch)
            .await?;
        self.inner
            .writer_epoch
            .store(epoch, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// The epoch this writer fenced the topic at (`None`: unfenced).
    pub(crate) fn writer_epoch(&self) -> Option<u64> {
        match self
            .inner
            .writer_epoch
            .load(std::sync::atomic::Ordering::Acquire)
        {
            0 => None,
            epoch => Some(epoch),
        }
    }
}
