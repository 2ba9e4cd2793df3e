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
        current_schemas(),
        current_setting(),
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
