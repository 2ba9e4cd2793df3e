//! What PostgreSQL tools ask before they query: `pg_catalog` over the topics, the functions
//! and settings psql's meta-commands, Grafana, Metabase and DBeaver (pgjdbc) use on connect and
//! when they list schemas, tables and columns.
//!
//! The `pg_catalog` tables and the PostgreSQL-compatibility rewrites of statements (`::regclass`
//! casts, `pg_catalog.`-qualified functions and types, unqualified `pg_*` tables) come from the
//! `datafusion-pg-catalog` crate; this module feeds it the session's listing
//! ([`TopicsInfo`]: tenant → database, namespace → schema, topic → table, columns from the
//! table's current schema) and adds what it answers differently from us: the current schema is
//! the session's default namespace (`default`), and the settings tools read.
//!
//! Invariants:
//! - `pg_catalog` shows exactly the topics the session lists (those its principal may read).
//! - Nothing here opens a topic's tail: a column listing reads the lake table's schema (or the
//!   topic schema when nothing is offloaded yet), never the log.

use std::sync::{Arc, LazyLock};

use arrow::datatypes::{DataType, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::SchemaProvider;
use datafusion::common::{DataFusionError, Result as DFResult, ScalarValue};
use datafusion::datasource::{TableProvider, TableType};
use datafusion::logical_expr::{ColumnarValue, ScalarUDF, Volatility};
use datafusion::prelude::{create_udf, SessionContext};
use datafusion::sql::sqlparser::ast::Statement;
use datafusion_pg_catalog::pg_catalog::catalog_info::CatalogInfo;
use datafusion_pg_catalog::pg_catalog::context::EmptyContextProvider;
use datafusion_pg_catalog::pg_catalog::{
    self as pg, PgCatalogSchemaProvider, PgCatalogStaticTables,
};
use datafusion_pg_catalog::sql::rules::{
    AliasDuplicatedProjectionRewrite, CurrentUserVariableToSessionUserFunctionCall,
    FixArrayLiteral, FixCollate, FixVersionColumnName, PrependUnqualifiedPgTableName,
    RemoveQualifier, RemoveUnsupportedTypes, ResolveUnqualifiedIdentifer,
    RewriteArrayAnyAllOperation, RewriteRegclassCastToSubquery, SqlStatementRewriteRule,
};
use datafusion_pg_catalog::sql::PostgresCompatibilityParser;

use super::catalog::{Listing, Shared};

/// The schema name tools expect the catalog under.
pub(crate) const SCHEMA: &str = "pg_catalog";

/// The session's current schema (the default namespace).
const CURRENT_SCHEMA: &str = "default";

/// Settings tools read with `SHOW` or `current_setting(name)`: name, value.
const SETTINGS: &[(&str, &str)] = &[
    ("server_version", "15.0"),
    ("server_version_num", "150000"),
    ("server_encoding", "UTF8"),
    ("client_encoding", "UTF8"),
    ("standard_conforming_strings", "on"),
    ("integer_datetimes", "on"),
    ("datestyle", "ISO, MDY"),
    ("intervalstyle", "postgres"),
    ("timezone", "UTC"),
    ("search_path", "\"default\", public"),
    ("transaction_isolation", "read committed"),
    ("transaction isolation level", "read committed"),
    ("transaction_read_only", "on"),
    ("default_transaction_read_only", "on"),
    ("max_identifier_length", "63"),
    ("lc_collate", "C"),
    ("lc_ctype", "C"),
    ("application_name", ""),
    ("is_superuser", "off"),
];

/// A setting's value, by name (case-insensitive).
pub(crate) fn setting(name: &str) -> Option<&'static str> {
    let name = name.trim().to_ascii_lowercase();
    SETTINGS.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

/// The pg_catalog tables copied from PostgreSQL (types, operators, functions ...), parsed once.
static STATIC_TABLES: LazyLock<Result<Arc<PgCatalogStaticTables>, String>> = LazyLock::new(|| {
    PgCatalogStaticTables::try_new()
        .map(Arc::new)
        .map_err(|e| e.to_string())
});

/// The crate's parser: its token-level replacements of known psql catalog queries and every
/// rewrite, for catalog queries only.
static COMPAT: LazyLock<PostgresCompatibilityParser> =
    LazyLock::new(PostgresCompatibilityParser::new);

/// The rewrites applied to every statement: the crate's, except the one that replaces a
/// correlated subquery in a projection with NULL (right for a tool's catalog probe, a silently
/// wrong answer for a query over topics).
static RULES: LazyLock<Vec<Box<dyn SqlStatementRewriteRule>>> = LazyLock::new(|| {
    vec![
        Box::new(AliasDuplicatedProjectionRewrite),
        Box::new(ResolveUnqualifiedIdentifer),
        Box::new(RewriteArrayAnyAllOperation),
        Box::new(PrependUnqualifiedPgTableName),
        Box::new(RemoveQualifier),
        Box::new(RewriteRegclassCastToSubquery::new()),
        Box::new(RemoveUnsupportedTypes::new()),
        Box::new(FixArrayLiteral),
        Box::new(CurrentUserVariableToSessionUserFunctionCall),
        Box::new(FixCollate),
        Box::new(FixVersionColumnName),
    ]
});

/// `statement` rewritten into the form DataFusion plans (PostgreSQL's casts, qualified
/// functions and types, unqualified catalog tables).
pub(crate) fn rewrite(statement: Statement) -> Statement {
    RULES.iter().fold(statement, |s, rule| rule.rewrite(s))
}

/// Replaces Grafana's reading of the search path (`x IN (SELECT trim(s[i]) FROM
/// generate_series(...) AS i, string_to_array(current_setting('search_path'), ',') s)`, which
/// DataFusion cannot plan) with the list of its entries; whether it found one.
pub(crate) fn resolve_search_path(statement: &mut Statement) -> bool {
    use datafusion::sql::sqlparser::ast::{Expr, Value, VisitMut, VisitorMut};
    use std::ops::ControlFlow;

    struct Resolve(bool);
    impl VisitorMut for Resolve {
        type Break = ();
        fn post_visit_expr(&mut self, e: &mut Expr) -> ControlFlow<()> {
            if let Expr::InSubquery {
                expr,
                subquery,
                negated,
            } = e
            {
                let text = subquery.to_string().to_ascii_lowercase();
                if text.contains("current_setting('search_path')")
                    && text.contains("generate_series")
                {
                    let list = setting("search_path")
                        .unwrap_or_default()
                        .split(',')
                        .map(|p| Expr::Value(Value::SingleQuotedString(p.trim().into()).into()))
                        .collect();
                    *e = Expr::InList {
                        expr: expr.clone(),
                        list,
                        negated: *negated,
                    };
                    self.0 = true;
                }
            }
            ControlFlow::Continue(())
        }
    }
    let mut resolve = Resolve(false);
    let _ = statement.visit(&mut resolve);
    resolve.0
}

/// `information_schema` views PostgreSQL tools read that DataFusion's `information_schema` lacks
/// or shapes differently, as queries over `pg_catalog` (PostgreSQL's column names and type
/// names; no constraints: topics have none).
const INFORMATION_SCHEMA_VIEWS: &[(&str, &str)] = &[
    (
        "columns",
        "SELECT current_database() AS table_catalog, n.nspname AS table_schema, \
         cl.relname AS table_name, a.attname AS column_name, \
         CAST(a.attnum AS INT) AS ordinal_position, CAST(NULL AS VARCHAR) AS column_default, \
         CASE WHEN a.attnotnull THEN 'NO' ELSE 'YES' END AS is_nullable, \
         format_type(a.atttypid, a.atttypmod) AS data_type, \
         CAST(NULL AS INT) AS character_maximum_length, CAST(NULL AS INT) AS numeric_precision, \
         CAST(NULL AS INT) AS numeric_scale, CAST(NULL AS INT) AS datetime_precision, \
         'pg_catalog' AS udt_schema, ty.typname AS udt_name, 'NO' AS is_identity, \
         'NEVER' AS is_generated, 'YES' AS is_updatable \
         FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class cl ON a.attrelid = cl.oid \
         JOIN pg_catalog.pg_namespace n ON cl.relnamespace = n.oid \
         JOIN pg_catalog.pg_type ty ON ty.oid = a.atttypid \
         WHERE a.attnum > 0 AND NOT a.attisdropped",
    ),
    (
        "table_constraints",
        "SELECT CAST(NULL AS VARCHAR) AS constraint_catalog, \
         CAST(NULL AS VARCHAR) AS constraint_schema, CAST(NULL AS VARCHAR) AS constraint_name, \
         CAST(NULL AS VARCHAR) AS table_catalog, CAST(NULL AS VARCHAR) AS table_schema, \
         CAST(NULL AS VARCHAR) AS table_name, CAST(NULL AS VARCHAR) AS constraint_type, \
         CAST(NULL AS VARCHAR) AS is_deferrable, CAST(NULL AS VARCHAR) AS initially_deferred, \
         CAST(NULL AS VARCHAR) AS enforced WHERE false",
    ),
    (
        "key_column_usage",
        "SELECT CAST(NULL AS VARCHAR) AS constraint_catalog, \
         CAST(NULL AS VARCHAR) AS constraint_schema, CAST(NULL AS VARCHAR) AS constraint_name, \
         CAST(NULL AS VARCHAR) AS table_catalog, CAST(NULL AS VARCHAR) AS table_schema, \
         CAST(NULL AS VARCHAR) AS table_name, CAST(NULL AS VARCHAR) AS column_name, \
         CAST(NULL AS INT) AS ordinal_position, \
         CAST(NULL AS INT) AS position_in_unique_constraint WHERE false",
    ),
];

/// Replaces the tables of [`INFORMATION_SCHEMA_VIEWS`] in a catalog query by their queries.
pub(crate) fn information_schema_views(statement: &mut Statement) {
    use datafusion::sql::sqlparser::ast::{
        Ident, ObjectNamePart, TableAlias, TableFactor, VisitMut, VisitorMut,
    };
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    use std::ops::ControlFlow;

    struct Views;
    impl VisitorMut for Views {
        type Break = ();
        /// `CAST(x AS REGCLASS)` left after the crate's rewrites (a computed name, as in
        /// Metabase's `col_description(format('%I.%I', ...)::regclass::oid, n)`) is `x`: the
        /// functions that take it answer NULL for any argument.
        fn post_visit_expr(
            &mut self,
            e: &mut datafusion::sql::sqlparser::ast::Expr,
        ) -> ControlFlow<()> {
            use datafusion::sql::sqlparser::ast::{DataType as SqlType, Expr};
            if let Expr::Cast {
                expr, data_type, ..
            } = e
            {
                let oid = matches!(data_type, SqlType::Custom(n, _) if n.to_string().eq_ignore_ascii_case("oid"));
                if matches!(data_type, SqlType::Regclass)
                    || oid && matches!(expr.as_ref(), Expr::Function(_) | Expr::Cast { .. })
                {
                    *e = expr.as_ref().clone();
                }
            }
            ControlFlow::Continue(())
        }
        fn post_visit_table_factor(&mut self, t: &mut TableFactor) -> ControlFlow<()> {
            let TableFactor::Table {
                name,
                alias,
                args: None,
                ..
            } = t
            else {
                return ControlFlow::Continue(());
            };
            let parts: Vec<String> = name
                .0
                .iter()
                .filter_map(|p| match p {
                    ObjectNamePart::Identifier(i) => Some(i.value.to_ascii_lowercase()),
                    _ => None,
                })
                .collect();
            let [schema, table] = parts.as_slice() else {
                return ControlFlow::Continue(());
            };
            let Some((_, sql)) = INFORMATION_SCHEMA_VIEWS
                .iter()
                .find(|(v, _)| schema == "information_schema" && v == table)
            else {
                return ControlFlow::Continue(());
            };
            let Ok(query) = Parser::new(&PostgreSqlDialect {})
                .try_with_sql(sql)
                .and_then(|mut p| p.parse_query())
            else {
                return ControlFlow::Continue(());
            };
            let alias = alias.clone().or_else(|| {
                Some(TableAlias {
                    explicit: true,
                    name: Ident::new(table.clone()),
                    columns: vec![],
                })
            });
            *t = TableFactor::Derived {
                lateral: false,
                subquery: query,
                alias,
                sample: None,
            };
            ControlFlow::Continue(())
        }
    }
    let _ = statement.visit(&mut Views);
}

/// `sql` parsed as a catalog query (it names `pg_*` objects or `information_schema`) by the
/// crate's parser, `None` when it is not one or the parser refuses it.
pub(crate) fn parse_catalog_query(sql: &str) -> Option<Vec<Statement>> {
    let lower = sql.to_ascii_lowercase();
    if !(lower.contains("pg_") || lower.contains("information_schema")) {
        return None;
    }
    COMPAT.parse(sql).ok()
}

/// The `pg_catalog` schema of a session listing `listing`.
pub(crate) fn schema(shared: Shared, listing: Arc<Listing>) -> DFResult<Arc<dyn SchemaProvider>> {
    let tables = STATIC_TABLES
        .as_ref()
        .map_err(|e| DataFusionError::Internal(format!("pg_catalog tables: {e}")))?
        .clone();
    let info = TopicsInfo { shared, listing };
    let inner = PgCatalogSchemaProvider::try_new(info.clone(), tables, EmptyContextProvider)?;
    Ok(Arc::new(PgCatalog {
        inner: Arc::new(inner),
        info,
    }))
}

/// The crate's `pg_catalog` with our `pg_namespace`, `pg_class` and `pg_attribute`
/// ([`super::pg_relations`]: oids stable across sessions).
#[derive(Debug)]
struct PgCatalog {
    inner: Arc<dyn SchemaProvider>,
    info: TopicsInfo,
}

#[async_trait]
impl SchemaProvider for PgCatalog {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        self.inner.table_names()
    }

    async fn table(&self, name: &str) -> DFResult<Option<Arc<dyn TableProvider>>> {
        let Some(crate_table) = self.inner.table(name).await? else {
            return Ok(None);
        };
        let ours = super::pg_relations::table(
            &name.to_ascii_lowercase(),
            crate_table.schema(),
            &self.info.shared,
            &self.info.listing,
        )
        .await?;
        Ok(Some(ours.unwrap_or(crate_table)))
    }

    /// The crate's answer: ours replace its tables of the same names and type, and asking it
    /// does not build `pg_attribute` (every listed topic's columns) only to learn that it is a
    /// table, which `information_schema.tables` and `SHOW TABLES` ask of every name.
    async fn table_type(&self, name: &str) -> DFResult<Option<TableType>> {
        self.inner.table_type(name).await
    }

    fn table_exist(&self, name: &str) -> bool {
        self.inner.table_exist(name)
    }
}

/// Registers the functions tools call on connect and in catalog queries.
pub(crate) fn register_functions(ctx: &SessionContext) -> DFResult<()> {
    for f in [
        constant("current_database", super::catalog::DEFAULT_CATALOG),
        pg::create_pg_get_userbyid_udf(),
        pg::create_pg_table_is_visible(),
        pg::create_session_user_udf(),
        pg::create_pg_get_partkeydef_udf(),
        pg::create_pg_relation_is_publishable_udf(),
        pg::create_pg_get_statisticsobjdef_columns_udf(),
        pg::create_pg_encoding_to_char_udf(),
        pg::create_pg_backend_pid_udf(),
        pg::create_pg_relation_size_udf(),
        pg::create_pg_total_relation_size_udf(),
        pg::create_pg_stat_get_numscans(),
        pg::create_pg_get_constraintdef(),
        pg::create_pg_get_partition_ancestors_udf(),
        pg::format_type::create_format_type_udf(),
        pg::pg_get_expr_udf::create_pg_get_expr_udf(),
        pg::quote_ident_udf::create_quote_ident_udf(),
        pg::quote_ident_udf::create_parse_ident_udf(),
        constant("current_schema", CURRENT_SCHEMA),
        no_description("col_description", 2),
        no_description("obj_description", 2),
        no_description("shobj_description", 2),
        current_schemas(),
        current_setting(),
        format(),
        super::pg_composite::expand_array(),
    ] {
        ctx.register_udf(f);
    }
    for name in [
        "has_table_privilege",
        "has_schema_privilege",
        "has_database_privilege",
        "has_any_column_privilege",
    ] {
        ctx.register_udf(pg::has_privilege_udf::create_has_privilege_udf(name));
    }
    if let Ok(tables) = STATIC_TABLES.as_ref() {
        ctx.register_udtf("pg_get_keywords", tables.pg_get_keywords.clone());
    }
    Ok(())
}

/// A function of no arguments returning `value`.
fn constant(name: &str, value: &'static str) -> ScalarUDF {
    create_udf(
        name,
        vec![],
        DataType::Utf8,
        Volatility::Immutable,
        Arc::new(move |_: &[ColumnarValue]| {
            Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(value.into()))))
        }),
    )
}

/// A `*_description` function: topics and their columns carry no comments (NULL).
fn no_description(name: &'static str, args: usize) -> ScalarUDF {
    ScalarUDF::from(Variadic {
        name,
        signature: datafusion::logical_expr::Signature::any(args, Volatility::Stable),
        invoke: |_| Ok(ColumnarValue::Scalar(ScalarValue::Utf8(None))),
    })
}

/// PostgreSQL's `format(fmt, args...)`: `%s` (text), `%I` (identifier, quoted when needed),
/// `%L` (literal, quoted) and `%%`; a null argument is empty (`%s`, `%I`) or `NULL` (`%L`).
fn format() -> ScalarUDF {
    ScalarUDF::from(Variadic {
        name: "format",
        signature: datafusion::logical_expr::Signature::variadic_any(Volatility::Immutable),
        invoke: format_values,
    })
}

/// A text-valued function of any arguments (`create_udf` takes fixed argument types only).
///
/// Invariant: the name identifies the function (equality and hashing go by name and signature).
#[derive(Debug)]
struct Variadic {
    name: &'static str,
    signature: datafusion::logical_expr::Signature,
    invoke: fn(&[ColumnarValue]) -> DFResult<ColumnarValue>,
}

impl PartialEq for Variadic {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.signature == other.signature
    }
}

impl Eq for Variadic {}

impl std::hash::Hash for Variadic {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
        self.signature.hash(state);
    }
}

impl datafusion::logical_expr::ScalarUDFImpl for Variadic {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &datafusion::logical_expr::Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> DFResult<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(
        &self,
        args: datafusion::logical_expr::ScalarFunctionArgs,
    ) -> DFResult<ColumnarValue> {
        (self.invoke)(&args.args)
    }
}

fn format_values(args: &[ColumnarValue]) -> DFResult<ColumnarValue> {
    use arrow::array::{Array, AsArray, StringBuilder};
    use arrow::compute::cast;
    fn quote_ident(v: &str) -> String {
        let plain = v
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
            && v.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if plain {
            v.to_string()
        } else {
            format!("\"{}\"", v.replace('"', "\"\""))
        }
    }
    {
        {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let texts = arrays
                .iter()
                .map(|a| cast(a, &DataType::Utf8))
                .collect::<Result<Vec<_>, _>>()?;
            let texts: Vec<&arrow::array::StringArray> =
                texts.iter().map(|a| a.as_string::<i32>()).collect();
            let rows = texts.first().map_or(0, |t| t.len());
            let mut out = StringBuilder::with_capacity(rows, rows * 16);
            for row in 0..rows {
                if texts[0].is_null(row) {
                    out.append_null();
                    continue;
                }
                let arg = |i: usize| {
                    texts
                        .get(i)
                        .filter(|t| !t.is_null(row))
                        .map(|t| t.value(row))
                };
                let mut next = 1;
                let mut text = String::new();
                let mut chars = texts[0].value(row).chars();
                while let Some(c) = chars.next() {
                    if c != '%' {
                        text.push(c);
                        continue;
                    }
                    match chars.next() {
                        Some('%') => text.push('%'),
                        Some(kind @ ('s' | 'I' | 'L')) => {
                            let v = arg(next);
                            next += 1;
                            match (kind, v) {
                                ('s', v) => text.push_str(v.unwrap_or("")),
                                ('I', v) => text.push_str(&quote_ident(v.unwrap_or(""))),
                                (_, Some(v)) => {
                                    text.push_str(&format!("'{}'", v.replace('\'', "''")))
                                }
                                (_, None) => text.push_str("NULL"),
                            }
                        }
                        other => {
                            return Err(DataFusionError::Execution(format!(
                                "format: unrecognized conversion %{}",
                                other.map(String::from).unwrap_or_default()
                            )))
                        }
                    }
                }
                out.append_value(text);
            }
            Ok(ColumnarValue::Array(Arc::new(out.finish())))
        }
    }
}

/// `current_schemas(include_implicit)`: the search path, `pg_catalog` first when implicit
/// schemas are asked for.
fn current_schemas() -> ScalarUDF {
    create_udf(
        "current_schemas",
        vec![DataType::Boolean],
        DataType::new_list(DataType::Utf8, true),
        Volatility::Immutable,
        Arc::new(|args: &[ColumnarValue]| {
            let implicit = matches!(
                args.first(),
                Some(ColumnarValue::Scalar(ScalarValue::Boolean(Some(true))))
            );
            let mut names = Vec::new();
            if implicit {
                names.push(ScalarValue::Utf8(Some(SCHEMA.into())));
            }
            names.push(ScalarValue::Utf8(Some(CURRENT_SCHEMA.into())));
            Ok(ColumnarValue::Scalar(ScalarValue::List(
                ScalarValue::new_list_nullable(&names, &DataType::Utf8),
            )))
        }),
    )
}

/// `current_setting(name)`: a setting of [`SETTINGS`], or an error naming the unknown one.
fn current_setting() -> ScalarUDF {
    create_udf(
        "current_setting",
        vec![DataType::Utf8],
        DataType::Utf8,
        Volatility::Stable,
        Arc::new(|args: &[ColumnarValue]| {
            let name = match args.first() {
                Some(ColumnarValue::Scalar(ScalarValue::Utf8(Some(n)))) => n.clone(),
                _ => {
                    return Err(DataFusionError::Plan(
                        "current_setting takes one constant setting name".into(),
                    ))
                }
            };
            let value = setting(&name).ok_or_else(|| {
                DataFusionError::Plan(format!("unrecognized configuration parameter \"{name}\""))
            })?;
            Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(value.into()))))
        }),
    )
}

/// The session's listing as `pg_catalog` sees it.
#[derive(Debug, Clone)]
struct TopicsInfo {
    shared: Shared,
    listing: Arc<Listing>,
}

#[async_trait]
impl CatalogInfo for TopicsInfo {
    async fn catalog_names(&self) -> DFResult<Vec<String>> {
        Ok(self.listing.keys().cloned().collect())
    }

    async fn schema_names(&self, catalog: &str) -> DFResult<Option<Vec<String>>> {
        Ok(self
            .listing
            .get(catalog)
            .map(|n| n.keys().cloned().collect()))
    }

    async fn table_names(&self, catalog: &str, schema: &str) -> DFResult<Option<Vec<String>>> {
        Ok(self
            .listing
            .get(catalog)
            .and_then(|n| n.get(schema))
            .map(|t| t.iter().cloned().collect()))
    }

    async fn table_schema(
        &self,
        catalog: &str,
        schema: &str,
        table: &str,
    ) -> DFResult<Option<SchemaRef>> {
        if !self.listed(catalog, schema, table) {
            return Ok(None);
        }
        super::catalog::topic_schema(&self.shared, catalog, schema, table)
            .await
            .map(Some)
            .map_err(|e| DataFusionError::External(Box::new(e)))
    }

    async fn table_type(
        &self,
        catalog: &str,
        schema: &str,
        table: &str,
    ) -> DFResult<Option<TableType>> {
        Ok(self
            .listed(catalog, schema, table)
            .then_some(TableType::Base))
    }
}

impl TopicsInfo {
    fn listed(&self, catalog: &str, schema: &str, table: &str) -> bool {
        self.listing
            .get(catalog)
            .and_then(|n| n.get(schema))
            .is_some_and(|t| t.contains(table))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_found_by_any_case() {
        assert_eq!(setting("Standard_Conforming_Strings"), Some("on"));
        assert_eq!(setting("search_path"), Some("\"default\", public"));
        assert_eq!(setting("no_such_setting"), None);
    }

    #[test]
    fn the_copied_catalog_tables_load() {
        assert!(STATIC_TABLES.is_ok(), "{:?}", STATIC_TABLES.as_ref().err());
    }
}
