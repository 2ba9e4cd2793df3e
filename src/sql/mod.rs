//! SQL over topics: DataFusion over each topic's Iceberg table and the messages still only in
//! the local log, for the PostgreSQL protocol ([`postgres`]), HTTP `POST /sql` and
//! `ledgerlake sql`, which all go through [`SqlEngine`].
//!
//! - [`catalog`]: every topic is a table `<tenant>.<namespace>.<topic>` (DataFusion's
//!   catalog.schema.table); `<topic>@<snapshot id | RFC 3339 time>` is the lake table as of a
//!   snapshot, `<topic>$snapshots` lists the table's snapshots.
//! - [`table`]: one topic's table: the lake scan at the snapshot pinned when the query starts,
//!   unioned with the live tail ([`tail`]) of exactly the ledgers that snapshot does not hold.
//! - [`guard`]: read-only: only queries (and EXPLAIN, SHOW) run; DDL, DML, COPY and
//!   CREATE EXTERNAL TABLE are refused before planning; no statement reaches files or URLs.
//! - [`format`]: result batches as JSON rows, CSV or Arrow IPC (HTTP) and PostgreSQL values.
//!
//! Invariants:
//! - A query sees each message of a topic at most once and every message durable before the
//!   query started (the seam is taken per table when the query resolves it: lake snapshot
//!   first, then the log's end, see [`table`]).
//! - Queries run on the query runtime (`sql.threads` workers at `sql.thread_niceness`), at most
//!   `sql.max_concurrent_queries` at once, each with its own memory pool (`sql.memory_limit`)
//!   and deadline (`sql.query_timeout`); dropping a result stream cancels its query: its task
//!   is aborted and its [`interrupt`] token cancelled, which stops a join's filter loop that
//!   no abort reaches. Sessions, cancels and the deadline are served off that runtime (the
//!   session runtime, or the caller's), so a query storm cannot hold them up.
//! - Errors reach each surface through [`SqlError`] and are mapped to the wire in one place per
//!   surface (`pg_values::to_pg_error`, `admin::error`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::ParamValues;
use datafusion::datasource::object_store::ObjectStoreUrl;
use datafusion::error::DataFusionError;
use datafusion::execution::cache::cache_manager::{CacheManagerConfig, FileMetadataCache};
use datafusion::execution::cache::DefaultFilesMetadataCache;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::SessionStateBuilder;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::execute_stream;
use datafusion::prelude::{SessionConfig, SessionContext};
use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::auth::{Access, Action, Principal, Resource};
use crate::config::SqlConfig;
use crate::lake::LakeHandle;
use crate::ledger::Log;
use crate::replay::Replay;

pub mod catalog;
mod coop;
mod distinct;
pub mod format;
mod functions;
pub mod guard;
mod interrupt;
mod lake_scan;
mod metadata_tables;
mod pg_cancel;
mod pg_catalog;
mod pg_composite;
mod pg_relations;
mod pg_values;
pub mod postgres;
mod prune;
mod table;
mod table_cache;
mod tail;

/// Bytes of Parquet footers (and page indexes) kept across queries.
const FOOTER_CACHE_BYTES: usize = 64 * 1024 * 1024;

/// Why a statement did not run or did not finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqlError {
    /// The statement is not allowed (SQL is read-only).
    #[error("{0}")]
    Refused(String),
    /// The statement does not parse or does not plan (unknown table or column, bad types).
    #[error("{0}")]
    Invalid(String),
    /// The statement names a table that does not exist or that the principal may not read
    /// (the two are not told apart).
    #[error("{0}")]
    TableNotFound(String),
    /// The query failed while running.
    #[error("query failed: {0}")]
    Execution(String),
    /// The query needed more memory than `sql.memory_limit`.
    #[error("query exceeded the memory limit ({limit} per query, sql.memory_limit): {detail}")]
    MemoryLimit {
        /// The configured limit.
        limit: String,
        /// DataFusion's account of the allocation that failed.
        detail: String,
    },
    /// The query ran longer than `sql.query_timeout`.
    #[error("query cancelled after the timeout of {0:?} (sql.query_timeout)")]
    Timeout(Duration),
    /// Wrong or missing credentials.
    #[error("authentication failed: {0}")]
    Unauthenticated(String),
    /// The principal may not run queries.
    #[error(transparent)]
    Denied(#[from] crate::auth::Denied),
    /// The SQL runtime has stopped (the service is shutting down).
    #[error("the SQL engine is shutting down")]
    Stopped,
    /// The client cancelled the query (a PostgreSQL cancel request).
    #[error("canceling statement due to user request")]
    Cancelled,
}

impl SqlError {
    /// Sorts a DataFusion error into the kinds above.
    pub(crate) fn from_datafusion(e: DataFusionError, limit: &str) -> SqlError {
        match e.find_root() {
            DataFusionError::ResourcesExhausted(detail) => SqlError::MemoryLimit {
                limit: limit.to_string(),
                detail: detail.clone(),
            },
            DataFusionError::Plan(m) if m.starts_with("table '") && m.ends_with("' not found") => {
                SqlError::TableNotFound(format!("{m} or not authorized"))
            }
            DataFusionError::SQL(..)
            | DataFusionError::Plan(_)
            | DataFusionError::SchemaError(..)
            | DataFusionError::NotImplemented(_) => SqlError::Invalid(e.strip_backtrace()),
            DataFusionError::Configuration(msg) => SqlError::Refused(msg.clone()),
            // Arrow kernels DataFusion reaches for a type they do not handle (grouping or
            // sorting by a map): the query's form is not supported, the service is fine.
            DataFusionError::ArrowError(a, _)
                if matches!(a.as_ref(), arrow::error::ArrowError::NotYetImplemented(_)) =>
            {
                let detail = e.strip_backtrace();
                if detail.contains("Row format support not yet implemented") {
                    SqlError::Invalid(
                        "not supported: grouping, sorting or joining on a map value (GROUP BY, \
                         ORDER BY, DISTINCT or a join key of a map column such as properties); \
                         use one of its keys, e.g. properties['region']"
                            .into(),
                    )
                } else {
                    SqlError::Invalid(format!("not supported: {detail}"))
                }
            }
            _ => SqlError::Execution(e.strip_backtrace()),
        }
    }
}

/// What a statement is, once planned.
pub enum Prepared {
    /// A query returning rows (SELECT, EXPLAIN, SHOW ...).
    Query {
        /// The plan (with placeholders `$1`... still unbound).
        plan: Box<LogicalPlan>,
        /// The session it was planned in (holds the pinned seams of its tables).
        session: SessionContext,
    },
    /// A session statement accepted without effect (BEGIN, COMMIT, SET of a client setting):
    /// answered with this command tag.
    Command(String),
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Prepared::Query { plan, .. } => write!(f, "Query({})", plan.display()),
            Prepared::Command(tag) => write!(f, "Command({tag})"),
        }
    }
}

impl Prepared {
    /// Result schema (empty for commands).
    pub fn schema(&self) -> SchemaRef {
        match self {
            Prepared::Query { plan, .. } => Arc::new(plan.schema().as_arrow().clone()),
            Prepared::Command(_) => Arc::new(arrow::datatypes::Schema::empty()),
        }
    }
}

/// The SQL engine of a service: shared by every surface.
#[derive(Clone)]
pub struct SqlEngine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SqlEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlEngine")
            .field("config", &self.inner.config)
            .finish()
    }
}

struct Inner {
    log: Arc<Log>,
    /// `None` when the lake is disabled: tables are the local log only.
    lake: Option<LakeHandle>,
    /// Reads the tail by position (log, or lake for ranges deleted during a query).
    replay: Option<Replay>,
    /// The query runtime (execution: scans, the live tail, operators).
    runtime: tokio::runtime::Handle,
    /// The session runtime (PostgreSQL connections, planning, cancels), never busy with a
    /// query's work.
    sessions: tokio::runtime::Handle,
    config: SqlConfig,
    /// Invariant: one permit per running query.
    slots: Arc<Semaphore>,
    /// Parquet footers and page indexes of lake files, shared by every query (files are
    /// immutable, their paths unique, so an entry never goes stale).
    footers: Arc<dyn FileMetadataCache>,
    /// Lake table handles kept between queries (their manifests read once).
    tables: Arc<table_cache::TableCache>,
    /// Who may query (shared with the other surfaces).
    access: Access,
}

impl SqlEngine {
    /// An engine running its queries on `runtime` and its PostgreSQL sessions on `sessions`.
    pub fn new(
        log: Arc<Log>,
        lake: Option<LakeHandle>,
        replay: Option<Replay>,
        (runtime, sessions): (tokio::runtime::Handle, tokio::runtime::Handle),
        config: SqlConfig,
        access: Access,
    ) -> SqlEngine {
        SqlEngine {
            inner: Arc::new(Inner {
                log,
                lake,
                replay,
                runtime,
                sessions,
                slots: Arc::new(Semaphore::new(config.max_concurrent_queries)),
                footers: Arc::new(DefaultFilesMetadataCache::new(FOOTER_CACHE_BYTES)),
                tables: Arc::default(),
                config,
                access,
            }),
        }
    }

    /// The session runtime (the PostgreSQL listener serves its connections there).
    pub fn session_runtime(&self) -> &tokio::runtime::Handle {
        &self.inner.sessions
    }

    /// Whether clients must present a token.
    pub fn auth_required(&self) -> bool {
        self.inner.access.required()
    }

    /// Checks a token (the PostgreSQL password or the HTTP bearer token). With authentication
    /// off every caller is the anonymous principal.
    pub fn authenticate(&self, token: Option<&str>) -> Result<Principal, SqlError> {
        self.inner
            .access
            .authenticate_token(token)
            .map_err(|e| SqlError::Unauthenticated(e.to_string()))
    }

    fn limit_text(&self) -> String {
        self.inner.config.memory_limit.to_string()
    }

    /// A session whose catalogs are the topics in `scope` existing now that `principal` may
    /// read.
    async fn session(
        &self,
        principal: &Principal,
        scope: &catalog::Scope,
    ) -> Result<SessionContext, SqlError> {
        let limit = self.inner.config.memory_limit.as_u64() as usize;
        // No spilling: a query over its memory limit fails clearly, and no query writes files.
        let runtime_env = RuntimeEnvBuilder::new()
            .with_memory_limit(limit, 1.0)
            .with_disk_manager_builder(
                DiskManagerBuilder::default().with_mode(DiskManagerMode::Disabled),
            )
            .with_cache_manager(
                CacheManagerConfig::default()
                    .with_file_metadata_cache(Some(self.inner.footers.clone()))
                    .with_metadata_cache_limit(FOOTER_CACHE_BYTES),
            )
            .build_arc()
            .map_err(|e| SqlError::Execution(e.to_string()))?;
        if let Some(lake) = &self.inner.lake {
            let url = ObjectStoreUrl::parse(lake_scan::LAKE_STORE_URL)
                .map_err(|e| SqlError::Execution(e.to_string()))?;
            runtime_env.register_object_store(url.as_ref(), lake.lake().scan_store().clone());
        }
        let topics = catalog::TopicCatalogList::load(
            catalog::Shared {
                log: self.inner.log.clone(),
                lake: self.inner.lake.clone(),
                replay: self.inner.replay.clone(),
                tables: self.inner.tables.clone(),
            },
            &self.inner.access,
            principal,
            (pg_catalog::SCHEMA, pg_catalog::schema),
            scope,
        )
        .await?;
        let config = SessionConfig::new()
            .with_information_schema(true)
            .with_create_default_catalog_and_schema(false)
            .with_default_catalog_and_schema("public", "default")
            .with_target_partitions(self.inner.config.threads.max(1))
            // DataFusion 53's extraction of struct field accesses into projections loses them
            // under decorrelated subqueries (NULL counts where rows match) and breaks sort
            // requirements above unions (SanityCheckPlan): off, found by the DuckDB
            // differential tests.
            .set_bool(
                "datafusion.optimizer.enable_leaf_expression_pushdown",
                false,
            );
        let state = SessionStateBuilder::new()
            .with_config(config)
            .with_runtime_env(runtime_env)
            .with_default_features()
            .with_catalog_list(Arc::new(topics))
            .with_optimizer_rules(optimizer_rules())
            .with_physical_optimizer_rules(physical_optimizer_rules())
            .build();
        let mut ctx = SessionContext::new_with_state(state);
        datafusion_functions_json::register_all(&mut ctx)
            .map_err(|e| SqlError::Execution(e.to_string()))?;
        pg_catalog::register_functions(&ctx).map_err(|e| SqlError::Execution(e.to_string()))?;
        functions::register(&mut ctx).map_err(|e| SqlError::Execution(e.to_string()))?;
        Ok(ctx)
    }

    /// Parses `sql` (one or more statements), refuses what is not read-only and plans each
    /// statement, for `principal` (the authorizer is asked first). Tables are resolved, and
    /// their seams pinned, here.
    pub async fn prepare(
        &self,
        principal: &Principal,
        sql: &str,
    ) -> Result<Vec<Prepared>, SqlError> {
        self.inner
            .access
            .authorize(principal, Action::Query, &Resource::Cluster)
            .await?;
        let engine = self.clone();
        let (sql, principal) = (sql.to_string(), principal.clone());
        let started = std::time::Instant::now();
        let prepared = self
            .inner
            .runtime
            .spawn(async move { engine.prepare_here(&sql, &principal).await })
            .await
            .map_err(|_| SqlError::Stopped)?;
        if prepared.is_err() {
            // A statement that does not plan is a query that failed.
            crate::metrics::node().sql_query("error", started.elapsed());
        }
        prepared
    }

    async fn prepare_here(
        &self,
        sql: &str,
        principal: &Principal,
    ) -> Result<Vec<Prepared>, SqlError> {
        let statements = guard::parse(sql)?;
        // One session for all the statements, listing the tables any of them names.
        let scope = catalog::Scope::of(&statements, pg_catalog::SCHEMA);
        let mut out = Vec::with_capacity(statements.len());
        let mut session: Option<SessionContext> = None;
        for statement in statements {
            match guard::classify(&statement)? {
                guard::Class::NoOp(tag) => out.push(Prepared::Command(tag)),
                guard::Class::Query => {
                    let ctx = match &session {
                        Some(s) => s.clone(),
                        None => {
                            let s = self.session(principal, &scope).await?;
                            session = Some(s.clone());
                            s
                        }
                    };
                    let plan = ctx
                        .state()
                        .statement_to_plan(statement)
                        .await
                        .map_err(|e| SqlError::from_datafusion(e, &self.limit_text()))?;
                    guard::verify(&plan)?;
                    out.push(Prepared::Query {
                        plan: Box::new(plan),
                        session: ctx,
                    });
                }
            }
        }
        Ok(out)
    }

    /// Runs a planned query with `params` bound to its placeholders; the rows arrive on the
    /// returned stream. Dropping the stream cancels the query.
    pub async fn execute(
        &self,
        plan: LogicalPlan,
        session: SessionContext,
        params: Option<ParamValues>,
    ) -> Result<QueryStream, SqlError> {
        let permit = self
            .inner
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| SqlError::Stopped)?;
        let limit = self.limit_text();
        let timeout = self.inner.config.query_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let plan = match params {
            Some(p) => plan
                .with_param_values(p)
                .map_err(|e| SqlError::from_datafusion(e, &limit))?,
            None => plan,
        };
        let schema: SchemaRef = Arc::new(plan.schema().as_arrow().clone());
        let (tx, rx) = mpsc::channel::<Result<RecordBatch, SqlError>>(2);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<Result<(), SqlError>>();
        let started = std::time::Instant::now();
        let stop = tokio_util::sync::CancellationToken::new();
        let armed = stop.clone();
        let task = self.inner.runtime.spawn(async move {
            let _permit = permit;
            // Cancelled when the task ends, however it ends (its own deadline check, an error).
            let _stop = armed.clone().drop_guard();
            let mut outcome = QueryOutcome::start(started);
            let run = async {
                let df = session
                    .execute_logical_plan(plan)
                    .await
                    .map_err(|e| SqlError::from_datafusion(e, &limit))?;
                let ctx = Arc::new(df.task_ctx());
                let physical = df
                    .create_physical_plan()
                    .await
                    .and_then(|p| interrupt::arm(p, &armed))
                    .map_err(|e| SqlError::from_datafusion(e, &limit))?;
                execute_stream(physical, ctx).map_err(|e| SqlError::from_datafusion(e, &limit))
            };
            let mut stream = match tokio::time::timeout_at(deadline, run).await {
                Ok(Ok(s)) => {
                    let _ = ready_tx.send(Ok(()));
                    s
                }
                Ok(Err(e)) => {
                    outcome.outcome = "error";
                    let _ = ready_tx.send(Err(e));
                    return;
                }
                Err(_) => {
                    outcome.outcome = "timeout";
                    let _ = ready_tx.send(Err(SqlError::Timeout(timeout)));
                    return;
                }
            };
            loop {
                let next = match tokio::time::timeout_at(deadline, stream.next()).await {
                    Ok(Some(Ok(batch))) => Ok(batch),
                    Ok(Some(Err(e))) => {
                        outcome.outcome = "error";
                        Err(SqlError::from_datafusion(e, &limit))
                    }
                    Ok(None) => {
                        outcome.outcome = "ok";
                        return;
                    }
                    Err(_) => {
                        outcome.outcome = "timeout";
                        Err(SqlError::Timeout(timeout))
                    }
                };
                let failed = next.is_err();
                if tx.send(next).await.is_err() || failed {
                    return;
                }
            }
        });
        let abort = Some(AbortOnDrop {
            task,
            _stop: stop.drop_guard(),
        });
        // The deadline is also kept here, on the caller's runtime: the task's own checks run
        // only when its busy runtime polls it, these at once (dropping the task aborts it).
        match tokio::time::timeout_at(deadline, ready_rx).await {
            Ok(ready) => ready.map_err(|_| SqlError::Stopped)??,
            Err(_) => return Err(SqlError::Timeout(timeout)),
        }
        Ok(QueryStream {
            schema,
            rx,
            _task: abort,
            deadline: Some(Box::pin(tokio::time::sleep_until(deadline))),
            timeout,
        })
    }

    /// Prepares and runs `sql`, which must be exactly one statement; a command gives an empty
    /// stream. For the HTTP surface and the CLI.
    pub async fn query(&self, principal: &Principal, sql: &str) -> Result<QueryStream, SqlError> {
        let mut prepared = self.prepare(principal, sql).await?;
        if prepared.len() != 1 {
            return Err(SqlError::Invalid(format!(
                "expected exactly one statement, got {}",
                prepared.len()
            )));
        }
        match prepared.remove(0) {
            Prepared::Query { plan, session } => self.execute(*plan, session, None).await,
            Prepared::Command(_) => Ok(QueryStream::empty()),
        }
    }
}

/// DataFusion's optimizer rules, ours first: nested distinct counts are keyed before DataFusion
/// turns a lone one into a GROUP BY of the nested value.
fn optimizer_rules() -> Vec<Arc<dyn datafusion::optimizer::OptimizerRule + Send + Sync>> {
    let mut rules: Vec<Arc<dyn datafusion::optimizer::OptimizerRule + Send + Sync>> =
        vec![Arc::new(distinct::DistinctNestedKeys)];
    rules.extend(datafusion::optimizer::Optimizer::new().rules);
    rules
}

/// DataFusion's physical optimizer rules, then ours: joins yield (see [`coop`]).
fn physical_optimizer_rules(
) -> Vec<Arc<dyn datafusion::physical_optimizer::PhysicalOptimizerRule + Send + Sync>> {
    let mut rules = datafusion::physical_optimizer::optimizer::PhysicalOptimizer::new().rules;
    rules.push(Arc::new(coop::YieldAboveJoins));
    rules
}

/// A running query in the SQL metrics: counted as running from [`QueryOutcome::start`], its
/// outcome and duration recorded when dropped (a query whose task was aborted, because its
/// client cancelled it or went away, counts as `cancelled`).
struct QueryOutcome {
    started: std::time::Instant,
    outcome: &'static str,
}

impl QueryOutcome {
    fn start(started: std::time::Instant) -> QueryOutcome {
        crate::metrics::node().sql_queries_running.inc();
        QueryOutcome {
            started,
            outcome: "cancelled",
        }
    }
}

impl Drop for QueryOutcome {
    fn drop(&mut self) {
        let metrics = crate::metrics::node();
        metrics.sql_queries_running.dec();
        metrics.sql_query(self.outcome, self.started.elapsed());
    }
}

/// Ends a query when dropped: aborts its task and cancels its [`interrupt`] token, which stops
/// work the abort cannot reach (a poll in progress in a task DataFusion spawned).
struct AbortOnDrop {
    task: tokio::task::JoinHandle<()>,
    _stop: tokio_util::sync::DropGuard,
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The rows of a running query, in order. Dropping it cancels the query.
pub struct QueryStream {
    schema: SchemaRef,
    rx: mpsc::Receiver<Result<RecordBatch, SqlError>>,
    /// The producing task (`None` for a command's empty result, or once the deadline passed).
    _task: Option<AbortOnDrop>,
    /// Invariant: `Some` until the deadline has been reported (then the stream has ended).
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    timeout: Duration,
}

impl std::fmt::Debug for QueryStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryStream")
            .field("schema", &self.schema)
            .finish()
    }
}

impl QueryStream {
    /// The schema of every batch.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// These rows until `cancel` fires, then one [`SqlError::Cancelled`] and the end; the
    /// query stops there (this stream is dropped, which aborts it).
    pub fn until_cancelled(
        self,
        cancel: CancellationToken,
    ) -> impl Stream<Item = Result<RecordBatch, SqlError>> + Send {
        futures::stream::unfold(Some(self), move |rows| {
            let cancel = cancel.clone();
            async move {
                let mut rows = rows?;
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => Some((Err(SqlError::Cancelled), None)),
                    batch = rows.next() => batch.map(|b| (b, Some(rows))),
                }
            }
        })
    }

    fn empty() -> QueryStream {
        let (_tx, rx) = mpsc::channel(1);
        QueryStream {
            schema: Arc::new(arrow::datatypes::Schema::empty()),
            rx,
            _task: None,
            deadline: None,
            timeout: Duration::ZERO,
        }
    }
}

impl Stream for QueryStream {
    type Item = Result<RecordBatch, SqlError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Poll::Ready(item) = this.rx.poll_recv(cx) {
            return Poll::Ready(item);
        }
        match this.deadline.as_mut().map(|d| d.as_mut().poll(cx)) {
            Some(Poll::Ready(())) => {
                // Past the deadline with the query still working: stop it, end with the error.
                this.deadline = None;
                this._task = None;
                this.rx.close();
                Poll::Ready(Some(Err(SqlError::Timeout(this.timeout))))
            }
            _ => Poll::Pending,
        }
    }
}
