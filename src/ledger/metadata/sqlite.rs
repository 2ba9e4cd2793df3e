//! SQLite implementation of [`MetadataStore`] (the embedded default), via sqlx.
//!
//! Why SQLite through sqlx rather than an embedded KV store: the Iceberg SQL catalog already
//! brings sqlx and SQLite into the binary, the same SQL runs on PostgreSQL with only the
//! placeholder style changed, and a user can inspect the state with the `sqlite3` shell.
//! The database runs in WAL mode with `synchronous=FULL`, so a transaction that returned is
//! durable. Writes go through one writer task that commits what queued meanwhile in one
//! transaction (group commit, `sqlite/writer.rs`): a burst of metadata writes (thousands of
//! partitions creating their first ledger, subscriptions saving cursors) costs a few syncs, not
//! one each. Reads run on a small pool of other connections beside it (WAL readers do not
//! wait for the writer) and see every write whose call returned.
//!
//! Schema version 1 (`ll_meta.schema_version`); a change needs an ADR and a migration step in
//! [`SqliteMetadataStore::open`]. Additive changes since (older builds ignore them): the
//! `ll_policies` table (ADR 0002), the `ll_ledgers.bookie` column (ADR 0007).

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Connection, Row, SqliteConnection, SqlitePool};

use super::{
    name_range_end, CopyChange, EnsembleChange, LedgerId, LedgerRecord, LedgerState,
    LedgerTransition, MetadataError, MetadataStore, Placement, SealInfo, TopicId, TopicRecord,
};

/// Schema version this build writes and reads.
pub const SCHEMA_VERSION: i64 = 1;

mod schema;
mod writer;
mod writes;

const LEDGER_COLUMNS: &str = "ledger_id, topic_id, state, first_segment, last_segment, entry_count, \
     size_bytes, min_publish_ms, max_publish_ms, checksum, created_at_ms, state_changed_at_ms, offload_ref, \
     bookie, replicas, ack_quorum, write_quorum, stripe_width";

/// Read connections: reads only run in parallel, so a few suffice on any machine.
const READERS: u32 = 4;

/// SQLite-backed metadata store.
#[derive(Debug, Clone)]
pub struct SqliteMetadataStore {
    /// Connections for reads. Invariant: nothing writes through them.
    pool: SqlitePool,
    /// The one connection that writes, behind its task: transactions never race each other.
    writer: writer::Writer,
}

fn backend(op: &'static str) -> impl FnOnce(sqlx::Error) -> MetadataError {
    move |e| MetadataError::Backend {
        op,
        source: Box::new(e),
    }
}

impl SqliteMetadataStore {
    /// Opens (creating if needed) the database file at `path`.
    pub async fn open(path: &Path) -> Result<Self, MetadataError> {
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(30))
            .foreign_keys(true);
        Self::open_with(opts).await
    }

    /// Opens a store from a `sqlite:` URL (e.g. `sqlite:/var/lib/ledgerlake/metadata.db`).
    pub async fn open_url(url: &str) -> Result<Self, MetadataError> {
        let opts = SqliteConnectOptions::from_str(url)
            .map_err(backend("parse url"))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(30))
            .foreign_keys(true);
        Self::open_with(opts).await
    }

    async fn open_with(opts: SqliteConnectOptions) -> Result<Self, MetadataError> {
        let mut conn = SqliteConnection::connect_with(&opts)
            .await
            .map_err(backend("open"))?;
        for stmt in schema::SCHEMA {
            sqlx::query(stmt)
                .execute(&mut conn)
                .await
                .map_err(backend("create schema"))?;
        }
        schema::add_later_columns(&mut conn).await?;
        let writer = writer::Writer::spawn(conn);
        let pool = SqlitePoolOptions::new()
            .max_connections(READERS)
            .connect_with(opts)
            .await
            .map_err(backend("open"))?;
        let version: i64 = sqlx::query("SELECT value FROM ll_meta WHERE key = 'schema_version'")
            .fetch_one(&pool)
            .await
            .map_err(backend("read schema version"))?
            .try_get(0)
            .map_err(backend("read schema version"))?;
        if version != SCHEMA_VERSION {
            return Err(MetadataError::Corrupt(format!(
                "metadata schema version {version}; this build reads version {SCHEMA_VERSION}"
            )));
        }
        Ok(Self { pool, writer })
    }
}

fn ledger_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<LedgerRecord, MetadataError> {
    let get_i64 = |c: &str| -> Result<i64, MetadataError> {
        row.try_get::<i64, _>(c).map_err(backend("decode ledger"))
    };
    let get_opt = |c: &str| -> Result<Option<i64>, MetadataError> {
        row.try_get::<Option<i64>, _>(c)
            .map_err(backend("decode ledger"))
    };
    let state_raw = get_i64("state")?;
    let state = u8::try_from(state_raw)
        .ok()
        .and_then(LedgerState::from_u8)
        .ok_or_else(|| MetadataError::Corrupt(format!("ledger state {state_raw}")))?;
    let seal = match get_opt("entry_count")? {
        None => None,
        Some(entry_count) => Some(SealInfo {
            entry_count: entry_count as u64,
            size_bytes: get_opt("size_bytes")?.unwrap_or(0) as u64,
            min_publish_ms: get_opt("min_publish_ms")?,
            max_publish_ms: get_opt("max_publish_ms")?,
            last_segment: get_opt("last_segment")?.unwrap_or(0) as u32,
            checksum: get_opt("checksum")?.unwrap_or(0) as u32,
        }),
    };
    Ok(LedgerRecord {
        id: get_i64("ledger_id")? as u64,
        topic_id: get_i64("topic_id")? as u64,
        state,
        first_segment: get_i64("first_segment")? as u32,
        seal,
        created_at_ms: get_i64("created_at_ms")?,
        state_changed_at_ms: get_i64("state_changed_at_ms")?,
        offload_ref: row
            .try_get::<Option<String>, _>("offload_ref")
            .map_err(backend("decode ledger"))?,
        bookie: row
            .try_get::<String, _>("bookie")
            .map_err(backend("decode ledger"))?,
        replicas: decode_replicas(
            &row.try_get::<String, _>("replicas")
                .map_err(backend("decode ledger"))?,
        )?,
        ack_quorum: u8::try_from(get_i64("ack_quorum")?)
            .map_err(|_| MetadataError::Corrupt("ledger ack quorum out of range".into()))?,
        write_quorum: u8::try_from(get_i64("write_quorum")?)
            .map_err(|_| MetadataError::Corrupt("ledger write quorum out of range".into()))?,
        stripe_width: u8::try_from(get_i64("stripe_width")?)
            .map_err(|_| MetadataError::Corrupt("ledger stripe width out of range".into()))?,
    })
}

/// The `replicas` column: a JSON array of bookie ids (`''` in rows from before ADR 0010).
fn decode_replicas(text: &str) -> Result<Vec<String>, MetadataError> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    serde_json::from_str(text).map_err(|e| MetadataError::Corrupt(format!("ledger replicas: {e}")))
}

/// The `replicas` column of `replicas`.
pub(super) fn encode_replicas(replicas: &[String]) -> String {
    if replicas.is_empty() {
        return String::new();
    }
    serde_json::to_string(replicas).unwrap_or_default()
}

fn topic_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<TopicRecord, MetadataError> {
    Ok(TopicRecord {
        id: row
            .try_get::<i64, _>("topic_id")
            .map_err(backend("decode topic"))? as u64,
        name: row.try_get("name").map_err(backend("decode topic"))?,
        created_at_ms: row
            .try_get("created_at_ms")
            .map_err(backend("decode topic"))?,
    })
}

impl SqliteMetadataStore {
    /// The one topic row `query` selects (by a unique key, or `LIMIT 1`), if any.
    async fn find_topic<'q>(
        &self,
        query: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    ) -> Result<Option<TopicRecord>, MetadataError> {
        query
            .fetch_optional(&self.pool)
            .await
            .map_err(backend("find topic"))?
            .as_ref()
            .map(topic_from_row)
            .transpose()
    }

    /// Every topic row `query` selects, in its order.
    async fn find_topics<'q>(
        &self,
        query: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    ) -> Result<Vec<TopicRecord>, MetadataError> {
        query
            .fetch_all(&self.pool)
            .await
            .map_err(backend("list topics"))?
            .iter()
            .map(topic_from_row)
            .collect()
    }
}

#[async_trait]
impl MetadataStore for SqliteMetadataStore {
    async fn close(&self) {
        // Lets queued writes finish, then waits for in-flight reads.
        self.writer.close().await;
        self.pool.close().await;
    }

    async fn get_or_create_topic(
        &self,
        name: &str,
        now_ms: i64,
    ) -> Result<TopicRecord, MetadataError> {
        // Loading a known topic writes nothing: only a missing one goes to the writer.
        if let Some(topic) = self.get_topic(name).await? {
            return Ok(topic);
        }
        let name = name.to_string();
        self.writer
            .run(move |c| {
                Box::pin(async move { writes::get_or_create_topic(c, &name, now_ms).await })
            })
            .await
    }

    async fn get_topic(&self, name: &str) -> Result<Option<TopicRecord>, MetadataError> {
        self.find_topic(
            sqlx::query("SELECT topic_id, name, created_at_ms FROM ll_topics WHERE name = ?")
                .bind(name),
        )
        .await
    }

    async fn get_topic_by_id(&self, id: TopicId) -> Result<Option<TopicRecord>, MetadataError> {
        self.find_topic(
            sqlx::query("SELECT topic_id, name, created_at_ms FROM ll_topics WHERE topic_id = ?")
                .bind(id as i64),
        )
        .await
    }

    async fn list_topics(&self) -> Result<Vec<TopicRecord>, MetadataError> {
        self.find_topics(sqlx::query(
            "SELECT topic_id, name, created_at_ms FROM ll_topics ORDER BY topic_id",
        ))
        .await
    }

    async fn list_topics_under(&self, prefix: &str) -> Result<Vec<TopicRecord>, MetadataError> {
        // A range on the unique index of names: [prefix, the first string after every name
        // that starts with it).
        let end = name_range_end(prefix);
        let sql = if end.is_some() {
            "SELECT topic_id, name, created_at_ms FROM ll_topics \
             WHERE name >= ? AND name < ? ORDER BY name"
        } else {
            "SELECT topic_id, name, created_at_ms FROM ll_topics WHERE name >= ? ORDER BY name"
        };
        let mut query = sqlx::query(sql).bind(prefix);
        if let Some(end) = end {
            query = query.bind(end);
        }
        self.find_topics(query).await
    }

    async fn first_topic_from(&self, name: &str) -> Result<Option<TopicRecord>, MetadataError> {
        self.find_topic(
            sqlx::query(
                "SELECT topic_id, name, created_at_ms FROM ll_topics \
                 WHERE name >= ? ORDER BY name LIMIT 1",
            )
            .bind(name),
        )
        .await
    }

    async fn delete_topic(&self, name: &str) -> Result<bool, MetadataError> {
        let name = name.to_string();
        self.writer
            .run(move |c| Box::pin(async move { writes::delete_topic(c, &name).await }))
            .await
    }

    async fn create_ledger_placed(
        &self,
        topic_id: TopicId,
        first_segment: u32,
        placement: Placement<'_>,
        now_ms: i64,
        writer_epoch: Option<u64>,
    ) -> Result<LedgerRecord, MetadataError> {
        let placed = writes::Placed {
            bookie: placement.bookie.to_string(),
            replicas: placement.replicas.to_vec(),
            ack_quorum: placement.ack_quorum,
            write_quorum: placement.write_quorum,
            stripe_width: placement.stripe_width,
        };
        self.writer
            .run(move |c| {
                Box::pin(async move {
                    writes::create_ledger(c, topic_id, first_segment, &placed, now_ms, writer_epoch)
                        .await
                })
            })
            .await
    }

    async fn fence_writers(&self, topic_id: TopicId, epoch: u64) -> Result<(), MetadataError> {
        self.writer
            .run(move |c| Box::pin(async move { writes::fence_writers(c, topic_id, epoch).await }))
            .await
    }

    async fn get_ledger(&self, id: LedgerId) -> Result<Option<LedgerRecord>, MetadataError> {
        let row = sqlx::query(&format!(
            "SELECT {LEDGER_COLUMNS} FROM ll_ledgers WHERE ledger_id = ?"
        ))
        .bind(id as i64)
        .fetch_optional(&self.pool)
        .await
        .map_err(backend("get ledger"))?;
        row.as_ref().map(ledger_from_row).transpose()
    }

    async fn topic_ledgers(&self, topic_id: TopicId) -> Result<Vec<LedgerRecord>, MetadataError> {
        sqlx::query(&format!(
            "SELECT {LEDGER_COLUMNS} FROM ll_ledgers WHERE topic_id = ? ORDER BY ledger_id"
        ))
        .bind(topic_id as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(backend("list topic ledgers"))?
        .iter()
        .map(ledger_from_row)
        .collect()
    }

    async fn ledgers_in_states(
        &self,
        states: &[LedgerState],
    ) -> Result<Vec<LedgerRecord>, MetadataError> {
        if states.is_empty() {
            return Ok(Vec::new());
        }
        let list = states
            .iter()
            .map(|s| s.as_u8().to_string())
            .collect::<Vec<_>>()
            .join(",");
        sqlx::query(&format!(
            "SELECT {LEDGER_COLUMNS} FROM ll_ledgers WHERE state IN ({list}) ORDER BY ledger_id"
        ))
        .fetch_all(&self.pool)
        .await
        .map_err(backend("list ledgers by state"))?
        .iter()
        .map(ledger_from_row)
        .collect()
    }

    async fn transition_ledger(
        &self,
        id: LedgerId,
        transition: LedgerTransition,
        now_ms: i64,
    ) -> Result<LedgerRecord, MetadataError> {
        self.writer
            .run(move |c| {
                Box::pin(async move { writes::transition_ledger(c, id, transition, now_ms).await })
            })
            .await
    }

    async fn move_ledger_copies(
        &self,
        id: LedgerId,
        change: &CopyChange,
    ) -> Result<LedgerRecord, MetadataError> {
        let change = change.clone();
        self.writer
            .run(move |c| Box::pin(async move { writes::move_ledger_copies(c, id, &change).await }))
            .await
    }

    async fn change_ensemble(
        &self,
        id: LedgerId,
        change: &EnsembleChange,
        writer_epoch: Option<u64>,
    ) -> Result<LedgerRecord, MetadataError> {
        let change = change.clone();
        self.writer
            .run(move |c| {
                Box::pin(async move { writes::change_ensemble(c, id, &change, writer_epoch).await })
            })
            .await
    }

    async fn save_cursor(
        &self,
        topic_id: TopicId,
        subscription: &str,
        state: &[u8],
        now_ms: i64,
        writer_epoch: Option<u64>,
    ) -> Result<(), MetadataError> {
        let (subscription, state) = (subscription.to_string(), state.to_vec());
        self.writer
            .run(move |c| {
                Box::pin(async move {
                    let cursor = (subscription.as_str(), state.as_slice());
                    writes::save_cursor(c, topic_id, cursor, now_ms, writer_epoch).await
                })
            })
            .await
    }

    async fn topic_cursors(
        &self,
        topic_id: TopicId,
    ) -> Result<Vec<(String, Vec<u8>)>, MetadataError> {
        sqlx::query(
            "SELECT subscription, state FROM ll_cursors WHERE topic_id = ? ORDER BY subscription",
        )
        .bind(topic_id as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(backend("list cursors"))?
        .iter()
        .map(|row| {
            Ok((
                row.try_get::<String, _>("subscription")
                    .map_err(backend("decode cursor"))?,
                row.try_get::<Vec<u8>, _>("state")
                    .map_err(backend("decode cursor"))?,
            ))
        })
        .collect()
    }

    async fn delete_cursor(
        &self,
        topic_id: TopicId,
        subscription: &str,
        writer_epoch: Option<u64>,
    ) -> Result<(), MetadataError> {
        let subscription = subscription.to_string();
        self.writer
            .run(move |c| {
                Box::pin(async move {
                    writes::delete_cursor(c, topic_id, &subscription, writer_epoch).await
                })
            })
            .await
    }

    async fn set_partitions(
        &self,
        name: &str,
        partitions: u32,
        update: bool,
    ) -> Result<(), MetadataError> {
        let name = name.to_string();
        self.writer
            .run(move |c| {
                Box::pin(async move { writes::set_partitions(c, &name, partitions, update).await })
            })
            .await
    }

    async fn list_partitioned_topics(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, u32)>, MetadataError> {
        sqlx::query(
            "SELECT name, partitions FROM ll_partitioned_topics \
             WHERE substr(name, 1, ?) = ? ORDER BY name",
        )
        .bind(prefix.chars().count() as i64)
        .bind(prefix)
        .fetch_all(&self.pool)
        .await
        .map_err(backend("list partitioned topics"))?
        .iter()
        .map(|row| {
            Ok((
                row.try_get::<String, _>(0)
                    .map_err(backend("decode partitioned topic"))?,
                row.try_get::<i64, _>(1)
                    .map_err(backend("decode partitioned topic"))? as u32,
            ))
        })
        .collect()
    }

    async fn last_ledger_id(&self) -> Result<LedgerId, MetadataError> {
        let next: i64 = sqlx::query("SELECT value FROM ll_meta WHERE key = 'next_ledger_id'")
            .fetch_one(&self.pool)
            .await
            .map_err(backend("read ledger id counter"))?
            .try_get(0)
            .map_err(backend("read ledger id counter"))?;
        Ok(u64::try_from(next - 1).unwrap_or(0))
    }

    async fn get_partitions(&self, name: &str) -> Result<Option<u32>, MetadataError> {
        sqlx::query("SELECT partitions FROM ll_partitioned_topics WHERE name = ?")
            .bind(name)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend("get partitions"))?
            .map(|r| r.try_get::<i64, _>(0).map(|n| n as u32))
            .transpose()
            .map_err(backend("get partitions"))
    }

    async fn add_schema(
        &self,
        topic: &str,
        version: u64,
        schema: &[u8],
    ) -> Result<(), MetadataError> {
        let (topic, schema) = (topic.to_string(), schema.to_vec());
        self.writer
            .run(move |c| {
                Box::pin(async move { writes::add_schema(c, &topic, version, &schema).await })
            })
            .await
    }

    async fn schemas(&self, topic: &str) -> Result<Vec<(u64, Vec<u8>)>, MetadataError> {
        sqlx::query("SELECT version, schema FROM ll_schemas WHERE topic = ? ORDER BY version")
            .bind(topic)
            .fetch_all(&self.pool)
            .await
            .map_err(backend("list schemas"))?
            .iter()
            .map(|row| {
                Ok((
                    row.try_get::<i64, _>(0).map_err(backend("decode schema"))? as u64,
                    row.try_get::<Vec<u8>, _>(1)
                        .map_err(backend("decode schema"))?,
                ))
            })
            .collect()
    }

    async fn get_policies(&self, scope: &str) -> Result<Option<Vec<u8>>, MetadataError> {
        sqlx::query("SELECT policies FROM ll_policies WHERE scope = ?")
            .bind(scope)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend("get policies"))?
            .map(|r| r.try_get::<Vec<u8>, _>(0))
            .transpose()
            .map_err(backend("get policies"))
    }

    async fn set_policies(
        &self,
        scope: &str,
        policies: Option<&[u8]>,
    ) -> Result<(), MetadataError> {
        let (scope, policies) = (scope.to_string(), policies.map(<[u8]>::to_vec));
        self.writer
            .run(move |c| {
                Box::pin(async move { writes::set_policies(c, &scope, policies.as_deref()).await })
            })
            .await
    }

    async fn create_policies(&self, scope: &str, policies: &[u8]) -> Result<bool, MetadataError> {
        let (scope, policies) = (scope.to_string(), policies.to_vec());
        self.writer
            .run(move |c| {
                Box::pin(async move { writes::create_policies(c, &scope, &policies).await })
            })
            .await
    }

    async fn replace_policies(
        &self,
        scope: &str,
        expect: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, MetadataError> {
        let scope = scope.to_string();
        let (expect, new) = (expect.map(<[u8]>::to_vec), new.map(<[u8]>::to_vec));
        self.writer
            .run(move |c| {
                Box::pin(async move {
                    writes::replace_policies(c, &scope, expect.as_deref(), new.as_deref()).await
                })
            })
            .await
    }

    async fn list_policies(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, MetadataError> {
        // substr rather than LIKE: scopes may hold '%' and '_'.
        sqlx::query(
            "SELECT scope, policies FROM ll_policies WHERE substr(scope, 1, ?) = ? ORDER BY scope",
        )
        .bind(prefix.chars().count() as i64)
        .bind(prefix)
        .fetch_all(&self.pool)
        .await
        .map_err(backend("list policies"))?
        .iter()
        .map(|row| {
            Ok((
                row.try_get::<String, _>(0)
                    .map_err(backend("decode policies"))?,
                row.try_get::<Vec<u8>, _>(1)
                    .map_err(backend("decode policies"))?,
            ))
        })
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::ledger::metadata::name_range_end;

    #[test]
    fn a_name_range_ends_just_past_its_prefix() {
        assert_eq!(
            name_range_end("persistent://a/n/").as_deref(),
            Some("persistent://a/n0")
        );
        assert_eq!(name_range_end("a\u{d7ff}").as_deref(), Some("a\u{e000}"));
        assert_eq!(name_range_end("a\u{10ffff}").as_deref(), Some("b"));
        assert_eq!(name_range_end(""), None);
        assert_eq!(name_range_end("\u{10ffff}"), None);
        for (prefix, name) in [("ab", "ab\u{10ffff}z"), ("a\u{e9}", "a\u{e9}\u{e9}")] {
            let end = name_range_end(prefix).unwrap_or_default();
            assert!(name.starts_with(prefix) && name < end.as_str());
        }
    }
}
