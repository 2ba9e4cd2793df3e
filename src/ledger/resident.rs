//! Which topics' logs stay in memory. A topic's [`TopicLog`] is cached by [`Log::topic`] while
//! the broker serves the topic; once the broker unloads it (an idle topic, a move), the log
//! forgets it and keeps nothing of it in memory: its ledgers, cursors and dedup snapshot stay
//! in the metadata store and on disk, and the next load builds the log afresh from them.
//! Background work (offload, retention, statistics) reads topics through
//! [`Log::topic_view`], which never caches, so it cannot load back what the broker let go.
//!
//! Invariants:
//! - A log that writes (its open ledger is not sealed) is never forgotten: it alone knows how
//!   far that ledger is written.
//! - A view made for background work is never cached, and never appends or seals.

use std::sync::Arc;

use super::metadata::MetadataError;
use super::{Log, TopicLog};

impl Log {
    /// Drops `topic` from the logs kept in memory, unless it is writing or is no longer the
    /// cached log of its name. Holders of clones keep reading what it knew. Returns whether it
    /// was dropped.
    pub async fn forget(&self, topic: &TopicLog) -> bool {
        if topic.is_writing() {
            return false;
        }
        let mut topics = self.topics.lock().await;
        let cached = topics
            .get(topic.name())
            .is_some_and(|c| Arc::ptr_eq(&c.inner, &topic.inner));
        if !cached {
            return false;
        }
        topics.remove(topic.name());
        crate::memory::shrink_sparse(&mut topics);
        self.unlist(topic);
        true
    }

    /// Takes `topic` out of the loaded topics by id, if it is the log listed there (the caller
    /// took it out of `topics`, under that lock).
    pub(super) fn unlist(&self, topic: &TopicLog) {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if loaded
            .get(&topic.id())
            .is_some_and(|l| Arc::ptr_eq(&l.inner, &topic.inner))
        {
            loaded.remove(&topic.id());
            crate::memory::shrink_sparse(&mut loaded);
            crate::metrics::node().topic_logs.set(loaded.len() as i64);
        }
    }

    /// Makes topic `name` exist in the metadata store without caching its log (an admin's
    /// `PUT …/{topic}`, a subscription made on a declared partition nobody used): a log cached
    /// for that would stay in memory until the broker loaded and unloaded the topic.
    pub async fn ensure_topic(&self, name: &str) -> Result<(), MetadataError> {
        if self.topics.lock().await.contains_key(name) {
            return Ok(());
        }
        self.shared
            .meta
            .get_or_create_topic(name, super::now_ms())
            .await
            .map(|_| ())
    }

    /// The log of topic `name` if it is in memory (never loads or creates it).
    pub async fn cached(&self, name: &str) -> Option<TopicLog> {
        self.topics.lock().await.get(name).cloned()
    }

    /// Topic `name` for background work that must not load it: the cached log when the topic
    /// is loaded, else a view made from the metadata store now and not cached. `None` when
    /// the topic does not exist.
    pub async fn topic_view(&self, name: &str) -> Result<Option<TopicLog>, MetadataError> {
        if let Some(t) = self.topics.lock().await.get(name) {
            return Ok(Some(t.clone()));
        }
        let Some(topic) = self.shared.meta.get_topic(name).await? else {
            return Ok(None);
        };
        let records = self.shared.meta.topic_ledgers(topic.id).await?;
        Ok(Some(TopicLog::new(
            self.shared.clone(),
            topic.id,
            topic.name,
            records,
        )))
    }

    /// How many topics' logs are in memory now.
    pub fn resident_topics(&self) -> usize {
        self.loaded.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}
