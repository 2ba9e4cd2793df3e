//! The SQLite store's one writer, with group commit.
//!
//! Every write operation is queued to one task that owns the write connection. The task takes
//! all the operations that queued while the previous transaction committed and runs them in one
//! transaction, each under its own savepoint, so one WAL sync makes the whole batch durable.
//! Ten thousand partitions each creating their first ledger, or as many subscriptions saving
//! their cursors, cost a few dozen syncs instead of one each.
//!
//! Invariants:
//! - an operation's `Ok` answer leaves only after the COMMIT that holds it returned (with
//!   `synchronous=FULL`, durable);
//! - an operation that fails rolls back to its own savepoint: its partial writes are undone and
//!   the others in the batch commit; a failed COMMIT fails every operation of the batch;
//! - operations run in the order they were queued, so a later write sees an earlier one.
//!
//! Reads do not come here: in WAL mode they run on other connections, beside the writer, and see
//! every write whose answer was returned.

use futures::future::BoxFuture;
use sqlx::{Connection, SqliteConnection};
use tokio::sync::{mpsc, oneshot};

use super::super::MetadataError;

/// Operations one transaction takes at most.
const MAX_BATCH: usize = 512;

/// Operations queued at most before writers wait.
const QUEUE: usize = 4096;

/// One queued write: runs inside the batch's transaction, answered after the commit.
trait WriteJob: Send {
    /// Runs the operation; `true` if it failed (it is then rolled back to its savepoint).
    fn apply<'c>(&'c mut self, conn: &'c mut SqliteConnection) -> BoxFuture<'c, bool>;
    /// Answers the caller: `commit` is how the batch's transaction ended.
    fn answer(self: Box<Self>, commit: Result<(), &str>);
}

/// A write operation with its result, kept until the batch commits.
struct Op<T, F> {
    /// Invariant: `Some` until applied.
    run: Option<F>,
    result: Option<Result<T, MetadataError>>,
    reply: oneshot::Sender<Result<T, MetadataError>>,
}

impl<T, F> WriteJob for Op<T, F>
where
    T: Send + 'static,
    F: for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, Result<T, MetadataError>>
        + Send
        + 'static,
{
    fn apply<'c>(&'c mut self, conn: &'c mut SqliteConnection) -> BoxFuture<'c, bool> {
        Box::pin(async move {
            let Some(run) = self.run.take() else {
                return false;
            };
            let result = run(conn).await;
            let failed = result.is_err();
            self.result = Some(result);
            failed
        })
    }

    fn answer(self: Box<Self>, commit: Result<(), &str>) {
        let answer = match (self.result, commit) {
            // Its own failure stands whatever became of the batch (it was rolled back).
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(value)), Ok(())) => Ok(value),
            (Some(Ok(_)) | None, Err(why)) => Err(batch_failed(why)),
            (None, Ok(())) => Err(batch_failed("the operation was not run")),
        };
        let _ = self.reply.send(answer);
    }
}

fn batch_failed(why: &str) -> MetadataError {
    MetadataError::Backend {
        op: "commit a batch of writes",
        source: why.into(),
    }
}

enum Queued {
    Job(Box<dyn WriteJob>),
    /// Finish what is queued before, close the connection, then answer.
    Close(oneshot::Sender<()>),
}

/// The handle writes go through. Clones share the one writer task.
#[derive(Debug, Clone)]
pub(super) struct Writer {
    queue: mpsc::Sender<Queued>,
}

impl std::fmt::Debug for Queued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Queued::Job(_) => "Job",
            Queued::Close(_) => "Close",
        })
    }
}

impl Writer {
    /// Starts the writer task on `conn` (opened with the store's options).
    pub(super) fn spawn(conn: SqliteConnection) -> Self {
        let (queue, rx) = mpsc::channel(QUEUE);
        tokio::spawn(serve(conn, rx));
        Self { queue }
    }

    /// Runs `op` in the next batch and returns its result once the batch committed.
    pub(super) async fn run<T, F>(&self, op: F) -> Result<T, MetadataError>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, Result<T, MetadataError>>
            + Send
            + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job = Op {
            run: Some(op),
            result: None,
            reply,
        };
        self.queue
            .send(Queued::Job(Box::new(job)))
            .await
            .map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }

    /// Lets the writes queued so far finish, then closes the write connection.
    pub(super) async fn close(&self) {
        let (done, closed) = oneshot::channel();
        if self.queue.send(Queued::Close(done)).await.is_ok() {
            let _ = closed.await;
        }
    }
}

fn closed() -> MetadataError {
    MetadataError::Backend {
        op: "write",
        source: "the metadata store is closed".into(),
    }
}

async fn serve(mut conn: SqliteConnection, mut rx: mpsc::Receiver<Queued>) {
    let mut batch: Vec<Box<dyn WriteJob>> = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = rx.recv().await {
        let mut close = None;
        match first {
            Queued::Job(job) => batch.push(job),
            Queued::Close(done) => close = Some(done),
        }
        while close.is_none() && batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(Queued::Job(job)) => batch.push(job),
                Ok(Queued::Close(done)) => close = Some(done),
                Err(_) => break,
            }
        }
        if !batch.is_empty() {
            let outcome = commit_batch(&mut conn, &mut batch).await;
            let outcome = outcome.as_ref().map_err(String::as_str).copied();
            for job in batch.drain(..) {
                job.answer(outcome);
            }
        }
        if let Some(done) = close {
            rx.close();
            if let Err(e) = conn.close().await {
                tracing::warn!(error = %e, "closing the metadata store's write connection");
            }
            let _ = done.send(());
            // Jobs queued after the close are dropped: their callers see the store closed.
            return;
        }
    }
}

/// Runs `batch` in one transaction, each job under a savepoint. `Err`: why the transaction
/// did not commit (then none of it holds).
async fn commit_batch(
    conn: &mut SqliteConnection,
    batch: &mut [Box<dyn WriteJob>],
) -> Result<(), String> {
    let mut tx = conn.begin().await.map_err(|e| format!("begin: {e}"))?;
    for job in batch.iter_mut() {
        // sqlx turns a transaction begun inside a transaction into a savepoint.
        let mut savepoint = Connection::begin(&mut *tx)
            .await
            .map_err(|e| format!("savepoint: {e}"))?;
        let failed = job.apply(&mut savepoint).await;
        let ended = if failed {
            savepoint.rollback().await
        } else {
            savepoint.commit().await
        };
        ended.map_err(|e| format!("release a savepoint: {e}"))?;
    }
    tx.commit().await.map_err(|e| format!("commit: {e}"))
}

#[cfg(test)]
mod tests {
    use sqlx::sqlite::SqliteConnectOptions;
    use sqlx::Row;

    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    async fn insert(c: &mut SqliteConnection, v: i64) -> Result<(), MetadataError> {
        sqlx::query("INSERT INTO t(v) VALUES (?)")
            .bind(v)
            .execute(&mut *c)
            .await
            .map_err(|e| MetadataError::Corrupt(e.to_string()))?;
        Ok(())
    }

    #[tokio::test]
    async fn a_failed_operation_undoes_its_own_writes_only_and_all_answer_after_commit(
    ) -> TestResult {
        let dir = tempfile::tempdir()?;
        let opts = SqliteConnectOptions::new()
            .filename(dir.path().join("w.db"))
            .create_if_missing(true);
        let mut conn = SqliteConnection::connect_with(&opts).await?;
        sqlx::query("CREATE TABLE t (v BIGINT NOT NULL)")
            .execute(&mut conn)
            .await?;
        let writer = Writer::spawn(conn);
        // Queued in one poll: the writer takes them as one batch.
        let ok =
            |v: i64| writer.run(move |c| Box::pin(async move { insert(c, v).await.map(|()| v) }));
        let fails = writer.run(|c| {
            Box::pin(async move {
                insert(c, 100).await?;
                Err::<(), _>(MetadataError::Conflict("refused after writing".into()))
            })
        });
        let (a, refused, b) = tokio::join!(ok(1), fails, ok(2));
        assert_eq!((a?, b?), (1, 2));
        assert!(
            matches!(refused, Err(MetadataError::Conflict(_))),
            "{refused:?}"
        );
        // A reader on another connection sees what was answered, not what was undone.
        let mut reader = SqliteConnection::connect_with(&opts).await?;
        let rows = sqlx::query("SELECT v FROM t ORDER BY v")
            .fetch_all(&mut reader)
            .await?;
        let values: Vec<i64> = rows
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?;
        assert_eq!(values, vec![1, 2]);
        writer.close().await;
        let after = writer
            .run(|c| Box::pin(async move { insert(c, 3).await }))
            .await;
        assert!(after.is_err(), "a closed writer took a write");
        Ok(())
    }
}
