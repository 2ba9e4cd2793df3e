//! The PostgreSQL wire protocol (pgwire): psql, psycopg, JDBC and other PostgreSQL clients
//! query topics through the same [`SqlEngine`] as HTTP and the CLI.
//!
//! - Simple query: a string of one or more statements, each answered in order.
//! - Extended query: Parse plans the statement once to describe its parameters and columns;
//!   each Execute plans it again (a fresh seam per execution) and binds `$1`, `$2`, ...
//! - Authentication: off → any user and database name is accepted without a password; on →
//!   the client's password is the token (cleartext password exchange; use TLS in front).
//! - Values: integers, floats, booleans, text, bytea, date, timestamp and timestamptz map to
//!   their PostgreSQL types; maps, structs and lists are `json`; anything else is `text`.
//! - Cancelling: a cancel request stops the session's running query, and so does the client
//!   closing its connection ([`super::pg_cancel`]); each connection has its own handlers,
//!   holding its session.
//!
//! Errors map to SQLSTATE codes in [`to_pg_error`] and only there.

use std::fmt::Debug;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{
    DataType, Date32Type, Float16Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type,
    Int8Type, SchemaRef, TimeUnit, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
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
use pgwire::api::results::{DataRowEncoder, FieldFormat, FieldInfo, QueryResponse, Response, Tag};
use pgwire::api::stmt::QueryParser;
use pgwire::api::{
    ClientInfo, ClientPortalStore, PgWireConnectionState, PgWireServerHandlers, Type,
};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::data::DataRow;
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::format::{display_strings, json_values};
use super::pg_cancel::{self, Cancels, Session};
use super::{Prepared, SqlEngine, SqlError};
use crate::auth::Principal;
use pgwire::messages::startup::PasswordMessageFamily;

/// The one place SQL errors become PostgreSQL errors (SQLSTATE codes).
pub fn to_pg_error(e: SqlError) -> PgWireError {
    let code = match &e {
        SqlError::Refused(_) => "25006",         // read_only_sql_transaction
        SqlError::Invalid(_) => "42000",         // syntax_error_or_access_rule_violation
        SqlError::TableNotFound(_) => "42P01",   // undefined_table
        SqlError::Execution(_) => "XX000",       // internal_error
        SqlError::MemoryLimit { .. } => "53200", // out_of_memory
        SqlError::Timeout(_) => "57014",         // query_canceled
        SqlError::Unauthenticated(_) => "28P01", // invalid_password
        SqlError::Denied(_) => "42501",          // insufficient_privilege
        SqlError::Stopped => "57P01",            // admin_shutdown
        SqlError::Cancelled => "57014",          // query_canceled
    };
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".to_owned(),
        code.to_owned(),
        e.to_string(),
    )))
}

/// Serves PostgreSQL clients on `listener` until `stop`; connections run on the SQL runtime.
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
                engine.runtime().spawn(async move {
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
                let encoded = rows.flat_map({
                    let fields = fields.clone();
                    move |batch| {
                        let rows = match batch {
                            Ok(b) => encode_batch(&b, &fields),
                            Err(e) => vec![Err(to_pg_error(e))],
                        };
                        stream::iter(rows)
                    }
                });
                Ok(Response::Query(QueryResponse::new(fields, encoded)))
            }
        }
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
        let principal = session_principal(client);
        let prepared = self
            .engine
            .prepare(&principal, query)
            .await
            .map_err(to_pg_error)?;
        if prepared.is_empty() {
            // Only comments (`-- ping`): PostgreSQL answers EmptyQueryResponse.
            return Ok(vec![Response::EmptyQuery]);
        }
        let cancel = self.session.start_query();
        let mut out = Vec::with_capacity(prepared.len());
        for p in prepared {
            out.push(self.respond(p, None, None, &cancel).await?);
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
        let principal = session_principal(client);
        let mut prepared = self
            .engine
            .prepare(&principal, &stmt.sql)
            .await
            .map_err(to_pg_error)?;
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
        let cancel = self.session.start_query();
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

/// The PostgreSQL type of an Arrow type.
pub(crate) fn pg_type(dt: &DataType) -> Type {
    match dt {
        DataType::Boolean => Type::BOOL,
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => Type::INT2,
        DataType::Int32 | DataType::UInt16 => Type::INT4,
        DataType::Int64 | DataType::UInt32 | DataType::UInt64 => Type::INT8,
        DataType::Float16 | DataType::Float32 => Type::FLOAT4,
        DataType::Float64 => Type::FLOAT8,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Type::TEXT,
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => Type::BYTEA,
        DataType::Date32 => Type::DATE,
        DataType::Timestamp(_, Some(_)) => Type::TIMESTAMPTZ,
        DataType::Timestamp(_, None) => Type::TIMESTAMP,
        DataType::Map(..)
        | DataType::Struct(_)
        | DataType::List(_)
        | DataType::LargeList(_)
        | DataType::FixedSizeList(..)
        | DataType::Union(..) => Type::JSON,
        _ => Type::TEXT,
    }
}

fn field_infos(schema: &SchemaRef, format: Option<&Format>) -> Vec<FieldInfo> {
    schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let fmt = format.map_or(FieldFormat::Text, |f| f.format_for(i));
            FieldInfo::new(f.name().clone(), None, None, pg_type(f.data_type()), fmt)
        })
        .collect()
}

/// One column of a batch, ready to give a value per row.
enum Column<'a> {
    Bool(&'a arrow::array::BooleanArray),
    I16(Vec<Option<i16>>),
    I32(Vec<Option<i32>>),
    I64(Vec<Option<i64>>),
    F32(Vec<Option<f32>>),
    F64(Vec<Option<f64>>),
    Text(Vec<Option<String>>),
    Bytes(&'a ArrayRef),
    Date(Vec<Option<chrono::NaiveDate>>),
    TimestampTz(Vec<Option<chrono::DateTime<chrono::Utc>>>),
    Timestamp(Vec<Option<chrono::NaiveDateTime>>),
    Json(Vec<Option<serde_json::Value>>),
}

fn micros(unit: &TimeUnit, v: i64) -> i64 {
    match unit {
        TimeUnit::Second => v.saturating_mul(1_000_000),
        TimeUnit::Millisecond => v.saturating_mul(1000),
        TimeUnit::Microsecond => v,
        TimeUnit::Nanosecond => v.div_euclid(1000),
    }
}

fn prepare_column(c: &ArrayRef) -> Result<Column<'_>, arrow::error::ArrowError> {
    macro_rules! prim {
        ($t:ty, $variant:ident, $conv:expr) => {
            Column::$variant(
                c.as_primitive::<$t>()
                    .iter()
                    .map(|v| v.map($conv))
                    .collect(),
            )
        };
    }
    Ok(match c.data_type() {
        DataType::Boolean => Column::Bool(c.as_boolean()),
        DataType::Int8 => prim!(Int8Type, I16, i16::from),
        DataType::Int16 => prim!(Int16Type, I16, |v| v),
        DataType::UInt8 => prim!(UInt8Type, I16, i16::from),
        DataType::Int32 => prim!(Int32Type, I32, |v| v),
        DataType::UInt16 => prim!(UInt16Type, I32, i32::from),
        DataType::Int64 => prim!(Int64Type, I64, |v| v),
        DataType::UInt32 => prim!(UInt32Type, I64, i64::from),
        DataType::UInt64 => prim!(UInt64Type, I64, |v: u64| i64::try_from(v)
            .unwrap_or(i64::MAX)),
        DataType::Float16 => prim!(Float16Type, F32, f32::from),
        DataType::Float32 => prim!(Float32Type, F32, |v| v),
        DataType::Float64 => prim!(Float64Type, F64, |v| v),
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => Column::Bytes(c),
        DataType::Date32 => Column::Date(
            c.as_primitive::<Date32Type>()
                .iter()
                .map(|v| v.and_then(Date32Type::to_naive_date_opt))
                .collect(),
        ),
        DataType::Timestamp(unit, tz) => {
            let values = arrow::compute::cast(c, &DataType::Int64)?;
            let us: Vec<Option<i64>> = values
                .as_primitive::<Int64Type>()
                .iter()
                .map(|v| v.map(|v| micros(unit, v)))
                .collect();
            if tz.is_some() {
                Column::TimestampTz(
                    us.into_iter()
                        .map(|v| v.and_then(chrono::DateTime::from_timestamp_micros))
                        .collect(),
                )
            } else {
                Column::Timestamp(
                    us.into_iter()
                        .map(|v| {
                            v.and_then(chrono::DateTime::from_timestamp_micros)
                                .map(|t| t.naive_utc())
                        })
                        .collect(),
                )
            }
        }
        dt if pg_type(dt) == Type::JSON => Column::Json(json_values(c)?),
        _ => Column::Text(
            display_strings(c)?
                .iter()
                .map(|v| v.map(str::to_string))
                .collect(),
        ),
    })
}

fn encode_batch(batch: &RecordBatch, fields: &Arc<Vec<FieldInfo>>) -> Vec<PgWireResult<DataRow>> {
    let columns: Result<Vec<Column<'_>>, _> = batch.columns().iter().map(prepare_column).collect();
    let columns = match columns {
        Ok(c) => c,
        Err(e) => return vec![Err(to_pg_error(SqlError::Execution(e.to_string())))],
    };
    let mut encoder = DataRowEncoder::new(fields.clone());
    let mut rows = Vec::with_capacity(batch.num_rows());
    for row in 0..batch.num_rows() {
        let mut failed = None;
        for c in &columns {
            let r = match c {
                Column::Bool(a) => encoder.encode_field(&(a.is_valid(row).then(|| a.value(row)))),
                Column::I16(v) => encoder.encode_field(&v[row]),
                Column::I32(v) => encoder.encode_field(&v[row]),
                Column::I64(v) => encoder.encode_field(&v[row]),
                Column::F32(v) => encoder.encode_field(&v[row]),
                Column::F64(v) => encoder.encode_field(&v[row]),
                Column::Text(v) => encoder.encode_field(&v[row]),
                Column::Bytes(a) => {
                    let value: Option<Vec<u8>> = a.is_valid(row).then(|| binary_at(a, row));
                    encoder.encode_field(&value)
                }
                Column::Date(v) => encoder.encode_field(&v[row]),
                Column::TimestampTz(v) => encoder.encode_field(&v[row]),
                Column::Timestamp(v) => encoder.encode_field(&v[row]),
                Column::Json(v) => encoder.encode_field(&v[row]),
            };
            if let Err(e) = r {
                failed = Some(e);
                break;
            }
        }
        match failed {
            Some(e) => {
                rows.push(Err(e));
                return rows;
            }
            None => rows.push(Ok(encoder.take_row())),
        }
    }
    rows
}

fn binary_at(a: &ArrayRef, row: usize) -> Vec<u8> {
    match a.data_type() {
        DataType::Binary => a.as_binary::<i32>().value(row).to_vec(),
        DataType::LargeBinary => a.as_binary::<i64>().value(row).to_vec(),
        DataType::BinaryView => a.as_binary_view().value(row).to_vec(),
        DataType::FixedSizeBinary(_) => a.as_fixed_size_binary().value(row).to_vec(),
        _ => Vec::new(),
    }
}
