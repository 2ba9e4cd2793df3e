//! The PostgreSQL wire protocol (pgwire): psql, psycopg, JDBC and other PostgreSQL clients
//! query topics through the same [`SqlEngine`] as HTTP and the CLI.
//!
//! - Simple query: a string of one or more statements, each answered in order.
//! - Extended query: Parse plans the statement once to describe its parameters and columns;
//!   each Execute plans it again (a fresh seam per execution) and binds `$1`, `$2`, ...
//! - Authentication: off → any user and database name is accepted without a password; on →
//!   the client's password is the token (cleartext password exchange; use TLS in front).
//! - Values ([`super::pg_values`]): integers, floats, booleans, text, bytea, date, timestamp
//!   and timestamptz map to their PostgreSQL types; maps, structs and lists are `json`;
//!   anything else is `text`.
//! - Cancelling: a cancel request stops the session's running query, and so does the client
//!   closing its connection ([`super::pg_cancel`]); each connection has its own handlers,
//!   holding its session.
//!
//! Errors map to SQLSTATE codes in [`to_pg_error`] (in `pg_values`) and only there.

use std::fmt::Debug;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::common::{ParamValues, ScalarValue};
use futures::{stream, Sink, StreamExt};
use pgwire::api::auth::cleartext::CleartextPasswordAuthStartupHandler;
use pgwire::api::auth::noop::NoopStartupHandler;
use pgwire::api::auth::{
    AuthSource, DefaultServerParameterProvider, LoginInfo, Password, StartupHandler,
};
use pgwire::api::cancel::CancelHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{FieldInfo, QueryResponse, Response, Tag};
use pgwire::api::stmt::QueryParser;
use pgwire::api::{
    ClientInfo, ClientPortalStore, PgWireConnectionState, PgWireServerHandlers, Type,
};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::pg_cancel::{self, Cancels, Session};
use super::pg_values::{encoded, field_infos, pg_type};
use super::{Prepared, SqlEngine, SqlError};
use crate::auth::Principal;
use pgwire::messages::startup::PasswordMessageFamily;

pub use super::pg_values::to_pg_error;

/// Serves PostgreSQL clients on `listener` until `stop`; connections run on the session runtime.
/// With `tls`, a client's `SSLRequest` is accepted (psql `sslmode=require` and stronger);
/// without, it is declined and the client may go on in plain text.
pub async fn serve(
    engine: SqlEngine,
    listener: TcpListener,
    stop: CancellationToken,
    tls: Option<pgwire::tokio::TlsAcceptor>,
) {
    let shared = Arc::new(Shared::new(engine.clone()));
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((socket, peer)) => {
                let shared = shared.clone();
                let (stop, tls) = (stop.clone(), tls.clone());
                engine.session_runtime().spawn(async move {
                    let (socket, watch) = match pg_cancel::with_watch(socket) {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::debug!(%peer, error = %e, "postgres connection dropped");
                            return;
                        }
                    };
                    let session = Session::new(shared.cancels.clone());
                    let handlers = shared.connection(session.clone());
                    let departed = async {
                        pg_cancel::peer_closed(watch).await;
                        session.client_gone();
                        std::future::pending::<()>().await
                    };
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = departed => {}
                        r = pgwire::tokio::process_socket(socket, tls, handlers) => {
                            if let Err(e) = r {
                                tracing::debug!(%peer, error = %e, "postgres connection ended");
                            }
                        }
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "postgres accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// What every connection's handlers share.
struct Shared {
    engine: SqlEngine,
    parser: Arc<Parser>,
    startup: Arc<Startup>,
    cancels: Arc<Cancels>,
}

impl Shared {
    fn new(engine: SqlEngine) -> Shared {
        let params = server_parameters();
        let startup = if engine.auth_required() {
            Startup::Token(
                Box::new(CleartextPasswordAuthStartupHandler::new(
                    TokenSource {
                        engine: engine.clone(),
                    },
                    params,
                )),
                engine.clone(),
            )
        } else {
            Startup::Open(OpenStartup)
        };
        Shared {
            parser: Arc::new(Parser {
                engine: engine.clone(),
            }),
            engine,
            startup: Arc::new(startup),
            cancels: Arc::new(Cancels::default()),
        }
    }

    /// The handlers of one connection, whose queries `session` cancels.
    fn connection(&self, session: Arc<Session>) -> Handlers {
        Handlers {
            backend: Arc::new(Backend {
                engine: self.engine.clone(),
                parser: self.parser.clone(),
                session: session.clone(),
            }),
            startup: Arc::new(SessionStartup {
                inner: self.startup.clone(),
                session,
            }),
            cancels: self.cancels.clone(),
        }
    }
}

/// One connection's handlers.
struct Handlers {
    backend: Arc<Backend>,
    startup: Arc<SessionStartup>,
    cancels: Arc<Cancels>,
}

fn server_parameters() -> DefaultServerParameterProvider {
    let mut p = DefaultServerParameterProvider::default();
    p.server_version = format!("16.0 (ledgerlake {})", env!("CARGO_PKG_VERSION"));
    p.time_zone = "UTC".into();
    p.default_transaction_read_only = true;
    p
}

impl PgWireServerHandlers for Handlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        self.backend.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        self.backend.clone()
    }

    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        self.startup.clone()
    }

    fn cancel_handler(&self) -> Arc<impl CancelHandler> {
        self.cancels.clone()
    }
}

/// A connection's startup: the shared one, after which the session is registered for cancel
/// requests under the process id and secret key the client was given.
struct SessionStartup {
    inner: Arc<Startup>,
    session: Arc<Session>,
}

#[async_trait]
impl StartupHandler for SessionStartup {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        self.inner.on_startup(client, message).await?;
        if matches!(client.state(), PgWireConnectionState::ReadyForQuery) {
            let (pid, secret) = client.pid_and_secret_key();
            self.session.register(pid, &secret);
        }
        Ok(())
    }
}

/// Client metadata key of the role a session authenticated as.
const METADATA_ROLE: &str = "ledgerlake.role";

/// The principal of a session: the role its token authenticated as (anonymous when
/// authentication is off).
fn session_principal<C: ClientInfo + ?Sized>(client: &C) -> Principal {
    match client.metadata().get(METADATA_ROLE) {
        Some(role) => Principal::role(role),
        None => Principal::anonymous(),
    }
}

/// No authentication (any user, any database).
struct OpenStartup;

impl NoopStartupHandler for OpenStartup {}

/// Passwords are tokens.
#[derive(Debug)]
struct TokenSource {
    engine: SqlEngine,
}

#[async_trait]
impl AuthSource for TokenSource {
    async fn get_password(&self, _login: &LoginInfo) -> PgWireResult<Password> {
        // Tokens are verified, never recovered.
        Err(PgWireError::UserError(Box::new(ErrorInfo::new(
            "FATAL".into(),
            "28P01".into(),
            "password authentication failed".into(),
        ))))
    }

    async fn verify_password(
        &self,
        login: &LoginInfo,
        presented: &[u8],
    ) -> PgWireResult<Option<()>> {
        let token = std::str::from_utf8(presented)
            .map_err(|_| PgWireError::InvalidPassword(login.user().unwrap_or_default().into()))?;
        // Clients send the password NUL-terminated.
        let token = token.trim_end_matches('\0');
        match self.engine.authenticate(Some(token)) {
            Ok(_) => Ok(None),
            Err(_) => Err(PgWireError::InvalidPassword(
                login.user().unwrap_or_default().into(),
            )),
        }
    }
}

enum Startup {
    Open(OpenStartup),
    Token(
        Box<CleartextPasswordAuthStartupHandler<TokenSource, DefaultServerParameterProvider>>,
        SqlEngine,
    ),
}

#[async_trait]
impl StartupHandler for Startup {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        match self {
            Startup::Open(h) => {
                // The role is never the client's to claim (startup parameters land in the
                // same metadata).
                let result = h.on_startup(client, message).await;
                client.metadata_mut().remove(METADATA_ROLE);
                result
            }
            Startup::Token(h, engine) => {
                // The password is a token: keep the role it authenticates as with the session.
                let (message, token) = match message {
                    PgWireFrontendMessage::PasswordMessageFamily(p) => {
                        let password = p.into_password()?;
                        let token = password.password.trim_end_matches('\0').to_string();
                        (
                            PgWireFrontendMessage::PasswordMessageFamily(
                                PasswordMessageFamily::Password(password),
                            ),
                            Some(token),
                        )
                    }
                    other => (other, None),
                };
                let result = h.on_startup(client, message).await;
                client.metadata_mut().remove(METADATA_ROLE);
                result?;
                if let Some(token) = token {
                    if let Ok(p) = engine.authenticate(Some(&token)) {
                        client.metadata_mut().insert(METADATA_ROLE.into(), p.role);
                    }
                }
                Ok(())
            }
        }
    }
}

/// A statement of the extended protocol: its text and what Parse found out about it.
#[derive(Debug, Clone)]
pub struct PgStatement {
    sql: String,
    /// Result columns (empty for commands).
    schema: SchemaRef,
    /// Parameter types `$1..$n` (as far as the plan tells).
    params: Vec<Type>,
}

struct Parser {
    engine: SqlEngine,
}

#[async_trait]
impl QueryParser for Parser {
    type Statement = PgStatement;

    async fn parse_sql<C>(
        &self,
        client: &C,
        sql: &str,
        types: &[Option<Type>],
    ) -> PgWireResult<Option<PgStatement>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let principal = session_principal(client);
        let mut prepared = self
            .engine
            .prepare(&principal, sql)
            .await
            .map_err(to_pg_error)?;
        if prepared.is_empty() {
            // Only comments or `;` (a driver's ping): answered with EmptyQueryResponse.
            return Ok(Some(PgStatement {
                sql: sql.to_string(),
                schema: Arc::new(arrow::datatypes::Schema::empty()),
                params: Vec::new(),
            }));
        }
        if prepared.len() != 1 {
            return Err(to_pg_error(SqlError::Invalid(
                "cannot insert multiple commands into a prepared statement".into(),
            )));
        }
        let p = prepared.remove(0);
        let mut params = Vec::new();
        if let Prepared::Query { plan, .. } = &p {
            let found = plan
                .get_parameter_types()
                .map_err(|e| to_pg_error(SqlError::Invalid(e.to_string())))?;
            for i in 0..found.len() {
                let declared = types.get(i).cloned().flatten();
                let inferred = found
                    .get(&format!("${}", i + 1))
                    .cloned()
                    .flatten()
                    .map(|t| pg_type(&t));
                params.push(declared.or(inferred).unwrap_or(Type::TEXT));
            }
        }
        Ok(Some(PgStatement {
            sql: sql.to_string(),
            schema: p.schema(),
            params,
        }))
    }

    fn get_parameter_types(&self, stmt: &PgStatement) -> PgWireResult<Vec<Type>> {
        Ok(stmt.params.clone())
    }

    fn get_result_schema(
        &self,
        stmt: &PgStatement,
        format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        Ok(field_infos(&stmt.schema, format))
    }
}

/// One connection's query handler.
struct Backend {
    engine: SqlEngine,
    parser: Arc<Parser>,
    session: Arc<Session>,
}

impl Backend {
    async fn respond(
        &self,
        prepared: Prepared,
        params: Option<ParamValues>,
        format: Option<&Format>,
        cancel: &CancellationToken,
    ) -> PgWireResult<Response> {
        match prepared {
            Prepared::Command(tag) => Ok(Response::Execution(Tag::new(&tag))),
            Prepared::Query { plan, session } => {
                let rows = tokio::select! {
                    biased;
                    _ = cancel.cancelled() => Err(SqlError::Cancelled),
                    rows = self.engine.execute(*plan, session, params) => rows,
                }
                .map_err(to_pg_error)?;
                let fields = Arc::new(field_infos(&rows.schema(), format));
                let rows = rows.until_cancelled(cancel.clone());
                Ok(Response::Query(QueryResponse::new(
                    fields.clone(),
                    encoded(rows, fields),
                )))
            }
        }
    }

    /// As [`Backend::respond`], but the query starts when its rows are first asked for: the
    /// later statements of a simple query, so that each takes a query slot only once the ones
    /// before it have been answered (all started at once, eight statements would hold every
    /// slot while only the first can send its rows).
    fn respond_later(&self, prepared: Prepared, cancel: &CancellationToken) -> Response {
        match prepared {
            Prepared::Command(tag) => Response::Execution(Tag::new(&tag)),
            Prepared::Query { plan, session } => {
                let schema: SchemaRef = Arc::new(plan.schema().as_arrow().clone());
                let fields = Arc::new(field_infos(&schema, None));
                let (engine, cancel) = (self.engine.clone(), cancel.clone());
                let rows = stream::once(async move {
                    let started = tokio::select! {
                        biased;
                        _ = cancel.cancelled() => Err(SqlError::Cancelled),
                        rows = engine.execute(*plan, session, None) => rows,
                    };
                    match started {
                        Ok(rows) => rows.until_cancelled(cancel).left_stream(),
                        Err(e) => stream::iter([Err(e)]).right_stream(),
                    }
                })
                .flatten();
                Response::Query(QueryResponse::new(fields.clone(), encoded(rows, fields)))
            }
        }
    }

    /// Prepares `sql` for the session's principal, unless `cancel` fires first.
    async fn prepare<C: ClientInfo + ?Sized>(
        &self,
        client: &C,
        sql: &str,
        cancel: &CancellationToken,
    ) -> PgWireResult<Vec<Prepared>> {
        let principal = session_principal(client);
        tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(SqlError::Cancelled),
            prepared = self.engine.prepare(&principal, sql) => prepared,
        }
        .map_err(to_pg_error)
    }
}

#[async_trait]
impl SimpleQueryHandler for Backend {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: pgwire::api::store::PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let cancel = self.session.start_query();
        let prepared = self.prepare(client, query, &cancel).await?;
        if prepared.is_empty() {
            // Only comments (`-- ping`): PostgreSQL answers EmptyQueryResponse.
            return Ok(vec![Response::EmptyQuery]);
        }
        let mut out = Vec::with_capacity(prepared.len());
        for (i, p) in prepared.into_iter().enumerate() {
            out.push(if i == 0 {
                self.respond(p, None, None, &cancel).await?
            } else {
                self.respond_later(p, &cancel)
            });
        }
        Ok(out)
    }
}

#[async_trait]
impl ExtendedQueryHandler for Backend {
    type Statement = PgStatement;
    type QueryParser = Parser;

    fn query_parser(&self) -> Arc<Parser> {
        self.parser.clone()
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<PgStatement>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: pgwire::api::store::PortalStore<Statement = PgStatement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let stmt = &portal.statement.statement;
        let cancel = self.session.start_query();
        let mut prepared = self.prepare(client, &stmt.sql, &cancel).await?;
        if prepared.is_empty() {
            return Ok(Response::EmptyQuery);
        }
        if prepared.len() != 1 {
            return Err(to_pg_error(SqlError::Invalid(
                "a prepared statement holds exactly one command".into(),
            )));
        }
        let params = if stmt.params.is_empty() {
            None
        } else {
            Some(bind_parameters(portal, &stmt.params)?)
        };
        self.respond(
            prepared.remove(0),
            params,
            Some(&portal.result_column_format),
            &cancel,
        )
        .await
    }
}

fn bind_parameters(portal: &Portal<PgStatement>, types: &[Type]) -> PgWireResult<ParamValues> {
    let mut values = Vec::with_capacity(types.len());
    for (i, ty) in types.iter().enumerate() {
        let v = match *ty {
            Type::BOOL => ScalarValue::Boolean(portal.parameter::<bool>(i, ty)?),
            Type::INT2 => ScalarValue::Int16(portal.parameter::<i16>(i, ty)?),
            Type::INT4 => ScalarValue::Int32(portal.parameter::<i32>(i, ty)?),
            Type::INT8 => ScalarValue::Int64(portal.parameter::<i64>(i, ty)?),
            Type::FLOAT4 => ScalarValue::Float32(portal.parameter::<f32>(i, ty)?),
            Type::FLOAT8 => ScalarValue::Float64(portal.parameter::<f64>(i, ty)?),
            Type::BYTEA => ScalarValue::LargeBinary(portal.parameter::<Vec<u8>>(i, ty)?),
            Type::TIMESTAMPTZ => ScalarValue::TimestampMicrosecond(
                portal
                    .parameter::<chrono::DateTime<chrono::FixedOffset>>(i, ty)?
                    .map(|t| t.timestamp_micros()),
                Some("+00:00".into()),
            ),
            Type::TIMESTAMP => ScalarValue::TimestampMicrosecond(
                portal
                    .parameter::<chrono::NaiveDateTime>(i, ty)?
                    .map(|t| t.and_utc().timestamp_micros()),
                None,
            ),
            _ => ScalarValue::Utf8(portal.parameter::<String>(i, &Type::TEXT)?),
        };
        values.push(v.into());
    }
    Ok(ParamValues::List(values))
}
