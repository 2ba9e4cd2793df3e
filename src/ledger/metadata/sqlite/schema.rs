//! The SQLite store's tables: the statements that create them, the columns later formats added
//! to older databases (in place, SQLite has no `ADD COLUMN IF NOT EXISTS`), and the fence read
//! shared by ledger creation and fencing.

use sqlx::{Row, SqliteConnection};

use super::backend;
use crate::ledger::metadata::{MetadataError, TopicId};

pub(super) const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS ll_meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ll_topics (
        topic_id BIGINT PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        created_at_ms BIGINT NOT NULL,
        writer_epoch BIGINT NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS ll_ledgers (
        ledger_id BIGINT PRIMARY KEY,
        topic_id BIGINT NOT NULL REFERENCES ll_topics(topic_id),
        state SMALLINT NOT NULL,
        first_segment BIGINT NOT NULL,
        last_segment BIGINT,
        entry_count BIGINT,
        size_bytes BIGINT,
        min_publish_ms BIGINT,
        max_publish_ms BIGINT,
        checksum BIGINT,
        created_at_ms BIGINT NOT NULL,
        state_changed_at_ms BIGINT NOT NULL,
        offload_ref TEXT)",
    "CREATE INDEX IF NOT EXISTS ll_ledgers_topic ON ll_ledgers(topic_id, ledger_id)",
    "CREATE TABLE IF NOT EXISTS ll_cursors (
        topic_id BIGINT NOT NULL REFERENCES ll_topics(topic_id),
        subscription TEXT NOT NULL,
        state BLOB NOT NULL,
        updated_at_ms BIGINT NOT NULL,
        PRIMARY KEY (topic_id, subscription))",
    "CREATE INDEX IF NOT EXISTS ll_ledgers_state ON ll_ledgers(state)",
    "CREATE TABLE IF NOT EXISTS ll_schemas (
        topic TEXT NOT NULL,
        version BIGINT NOT NULL,
        schema BLOB NOT NULL,
        PRIMARY KEY (topic, version))",
    "CREATE TABLE IF NOT EXISTS ll_partitioned_topics (
        name TEXT PRIMARY KEY,
        partitions BIGINT NOT NULL)",
    // Added after schema version 1 shipped; additive (older builds ignore it): ADR 0002.
    "CREATE TABLE IF NOT EXISTS ll_policies (
        scope TEXT PRIMARY KEY,
        policies BLOB NOT NULL)",
    "INSERT OR IGNORE INTO ll_meta(key, value) VALUES ('schema_version', 1)",
    // `ll_ledgers.bookie` is added by `add_later_columns` (SQLite has no ADD COLUMN IF NOT
    // EXISTS).
    "INSERT OR IGNORE INTO ll_meta(key, value) VALUES ('next_topic_id', 1)",
    "INSERT OR IGNORE INTO ll_meta(key, value) VALUES ('next_ledger_id', 1)",
];

/// Adds the columns later formats added (`ll_ledgers.bookie`, ADR 0007; `ll_topics.
/// writer_epoch`, ADR 0008; `ll_ledgers.replicas` and `ack_quorum`, ADR 0010;
/// `write_quorum`, ADR 0011; `stripe_width`, ADR 0017) to a database
/// made before them: old ledger rows read as held by the local node (empty bookie) and
/// unreplicated, old topics as never fenced.
pub(super) async fn add_later_columns(c: &mut SqliteConnection) -> Result<(), MetadataError> {
    for (table, column, ddl) in [
        (
            "ll_ledgers",
            "bookie",
            "ALTER TABLE ll_ledgers ADD COLUMN bookie TEXT NOT NULL DEFAULT ''",
        ),
        (
            "ll_topics",
            "writer_epoch",
            "ALTER TABLE ll_topics ADD COLUMN writer_epoch BIGINT NOT NULL DEFAULT 0",
        ),
        (
            "ll_ledgers",
            "replicas",
            "ALTER TABLE ll_ledgers ADD COLUMN replicas TEXT NOT NULL DEFAULT ''",
        ),
        (
            "ll_ledgers",
            "ack_quorum",
            "ALTER TABLE ll_ledgers ADD COLUMN ack_quorum BIGINT NOT NULL DEFAULT 1",
        ),
        (
            "ll_ledgers",
            "write_quorum",
            "ALTER TABLE ll_ledgers ADD COLUMN write_quorum BIGINT NOT NULL DEFAULT 0",
        ),
        (
            "ll_ledgers",
            "stripe_width",
            "ALTER TABLE ll_ledgers ADD COLUMN stripe_width BIGINT NOT NULL DEFAULT 0",
        ),
    ] {
        let has: Option<i64> = sqlx::query("SELECT 1 FROM pragma_table_info(?) WHERE name = ?")
            .bind(table)
            .bind(column)
            .fetch_optional(&mut *c)
            .await
            .map_err(backend("inspect a table"))?
            .map(|r| r.try_get(0))
            .transpose()
            .map_err(backend("inspect a table"))?;
        if has.is_none() {
            sqlx::query(ddl)
                .execute(&mut *c)
                .await
                .map_err(backend("add a column"))?;
        }
    }
    Ok(())
}

/// The epoch topic `topic_id`'s writers are fenced at, read on the writer's connection `c`.
pub(super) async fn fence_of(
    c: &mut SqliteConnection,
    topic_id: TopicId,
) -> Result<i64, MetadataError> {
    let fenced_at: Option<i64> =
        sqlx::query("SELECT writer_epoch FROM ll_topics WHERE topic_id = ?")
            .bind(topic_id as i64)
            .fetch_optional(&mut *c)
            .await
            .map_err(backend("find topic"))?
            .map(|r| r.try_get(0))
            .transpose()
            .map_err(backend("find topic"))?;
    fenced_at.ok_or(MetadataError::TopicNotFound(topic_id))
}
