//! SQLite implementation of [`MetadataStore`] (the embedded default), via sqlx.
//!
//! Why SQLite through sqlx rather than an embedded KV store: the Iceberg SQL catalog already
//! brings sqlx and SQLite into the binary, the same SQL runs on PostgreSQL with only the
//! placeholder style changed, and a user can inspect the state with the `sqlite3` shell.
//! The database runs in WAL mode with `synchronous=FULL`, so a transaction that returned is
//! durable. One connection serialises writers: metadata changes are rare (ledger rollover,
//! offload), never per message.
//!
//! Schema version 1 (`ll_meta.schema_version`); a change needs an ADR and a migration step in
//! [`SqliteMetadataStore::open`]. Additive changes since (older builds ignore them): the
//! `ll_policies` table (ADR 0002), the `ll_ledgers.bookie` column (ADR 0007).

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};

use super::{
    check_partition_change, LedgerId, LedgerRecord, LedgerState, LedgerTransition, MetadataError,
    MetadataStore, SealInfo, TopicId, TopicRecord,
};

/// Schema version this build writes and reads.
pub const SCHEMA_VERSION: i64 = 1;

mod schema;

const LEDGER_COLUMNS: &str = "ledger_id, topic_id, state, first_segment, last_segment, entry_count, \
     size_bytes, min_publish_ms, max_publish_ms, checksum, created_at_ms, state_changed_at_ms, offload_ref, \
     bookie";

/// SQLite-backed metadata store.
#[derive(Debug, Clone)]
pub struct SqliteMetadataStore {
    /// Invariant: at most one connection, so transactions never race each other.
    pool: SqlitePool,
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
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(opts)
            .await
            .map_err(backend("open"))?;
        for stmt in schema::SCHEMA {
            sqlx::query(stmt)
                .execute(&pool)
                .await
                .map_err(backend("create schema"))?;
        }
        schema::add_later_columns(&pool).await?;
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
        Ok(Self { pool })
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
    })
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

#[async_trait]
impl MetadataStore for SqliteMetadataStore {
    async fn close(&self) {
        // Waits for in-flight statements.
        self.pool.close().await;
    }

    async fn get_or_create_topic(
        &self,
        name: &str,
        now_ms: i64,
    ) -> Result<TopicRecord, MetadataError> {
        let mut tx = self.pool.begin().await.map_err(backend("begin"))?;
        if let Some(row) =
            sqlx::query("SELECT topic_id, name, created_at_ms FROM ll_topics WHERE name = ?")
                .bind(name)
                .fetch_optional(&mut *tx)
                .await
                .map_err(backend("find topic"))?
        {
            return topic_from_row(&row);
        }
        let id: i64 = sqlx::query(
            "UPDATE ll_meta SET value = value + 1 WHERE key = 'next_topic_id' RETURNING value - 1",
        )
        .fetch_one(&mut *tx)
        .await
        .map_err(backend("allocate topic id"))?
        .try_get(0)
        .map_err(backend("allocate topic id"))?;
        sqlx::query("INSERT INTO ll_topics(topic_id, name, created_at_ms) VALUES (?, ?, ?)")
            .bind(id)
            .bind(name)
            .bind(now_ms)
            .execute(&mut *tx)
            .await
            .map_err(backend("insert topic"))?;
        tx.commit().await.map_err(backend("commit topic"))?;
        Ok(TopicRecord {
            id: id as u64,
            name: name.to_string(),
            created_at_ms: now_ms,
        })
    }

    async fn get_topic(&self, name: &str) -> Result<Option<TopicRecord>, MetadataError> {
        sqlx::query("SELECT topic_id, name, created_at_ms FROM ll_topics WHERE name = ?")
            .bind(name)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend("find topic"))?
            .as_ref()
            .map(topic_from_row)
            .transpose()
    }

    async fn list_topics(&self) -> Result<Vec<TopicRecord>, MetadataError> {
        sqlx::query("SELECT topic_id, name, created_at_ms FROM ll_topics ORDER BY topic_id")
            .fetch_all(&self.pool)
            .await
            .map_err(backend("list topics"))?
            .iter()
            .map(topic_from_row)
            .collect()
    }

    async fn delete_topic(&self, name: &str) -> Result<bool, MetadataError> {
        let mut tx = self.pool.begin().await.map_err(backend("begin"))?;
        let topic_id: Option<i64> = sqlx::query("SELECT topic_id FROM ll_topics WHERE name = ?")
            .bind(name)
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend("find topic"))?
            .map(|r| r.try_get(0))
            .transpose()
            .map_err(backend("find topic"))?;
        let mut existed = false;
        if let Some(id) = topic_id {
            existed = true;
            let live: i64 = sqlx::query(
                "SELECT count(*) FROM ll_ledgers WHERE topic_id = ? AND state NOT IN (?, ?)",
            )
            .bind(id)
            .bind(i64::from(LedgerState::Deleted.as_u8()))
            .bind(i64::from(LedgerState::Expired.as_u8()))
            .fetch_one(&mut *tx)
            .await
            .map_err(backend("count live ledgers"))?
            .try_get(0)
            .map_err(backend("count live ledgers"))?;
            if live > 0 {
                return Err(MetadataError::Conflict(format!(
                    "topic {name} still has {live} ledgers that are not deleted"
                )));
            }
            for sql in [
                "DELETE FROM ll_cursors WHERE topic_id = ?",
                "DELETE FROM ll_ledgers WHERE topic_id = ?",
                "DELETE FROM ll_topics WHERE topic_id = ?",
            ] {
                sqlx::query(sql)
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .map_err(backend("delete topic"))?;
            }
        }
        for sql in [
            "DELETE FROM ll_schemas WHERE topic = ?",
            "DELETE FROM ll_partitioned_topics WHERE name = ?",
        ] {
            existed |= sqlx::query(sql)
                .bind(name)
                .execute(&mut *tx)
                .await
                .map_err(backend("delete topic"))?
                .rows_affected()
                > 0;
        }
        tx.commit()
            .await
            .map_err(backend("commit topic deletion"))?;
        Ok(existed)
    }

    async fn create_ledger(
        &self,
        topic_id: TopicId,
        first_segment: u32,
        bookie: &str,
        now_ms: i64,
        writer_epoch: Option<u64>,
    ) -> Result<LedgerRecord, MetadataError> {
        let mut tx = self.pool.begin().await.map_err(backend("begin"))?;
        let fenced_at = schema::fence_of(&mut tx, topic_id).await?;
        if let Some(epoch) = writer_epoch.filter(|e| (*e as i64) < fenced_at) {
            return Err(MetadataError::Fenced {
                topic_id,
                epoch,
                fenced_at: fenced_at as u64,
            });
        }
        let id: i64 = sqlx::query(
            "UPDATE ll_meta SET value = value + 1 WHERE key = 'next_ledger_id' RETURNING value - 1",
        )
        .fetch_one(&mut *tx)
        .await
        .map_err(backend("allocate ledger id"))?
        .try_get(0)
        .map_err(backend("allocate ledger id"))?;
        sqlx::query(
            "INSERT INTO ll_ledgers(ledger_id, topic_id, state, first_segment, created_at_ms, state_changed_at_ms, bookie)
             VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(id)
        .bind(topic_id as i64)
        .bind(i64::from(LedgerState::Open.as_u8()))
        .bind(i64::from(first_segment))
        .bind(now_ms)
        .bind(now_ms)
        .bind(bookie)
        .execute(&mut *tx)
        .await
        .map_err(backend("insert ledger"))?;
        tx.commit().await.map_err(backend("commit ledger"))?;
        Ok(LedgerRecord {
            id: id as u64,
            topic_id,
            state: LedgerState::Open,
            first_segment,
            seal: None,
            created_at_ms: now_ms,
            state_changed_at_ms: now_ms,
            offload_ref: None,
            bookie: bookie.to_string(),
        })
    }

    async fn fence_writers(&self, topic_id: TopicId, epoch: u64) -> Result<(), MetadataError> {
        let mut tx = self.pool.begin().await.map_err(backend("begin"))?;
        let fenced_at = schema::fence_of(&mut tx, topic_id).await?;
        if fenced_at as u64 > epoch {
            return Err(MetadataError::Fenced {
                topic_id,
                epoch,
                fenced_at: fenced_at as u64,
            });
        }
        sqlx::query("UPDATE ll_topics SET writer_epoch = ? WHERE topic_id = ?")
            .bind(epoch as i64)
            .bind(topic_id as i64)
            .execute(&mut *tx)
            .await
            .map_err(backend("fence writers"))?;
        tx.commit().await.map_err(backend("commit fence"))?;
        Ok(())
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
        let mut tx = self.pool.begin().await.map_err(backend("begin"))?;
        let row = sqlx::query(&format!(
            "SELECT {LEDGER_COLUMNS} FROM ll_ledgers WHERE ledger_id = ?"
        ))
        .bind(id as i64)
        .fetch_optional(&mut *tx)
        .await
        .map_err(backend("get ledger"))?
        .ok_or(MetadataError::LedgerNotFound(id))?;
        let mut current = ledger_from_row(&row)?;
        let to = transition.target();
        if !current.state.can_become(to) {
            return Err(MetadataError::InvalidTransition {
                ledger: id,
                from: current.state,
                to,
            });
        }
        let from = i64::from(current.state.as_u8());
        let result = match &transition {
            LedgerTransition::Seal(info) => sqlx::query(
                "UPDATE ll_ledgers SET state = ?, state_changed_at_ms = ?, last_segment = ?,
                     entry_count = ?, size_bytes = ?, min_publish_ms = ?, max_publish_ms = ?, checksum = ?
                 WHERE ledger_id = ? AND state = ?",
            )
            .bind(i64::from(to.as_u8()))
            .bind(now_ms)
            .bind(i64::from(info.last_segment))
            .bind(info.entry_count as i64)
            .bind(info.size_bytes as i64)
            .bind(info.min_publish_ms)
            .bind(info.max_publish_ms)
            .bind(i64::from(info.checksum))
            .bind(id as i64)
            .bind(from),
            LedgerTransition::Offload { reference } => sqlx::query(
                "UPDATE ll_ledgers SET state = ?, state_changed_at_ms = ?, offload_ref = ?
                 WHERE ledger_id = ? AND state = ?",
            )
            .bind(i64::from(to.as_u8()))
            .bind(now_ms)
            .bind(reference.clone())
            .bind(id as i64)
            .bind(from),
            LedgerTransition::Delete | LedgerTransition::Expire => sqlx::query(
                "UPDATE ll_ledgers SET state = ?, state_changed_at_ms = ? WHERE ledger_id = ? AND state = ?",
            )
            .bind(i64::from(to.as_u8()))
            .bind(now_ms)
            .bind(id as i64)
            .bind(from),
        }
        .execute(&mut *tx)
        .await
        .map_err(backend("update ledger"))?;
        if result.rows_affected() != 1 {
            return Err(MetadataError::Corrupt(format!(
                "ledger {id} changed state during a transition"
            )));
        }
        tx.commit().await.map_err(backend("commit transition"))?;
        match transition {
            LedgerTransition::Seal(info) => current.seal = Some(info),
            LedgerTransition::Offload { reference } => current.offload_ref = Some(reference),
            LedgerTransition::Delete | LedgerTransition::Expire => {}
        }
        current.state = to;
        current.state_changed_at_ms = now_ms;
        Ok(current)
    }

    async fn save_cursor(
        &self,
        topic_id: TopicId,
        subscription: &str,
        state: &[u8],
        now_ms: i64,
    ) -> Result<(), MetadataError> {
        let result = sqlx::query(
            "INSERT INTO ll_cursors(topic_id, subscription, state, updated_at_ms) VALUES (?, ?, ?, ?)
             ON CONFLICT(topic_id, subscription) DO UPDATE SET state = excluded.state,
                 updated_at_ms = excluded.updated_at_ms",
        )
        .bind(topic_id as i64)
        .bind(subscription)
        .bind(state)
        .bind(now_ms)
        .execute(&self.pool)
        .await;
        match result {
            Ok(_) => Ok(()),
            Err(sqlx::Error::Database(e)) if e.is_foreign_key_violation() => {
                Err(MetadataError::TopicNotFound(topic_id))
            }
            Err(e) => Err(backend("save cursor")(e)),
        }
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
    ) -> Result<(), MetadataError> {
        sqlx::query("DELETE FROM ll_cursors WHERE topic_id = ? AND subscription = ?")
            .bind(topic_id as i64)
            .bind(subscription)
            .execute(&self.pool)
            .await
            .map_err(backend("delete cursor"))?;
        Ok(())
    }

    async fn set_partitions(
        &self,
        name: &str,
        partitions: u32,
        update: bool,
    ) -> Result<(), MetadataError> {
        let mut tx = self.pool.begin().await.map_err(backend("begin"))?;
        let existing: Option<i64> =
            sqlx::query("SELECT partitions FROM ll_partitioned_topics WHERE name = ?")
                .bind(name)
                .fetch_optional(&mut *tx)
                .await
                .map_err(backend("get partitions"))?
                .map(|r| r.try_get(0))
                .transpose()
                .map_err(backend("get partitions"))?;
        check_partition_change(name, existing.map(|n| n as u32), partitions, update)?;
        sqlx::query(
            "INSERT INTO ll_partitioned_topics(name, partitions) VALUES (?, ?)
             ON CONFLICT(name) DO UPDATE SET partitions = excluded.partitions",
        )
        .bind(name)
        .bind(i64::from(partitions))
        .execute(&mut *tx)
        .await
        .map_err(backend("set partitions"))?;
        tx.commit().await.map_err(backend("commit partitions"))?;
        Ok(())
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
        let mut tx = self.pool.begin().await.map_err(backend("begin"))?;
        let next: i64 = sqlx::query("SELECT COUNT(*) FROM ll_schemas WHERE topic = ?")
            .bind(topic)
            .fetch_one(&mut *tx)
            .await
            .map_err(backend("count schemas"))?
            .try_get(0)
            .map_err(backend("count schemas"))?;
        if next as u64 != version {
            return Err(MetadataError::Conflict(format!(
                "{topic}: schema version {version} is not the next one ({next})"
            )));
        }
        sqlx::query("INSERT INTO ll_schemas(topic, version, schema) VALUES (?, ?, ?)")
            .bind(topic)
            .bind(version as i64)
            .bind(schema)
            .execute(&mut *tx)
            .await
            .map_err(backend("add schema"))?;
        tx.commit().await.map_err(backend("commit schema"))?;
        Ok(())
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
        let q = match policies {
            Some(p) => sqlx::query(
                "INSERT INTO ll_policies(scope, policies) VALUES (?, ?) \
                 ON CONFLICT(scope) DO UPDATE SET policies = excluded.policies",
            )
            .bind(scope)
            .bind(p),
            None => sqlx::query("DELETE FROM ll_policies WHERE scope = ?").bind(scope),
        };
        q.execute(&self.pool)
            .await
            .map_err(backend("set policies"))?;
        Ok(())
    }

    async fn create_policies(&self, scope: &str, policies: &[u8]) -> Result<bool, MetadataError> {
        let done = sqlx::query(
            "INSERT INTO ll_policies(scope, policies) VALUES (?, ?) ON CONFLICT(scope) DO NOTHING",
        )
        .bind(scope)
        .bind(policies)
        .execute(&self.pool)
        .await
        .map_err(backend("create policies"))?;
        Ok(done.rows_affected() == 1)
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
