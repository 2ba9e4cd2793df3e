//! Read-only SQL: which statements run, which are accepted as no-ops, which are refused.
//!
//! Two checks, so a refused statement never reaches a planner that could act on it:
//! 1. [`classify`], on the parsed statement: queries, EXPLAIN of a query and SHOW run;
//!    `BEGIN`/`COMMIT`/`ROLLBACK` and `SET` of a client setting (psql, psycopg and JDBC send
//!    them) are answered without effect; everything else — DDL, DML, COPY, CREATE EXTERNAL
//!    TABLE, SET of an engine option, PREPARE — is refused with its statement kind named.
//! 2. [`verify`], on the logical plan: DataFusion's own check that the plan holds no DDL, DML
//!    or statement node (it also sees inside EXPLAIN and subqueries).
//!
//! Files and URLs: the session has no URL tables (`SELECT * FROM 'file.parquet'` fails as an
//! unknown table), no `read_*` table functions and no DDL, so no statement names a path.

use datafusion::execution::context::SQLOptions;
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::parser::{DFParser, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::{Set, Statement};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;

use super::SqlError;

/// What to do with one statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Class {
    /// Plan and run it.
    Query,
    /// Answer with this command tag, do nothing.
    NoOp(String),
}

/// Splits `sql` into statements (PostgreSQL dialect), each in the form DataFusion plans:
/// PostgreSQL's catalog idioms rewritten ([`super::pg_catalog::rewrite`]) and `SHOW` of a
/// PostgreSQL setting turned into the query of its value.
pub fn parse(sql: &str) -> Result<Vec<DFStatement>, SqlError> {
    let mut statements = DFParser::parse_sql_with_dialect(sql, &PostgreSqlDialect {})
        .map_err(|e| SqlError::Invalid(e.strip_backtrace()))?;
    let mut search_path = false;
    for s in statements.iter_mut() {
        if let DFStatement::Statement(s) = s {
            search_path |= super::pg_catalog::resolve_search_path(s);
        }
    }
    let plain = statements
        .iter()
        .all(|s| matches!(s, DFStatement::Statement(_)));
    if plain && !search_path {
        // A tool's catalog query: the crate's parser also knows whole psql queries by heart.
        if let Some(catalog) = super::pg_catalog::parse_catalog_query(sql) {
            if catalog.len() == statements.len() {
                return catalog
                    .into_iter()
                    .map(|mut s| {
                        super::pg_catalog::information_schema_views(&mut s);
                        super::pg_composite::rewrite(&mut s);
                        Ok(DFStatement::Statement(Box::new(show_form(s)?)))
                    })
                    .collect();
            }
        }
    }
    statements
        .into_iter()
        .map(|s| match s {
            DFStatement::Statement(s) => {
                let mut s = super::pg_catalog::rewrite(show_form(*s)?);
                super::pg_composite::rewrite(&mut s);
                Ok(DFStatement::Statement(Box::new(s)))
            }
            other => Ok(other),
        })
        .collect()
}

/// `SHOW <PostgreSQL setting>` as the query of its value; other statements unchanged.
fn show_form(statement: Statement) -> Result<Statement, SqlError> {
    if let Statement::ShowVariable { variable } = &statement {
        let name = variable
            .iter()
            .map(|i| i.value.as_str())
            .collect::<Vec<_>>()
            .join(" ");
        if let Some(value) = super::pg_catalog::setting(&name) {
            // PostgreSQL names the column after the setting (`transaction_isolation` for
            // `SHOW TRANSACTION ISOLATION LEVEL`).
            let column = name.to_ascii_lowercase().replace(' ', "_");
            let column = column.replace("transaction_isolation_level", "transaction_isolation");
            let query = format!(
                "SELECT '{}' AS \"{}\"",
                value.replace('\'', "''"),
                column.replace('"', "\"\"")
            );
            let mut parsed = DFParser::parse_sql_with_dialect(&query, &PostgreSqlDialect {})
                .map_err(|e| SqlError::Invalid(e.strip_backtrace()))?;
            if let Some(DFStatement::Statement(s)) = parsed.pop_front() {
                return Ok(*s);
            }
        }
    }
    Ok(statement)
}

fn refused(what: &str) -> SqlError {
    SqlError::Refused(format!(
        "SQL is read-only: {what} statements are not allowed (only SELECT, EXPLAIN and SHOW run)"
    ))
}

/// Sorts one parsed statement.
pub fn classify(statement: &DFStatement) -> Result<Class, SqlError> {
    match statement {
        DFStatement::Statement(s) => classify_sql(s),
        DFStatement::CreateExternalTable(_) => Err(refused("CREATE EXTERNAL TABLE")),
        DFStatement::CopyTo(_) => Err(refused("COPY")),
        DFStatement::Explain(e) => match classify(&e.statement)? {
            Class::Query => Ok(Class::Query),
            Class::NoOp(_) => Err(refused("EXPLAIN of a session")),
        },
        DFStatement::Reset(_) => Err(refused("RESET")),
    }
}

fn classify_sql(s: &Statement) -> Result<Class, SqlError> {
    match s {
        Statement::Query(_)
        | Statement::ShowTables { .. }
        | Statement::ShowColumns { .. }
        | Statement::ShowVariable { .. }
        | Statement::ShowFunctions { .. }
        | Statement::ShowSchemas { .. }
        | Statement::ExplainTable { .. } => Ok(Class::Query),
        Statement::Explain { statement, .. } => match classify_sql(statement)? {
            Class::Query => Ok(Class::Query),
            Class::NoOp(_) => Err(refused("EXPLAIN of a session")),
        },
        Statement::StartTransaction { .. } => Ok(Class::NoOp("BEGIN".into())),
        Statement::Commit { .. } => Ok(Class::NoOp("COMMIT".into())),
        Statement::Rollback { .. } => Ok(Class::NoOp("ROLLBACK".into())),
        Statement::Set(set) => classify_set(set),
        Statement::Copy { .. } | Statement::CopyIntoSnowflake { .. } => Err(refused("COPY")),
        Statement::Insert(_) => Err(refused("INSERT")),
        Statement::Update(_) => Err(refused("UPDATE")),
        Statement::Delete(_) => Err(refused("DELETE")),
        Statement::Merge(_) => Err(refused("MERGE")),
        Statement::Truncate(_) => Err(refused("TRUNCATE")),
        Statement::CreateTable(_)
        | Statement::CreateView(_)
        | Statement::CreateSchema { .. }
        | Statement::CreateDatabase { .. }
        | Statement::CreateIndex(_)
        | Statement::CreateFunction(_) => Err(refused("CREATE")),
        Statement::AlterTable(_) => Err(refused("ALTER")),
        Statement::Drop { .. } | Statement::DropFunction(_) => Err(refused("DROP")),
        other => {
            let text = other.to_string();
            let kind = text
                .split_whitespace()
                .next()
                .unwrap_or("this")
                .to_uppercase();
            Err(refused(&kind))
        }
    }
}

/// `SET` of a client setting (`application_name`, `DateStyle`, `extra_float_digits`, ...) is
/// accepted without effect; `SET datafusion.*` (engine options such as memory limits) is not.
fn classify_set(set: &Set) -> Result<Class, SqlError> {
    let names: Vec<String> = match set {
        Set::SingleAssignment { variable, .. } => vec![variable.to_string()],
        Set::MultipleAssignments { assignments } => {
            assignments.iter().map(|a| a.name.to_string()).collect()
        }
        Set::SetTimeZone { .. }
        | Set::SetNames { .. }
        | Set::SetNamesDefault { .. }
        | Set::SetTransaction { .. } => vec![],
        _ => return Err(refused("this SET")),
    };
    if names
        .iter()
        .any(|n| n.to_ascii_lowercase().starts_with("datafusion."))
    {
        return Err(refused("SET of an engine option"));
    }
    Ok(Class::NoOp("SET".into()))
}

/// DataFusion's check of the planned statement: no DDL, DML or statement node anywhere.
pub fn verify(plan: &LogicalPlan) -> Result<(), SqlError> {
    SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
        .verify_plan(plan)
        .map_err(|e| SqlError::Refused(format!("SQL is read-only: {}", e.strip_backtrace())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class_of(sql: &str) -> Result<Class, SqlError> {
        let statements = parse(sql)?;
        assert_eq!(statements.len(), 1, "{sql}");
        classify(&statements[0])
    }

    #[test]
    fn queries_run_and_sessions_are_no_ops() {
        assert_eq!(class_of("SELECT 1").ok(), Some(Class::Query));
        assert_eq!(class_of("EXPLAIN SELECT 1").ok(), Some(Class::Query));
        assert_eq!(class_of("SHOW TABLES").ok(), Some(Class::Query));
        assert_eq!(class_of("BEGIN").ok(), Some(Class::NoOp("BEGIN".into())));
        assert_eq!(class_of("COMMIT").ok(), Some(Class::NoOp("COMMIT".into())));
        assert_eq!(
            class_of("ROLLBACK").ok(),
            Some(Class::NoOp("ROLLBACK".into()))
        );
        assert_eq!(
            class_of("SET application_name = 'x'").ok(),
            Some(Class::NoOp("SET".into()))
        );
    }

    #[test]
    fn writes_and_files_are_refused() {
        for sql in [
            "INSERT INTO t VALUES (1)",
            "UPDATE t SET a = 1",
            "DELETE FROM t",
            "CREATE TABLE x (a INT)",
            "CREATE VIEW v AS SELECT 1",
            "DROP TABLE t",
            "ALTER TABLE t ADD COLUMN b INT",
            "TRUNCATE t",
            "COPY t TO '/tmp/x.csv'",
            "CREATE EXTERNAL TABLE x STORED AS PARQUET LOCATION '/etc/'",
            "SET datafusion.runtime.memory_limit = '100G'",
            "EXPLAIN ANALYZE INSERT INTO t VALUES (1)",
            "PREPARE p AS SELECT 1",
        ] {
            match class_of(sql) {
                Err(SqlError::Refused(msg)) => assert!(msg.contains("read-only"), "{sql}: {msg}"),
                other => panic!("{sql}: expected a refusal, got {other:?}"),
            }
        }
    }
}
