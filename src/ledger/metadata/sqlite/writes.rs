//! The SQLite store's write operations, each run by the writer (`writer.rs`) inside its
//! batch's transaction, under the operation's own savepoint: an early `Err` return undoes
//! what the operation wrote, and nothing here begins or commits a transaction.

use sqlx::{Row, SqliteConnection};

use super::{backend, ledger_from_row, schema, topic_from_row, LEDGER_COLUMNS};
use crate::ledger::metadata::{
    check_partition_change, CopyChange, EnsembleChange, LedgerId, LedgerRecord, LedgerState,
    LedgerTransition, MetadataError, TopicId, TopicRecord,
};

/// The topic named `name`, created if it does not exist.
pub(super) async fn get_or_create_topic(
    c: &mut SqliteConnection,
    name: &str,
    now_ms: i64,
) -> Result<TopicRecord, MetadataError> {
    if let Some(row) =
        sqlx::query("SELECT topic_id, name, created_at_ms FROM ll_topics WHERE name = ?")
            .bind(name)
            .fetch_optional(&mut *c)
            .await
            .map_err(backend("find topic"))?
    {
        return topic_from_row(&row);
    }
    let id: i64 = sqlx::query(
        "UPDATE ll_meta SET value = value + 1 WHERE key = 'next_topic_id' RETURNING value - 1",
    )
    .fetch_one(&mut *c)
    .await
    .map_err(backend("allocate topic id"))?
    .try_get(0)
    .map_err(backend("allocate topic id"))?;
    sqlx::query("INSERT INTO ll_topics(topic_id, name, created_at_ms) VALUES (?, ?, ?)")
        .bind(id)
        .bind(name)
        .bind(now_ms)
        .execute(&mut *c)
        .await
        .map_err(backend("insert topic"))?;
    Ok(TopicRecord {
        id: id as u64,
        name: name.to_string(),
        created_at_ms: now_ms,
    })
}

/// Deletes topic `name` and what hangs off it; refused while it has ledgers not deleted.
pub(super) async fn delete_topic(
    c: &mut SqliteConnection,
    name: &str,
) -> Result<bool, MetadataError> {
    let topic_id: Option<i64> = sqlx::query("SELECT topic_id FROM ll_topics WHERE name = ?")
        .bind(name)
        .fetch_optional(&mut *c)
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
        .fetch_one(&mut *c)
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
                .execute(&mut *c)
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
            .execute(&mut *c)
            .await
            .map_err(backend("delete topic"))?
            .rows_affected()
            > 0;
    }
    Ok(existed)
}

/// An owned [`crate::ledger::metadata::Placement`], for the writer task.
pub(super) struct Placed {
    pub bookie: String,
    pub replicas: Vec<String>,
    pub ack_quorum: u8,
    pub write_quorum: u8,
    pub stripe_width: u8,
}

/// A new open ledger of `topic_id`, refused to a writer of a fenced epoch.
pub(super) async fn create_ledger(
    c: &mut SqliteConnection,
    topic_id: TopicId,
    first_segment: u32,
    placed: &Placed,
    now_ms: i64,
    writer_epoch: Option<u64>,
) -> Result<LedgerRecord, MetadataError> {
    let fenced_at = schema::fence_of(c, topic_id).await?;
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
    .fetch_one(&mut *c)
    .await
    .map_err(backend("allocate ledger id"))?
    .try_get(0)
    .map_err(backend("allocate ledger id"))?;
    sqlx::query(
        "INSERT INTO ll_ledgers(ledger_id, topic_id, state, first_segment, created_at_ms, state_changed_at_ms, bookie, replicas, ack_quorum, write_quorum, stripe_width)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(id)
    .bind(topic_id as i64)
    .bind(i64::from(LedgerState::Open.as_u8()))
    .bind(i64::from(first_segment))
    .bind(now_ms)
    .bind(now_ms)
    .bind(&placed.bookie)
    .bind(super::encode_replicas(&placed.replicas))
    .bind(i64::from(placed.ack_quorum))
    .bind(i64::from(placed.write_quorum))
    .bind(i64::from(placed.stripe_width))
    .execute(&mut *c)
    .await
    .map_err(backend("insert ledger"))?;
    Ok(LedgerRecord {
        id: id as u64,
        topic_id,
        state: LedgerState::Open,
        first_segment,
        seal: None,
        created_at_ms: now_ms,
        state_changed_at_ms: now_ms,
        offload_ref: None,
        bookie: placed.bookie.clone(),
        replicas: placed.replicas.clone(),
        ack_quorum: placed.ack_quorum,
        write_quorum: placed.write_quorum,
        stripe_width: placed.stripe_width,
    })
}

/// Ledger `id`, read on the writer's connection.
async fn ledger_on(c: &mut SqliteConnection, id: LedgerId) -> Result<LedgerRecord, MetadataError> {
    let row = sqlx::query(&format!(
        "SELECT {LEDGER_COLUMNS} FROM ll_ledgers WHERE ledger_id = ?"
    ))
    .bind(id as i64)
    .fetch_optional(&mut *c)
    .await
    .map_err(backend("get ledger"))?
    .ok_or(MetadataError::LedgerNotFound(id))?;
    ledger_from_row(&row)
}

/// With `writer_epoch`: `Fenced` once a higher epoch fenced `topic_id`. The writer connection
/// runs one operation at a time, so no fence lands between this check and the write after it.
async fn not_fenced_above(
    c: &mut SqliteConnection,
    topic_id: TopicId,
    writer_epoch: Option<u64>,
) -> Result<(), MetadataError> {
    let Some(epoch) = writer_epoch else {
        return Ok(());
    };
    let fenced_at = schema::fence_of(c, topic_id).await? as u64;
    if epoch < fenced_at {
        return Err(MetadataError::Fenced {
            topic_id,
            epoch,
            fenced_at,
        });
    }
    Ok(())
}

/// Fences the writers of `topic_id` older than `epoch`.
pub(super) async fn fence_writers(
    c: &mut SqliteConnection,
    topic_id: TopicId,
    epoch: u64,
) -> Result<(), MetadataError> {
    let fenced_at = schema::fence_of(c, topic_id).await?;
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
        .execute(&mut *c)
        .await
        .map_err(backend("fence writers"))?;
    Ok(())
}

/// Moves a ledger to the transition's state, checking the current one.
pub(super) async fn transition_ledger(
    c: &mut SqliteConnection,
    id: LedgerId,
    transition: LedgerTransition,
    now_ms: i64,
) -> Result<LedgerRecord, MetadataError> {
    let mut current = ledger_on(c, id).await?;
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
        LedgerTransition::SealPlaced(p) => sqlx::query(
            "UPDATE ll_ledgers SET state = ?, state_changed_at_ms = ?, last_segment = ?,
                 entry_count = ?, size_bytes = ?, min_publish_ms = ?, max_publish_ms = ?, checksum = ?,
                 bookie = ?, replicas = ?, first_segment = ?
             WHERE ledger_id = ? AND state = ?",
        )
        .bind(i64::from(to.as_u8()))
        .bind(now_ms)
        .bind(i64::from(p.seal.last_segment))
        .bind(p.seal.entry_count as i64)
        .bind(p.seal.size_bytes as i64)
        .bind(p.seal.min_publish_ms)
        .bind(p.seal.max_publish_ms)
        .bind(i64::from(p.seal.checksum))
        .bind(p.bookie.clone())
        .bind(super::encode_replicas(&p.replicas))
        .bind(i64::from(p.first_segment))
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
    .execute(&mut *c)
    .await
    .map_err(backend("update ledger"))?;
    if result.rows_affected() != 1 {
        return Err(MetadataError::Corrupt(format!(
            "ledger {id} changed state during a transition"
        )));
    }
    // The row is updated as the transition leaves the record: the same rule, applied here.
    transition.apply(&mut current, now_ms)?;
    Ok(current)
}

/// Records a sealed ledger's new copies ([`CopyChange::apply`]), compared and set on the
/// columns it changes.
pub(super) async fn move_ledger_copies(
    c: &mut SqliteConnection,
    id: LedgerId,
    change: &CopyChange,
) -> Result<LedgerRecord, MetadataError> {
    let current = ledger_on(c, id).await?;
    let mut next = current.clone();
    change.apply(&mut next)?;
    let last = |l: &LedgerRecord| l.seal.map(|s| i64::from(s.last_segment));
    let result = sqlx::query(
        "UPDATE ll_ledgers SET bookie = ?, replicas = ?, first_segment = ?, last_segment = ?,
             write_quorum = ?
         WHERE ledger_id = ? AND state = ? AND bookie = ? AND replicas = ? AND first_segment = ?",
    )
    .bind(next.bookie.clone())
    .bind(super::encode_replicas(&next.replicas))
    .bind(i64::from(next.first_segment))
    .bind(last(&next))
    .bind(i64::from(next.write_quorum))
    .bind(id as i64)
    .bind(i64::from(current.state.as_u8()))
    .bind(current.bookie.clone())
    .bind(super::encode_replicas(&current.replicas))
    .bind(i64::from(current.first_segment))
    .execute(&mut *c)
    .await
    .map_err(backend("move ledger copies"))?;
    if result.rows_affected() != 1 {
        return Err(MetadataError::Conflict(format!(
            "ledger {id} changed while its copies were moved"
        )));
    }
    Ok(next)
}

/// Replaces a failed replica of an open ledger ([`EnsembleChange::apply`]), unless a higher
/// epoch fenced its topic's writers; compared and set on the columns it reads.
pub(super) async fn change_ensemble(
    c: &mut SqliteConnection,
    id: LedgerId,
    change: &EnsembleChange,
    writer_epoch: Option<u64>,
) -> Result<LedgerRecord, MetadataError> {
    let current = ledger_on(c, id).await?;
    not_fenced_above(c, current.topic_id, writer_epoch).await?;
    let mut next = current.clone();
    change.apply(&mut next)?;
    let result = sqlx::query(
        "UPDATE ll_ledgers SET replicas = ? WHERE ledger_id = ? AND state = ? AND replicas = ?",
    )
    .bind(super::encode_replicas(&next.replicas))
    .bind(id as i64)
    .bind(i64::from(current.state.as_u8()))
    .bind(super::encode_replicas(&current.replicas))
    .execute(&mut *c)
    .await
    .map_err(backend("change ensemble"))?;
    if result.rows_affected() != 1 {
        return Err(MetadataError::Conflict(format!(
            "ledger {id} changed while its ensemble was changed"
        )));
    }
    Ok(next)
}

/// Saves a subscription's cursor (upsert).
pub(super) async fn save_cursor(
    c: &mut SqliteConnection,
    topic_id: TopicId,
    (subscription, state): (&str, &[u8]),
    now_ms: i64,
    writer_epoch: Option<u64>,
) -> Result<(), MetadataError> {
    not_fenced_above(c, topic_id, writer_epoch).await?;
    let result = sqlx::query(
        "INSERT INTO ll_cursors(topic_id, subscription, state, updated_at_ms) VALUES (?, ?, ?, ?)
         ON CONFLICT(topic_id, subscription) DO UPDATE SET state = excluded.state,
             updated_at_ms = excluded.updated_at_ms",
    )
    .bind(topic_id as i64)
    .bind(subscription)
    .bind(state)
    .bind(now_ms)
    .execute(&mut *c)
    .await;
    match result {
        Ok(_) => Ok(()),
        Err(sqlx::Error::Database(e)) if e.is_foreign_key_violation() => {
            Err(MetadataError::TopicNotFound(topic_id))
        }
        Err(e) => Err(backend("save cursor")(e)),
    }
}

/// Deletes a subscription's cursor.
pub(super) async fn delete_cursor(
    c: &mut SqliteConnection,
    topic_id: TopicId,
    subscription: &str,
    writer_epoch: Option<u64>,
) -> Result<(), MetadataError> {
    match not_fenced_above(c, topic_id, writer_epoch).await {
        // No topic, no cursor: nothing to delete.
        Ok(()) | Err(MetadataError::TopicNotFound(_)) => {}
        Err(e) => return Err(e),
    }
    sqlx::query("DELETE FROM ll_cursors WHERE topic_id = ? AND subscription = ?")
        .bind(topic_id as i64)
        .bind(subscription)
        .execute(&mut *c)
        .await
        .map_err(backend("delete cursor"))?;
    Ok(())
}

/// Creates or updates a partitioned topic's partition count.
pub(super) async fn set_partitions(
    c: &mut SqliteConnection,
    name: &str,
    partitions: u32,
    update: bool,
) -> Result<(), MetadataError> {
    let existing: Option<i64> =
        sqlx::query("SELECT partitions FROM ll_partitioned_topics WHERE name = ?")
            .bind(name)
            .fetch_optional(&mut *c)
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
    .execute(&mut *c)
    .await
    .map_err(backend("set partitions"))?;
    Ok(())
}

/// Adds schema version `version` of `topic`: it must be the next one.
pub(super) async fn add_schema(
    c: &mut SqliteConnection,
    topic: &str,
    version: u64,
    schema: &[u8],
) -> Result<(), MetadataError> {
    let next: i64 = sqlx::query("SELECT COUNT(*) FROM ll_schemas WHERE topic = ?")
        .bind(topic)
        .fetch_one(&mut *c)
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
        .execute(&mut *c)
        .await
        .map_err(backend("add schema"))?;
    Ok(())
}

/// Sets (or with `None` removes) the policies of `scope`.
pub(super) async fn set_policies(
    c: &mut SqliteConnection,
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
    q.execute(&mut *c).await.map_err(backend("set policies"))?;
    Ok(())
}

/// Creates the policies of `scope` unless they exist; whether it did.
pub(super) async fn create_policies(
    c: &mut SqliteConnection,
    scope: &str,
    policies: &[u8],
) -> Result<bool, MetadataError> {
    let done = sqlx::query(
        "INSERT INTO ll_policies(scope, policies) VALUES (?, ?) ON CONFLICT(scope) DO NOTHING",
    )
    .bind(scope)
    .bind(policies)
    .execute(&mut *c)
    .await
    .map_err(backend("create policies"))?;
    Ok(done.rows_affected() == 1)
}

/// Replaces the policies of `scope` with `new` (`None`: removes them) only if they are
/// `expect` (`None`: absent); whether it did.
pub(super) async fn replace_policies(
    c: &mut SqliteConnection,
    scope: &str,
    expect: Option<&[u8]>,
    new: Option<&[u8]>,
) -> Result<bool, MetadataError> {
    let q = match (expect, new) {
        (None, Some(p)) => return create_policies(c, scope, p).await,
        (None, None) => {
            let found: Option<(i64,)> = sqlx::query_as("SELECT 1 FROM ll_policies WHERE scope = ?")
                .bind(scope)
                .fetch_optional(&mut *c)
                .await
                .map_err(backend("replace policies"))?;
            return Ok(found.is_none());
        }
        (Some(old), Some(p)) => {
            sqlx::query("UPDATE ll_policies SET policies = ? WHERE scope = ? AND policies = ?")
                .bind(p)
                .bind(scope)
                .bind(old)
        }
        (Some(old), None) => {
            sqlx::query("DELETE FROM ll_policies WHERE scope = ? AND policies = ?")
                .bind(scope)
                .bind(old)
        }
    };
    let done = q
        .execute(&mut *c)
        .await
        .map_err(backend("replace policies"))?;
    Ok(done.rows_affected() == 1)
}
