"""PostgreSQL tools connect and browse (issue 21): the catalog queries that psql's `\\dt`,
`\\d <table>`, `\\dn`, `\\l` and the PostgreSQL data sources of Grafana, Metabase (pgjdbc) and
DBeaver (pgjdbc) send on connect, when listing schemas, tables and a table's columns, run
against ledgerlake, plus a Grafana-style time-series query over a topic.

Every recorded query is the exact text the tool sends (where it came from is noted beside
it); each runs twice: through psycopg2 (simple protocol; bound values inlined as literals) and
through pg8000's Parse/Bind/Execute with the tool's `$n` parameters and their types (as pgjdbc
and pgx send them). Listing queries must show the topics: `sales` (a JSON-schema topic with
typed columns, namespace `public/default`, i.e. schema `default`) and `audit_log` (raw bytes,
namespace `public/ops`, i.e. schema `ops`).

Reference run: the same recordings and checks hold against a real PostgreSQL holding the same
tables. Set LL_SQL_TOOLS_REFERENCE_PG=HOST:PORT (database `ledgerlake`, user `postgres`,
prepared with REFERENCE_SETUP below) to run the module against it instead of ledgerlake.
"""
import datetime
import os
import re
import subprocess

import pg8000.exceptions
import pg8000.native
import psycopg2
import pulsar
import pytest

from conftest import eventually

SALES = 6        # messages in `sales`
AUDIT = 3        # messages in `ops.audit_log`
DATABASE = "ledgerlake"

# pgjdbc's parameter types: setString → varchar, setLong / a Long via setObject → int8.
VARCHAR = 1043
INT8 = 20

# The same tables in a real PostgreSQL, for the reference run (each statement on its own).
REFERENCE_SETUP = [
    'CREATE SCHEMA "default"',
    "CREATE SCHEMA ops",
    'CREATE TABLE "default".sales (ledger_id bigint NOT NULL, entry_id bigint NOT NULL, '
    "key text, publish_time timestamptz NOT NULL, event_time timestamptz, payload bytea, "
    "amount bigint, region text)",
    "CREATE TABLE ops.audit_log (ledger_id bigint NOT NULL, entry_id bigint NOT NULL, "
    "key text, publish_time timestamptz NOT NULL, payload bytea)",
    'INSERT INTO "default".sales (ledger_id, entry_id, publish_time, amount, region) '
    "SELECT 0, g, now() - g * interval '1 second', g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END "
    "FROM generate_series(0, 5) g",
    "INSERT INTO ops.audit_log (ledger_id, entry_id, publish_time, payload) "
    "SELECT 0, g, now(), 'x' FROM generate_series(0, 2) g",
    'ALTER DATABASE ledgerlake SET search_path = "default", public',
]


class Q:
    """One recorded query: `sql` (or a function of the target, for texts that embed an oid),
    its parameters as (value or function of the target, type oid), and a check of the result
    (columns, rows) that the tool relies on."""

    def __init__(self, tool, name, source, sql, params=(), check=None):
        self.tool, self.name, self.source = tool, name, source
        self.sql, self.params, self.check = sql, list(params), check

    @property
    def id(self):
        return f"{self.tool}:{self.name}"


# ---------------------------------------------------------------------------------------------
# Checks of results
# ---------------------------------------------------------------------------------------------

def _column(result, name):
    cols, rows = result
    lower = [c.lower() for c in cols]
    assert name.lower() in lower, f"no column {name!r} among {cols}"
    i = lower.index(name.lower())
    return [r[i] for r in rows]


def _text(v):
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).decode()
    return str(v)


def values(name, *wanted, suffix=False):
    """Column `name` holds each of `wanted` (or a value ending with it)."""
    def check(result):
        got = [_text(v) for v in _column(result, name) if v is not None]
        for w in wanted:
            assert any(g == w or (suffix and g.endswith(w)) for g in got), \
                f"{w!r} not in column {name!r}: {got[:40]}"
    return check


def pairs(a, b, *wanted):
    """Columns `a` and `b` hold each pair of `wanted` on one row."""
    def check(result):
        got = {(_text(x), _text(y)) for x, y in zip(_column(result, a), _column(result, b))
               if x is not None and y is not None}
        for w in wanted:
            assert w in got, f"{w!r} not among ({a}, {b}): {sorted(got)[:40]}"
    return check


def rows(n=None, at_least=None):
    def check(result):
        got = len(result[1])
        if n is not None:
            assert got == n, f"{got} rows, expected {n}: {result[1][:5]}"
        if at_least is not None:
            assert got >= at_least, f"{got} rows, expected at least {at_least}"
    return check


def first_value(predicate, what):
    def check(result):
        assert result[1], "no row"
        v = result[1][0][0]
        assert predicate(v), f"first value {v!r}: expected {what}"
    return check


def all_of(*checks):
    def check(result):
        for c in checks:
            c(result)
    return check


SALES_COLUMNS = ("amount", "region", "publish_time")
AUDIT_COLUMNS = ("payload", "publish_time")


# ---------------------------------------------------------------------------------------------
# psql 15.18 (Debian 15.18-0+deb12u1, /usr/bin/psql): the text `psql -E` printed for each
# meta-command against PostgreSQL 15.18 holding REFERENCE_SETUP (recorded 2026-12-02). psql
# sends no query on connect (it reads server_version from the start-up ParameterStatus); the
# oid literal of `\d` ('{OID}' below) is replaced by the table's oid at run time, as psql does
# with the oid its first query found.
# ---------------------------------------------------------------------------------------------

PSQL_RECORDED = [
    # \dt: tables in the search path
    ('dt', '\\dt', r"""SELECT n.nspname as "Schema",
  c.relname as "Name",
  CASE c.relkind WHEN 'r' THEN 'table' WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view' WHEN 'i' THEN 'index' WHEN 'S' THEN 'sequence' WHEN 't' THEN 'TOAST table' WHEN 'f' THEN 'foreign table' WHEN 'p' THEN 'partitioned table' WHEN 'I' THEN 'partitioned index' END as "Type",
  pg_catalog.pg_get_userbyid(c.relowner) as "Owner"
FROM pg_catalog.pg_class c
     LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     LEFT JOIN pg_catalog.pg_am am ON am.oid = c.relam
WHERE c.relkind IN ('r','p','')
      AND n.nspname <> 'pg_catalog'
      AND n.nspname !~ '^pg_toast'
      AND n.nspname <> 'information_schema'
  AND pg_catalog.pg_table_is_visible(c.oid)
ORDER BY 1,2;"""),
    # \dt ops.*: tables of schema ops
    ('dt-pattern', '\\dt ops.*', r"""SELECT n.nspname as "Schema",
  c.relname as "Name",
  CASE c.relkind WHEN 'r' THEN 'table' WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view' WHEN 'i' THEN 'index' WHEN 'S' THEN 'sequence' WHEN 't' THEN 'TOAST table' WHEN 'f' THEN 'foreign table' WHEN 'p' THEN 'partitioned table' WHEN 'I' THEN 'partitioned index' END as "Type",
  pg_catalog.pg_get_userbyid(c.relowner) as "Owner"
FROM pg_catalog.pg_class c
     LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     LEFT JOIN pg_catalog.pg_am am ON am.oid = c.relam
WHERE c.relkind IN ('r','p','t','s','')
  AND n.nspname OPERATOR(pg_catalog.~) '^(ops)$' COLLATE pg_catalog.default
ORDER BY 1,2;"""),
    # \d sales: find the relation
    ('d-lookup', '\\d sales', r"""SELECT c.oid,
  n.nspname,
  c.relname
FROM pg_catalog.pg_class c
     LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname OPERATOR(pg_catalog.~) '^(sales)$' COLLATE pg_catalog.default
  AND pg_catalog.pg_table_is_visible(c.oid)
ORDER BY 2, 3;"""),
    # \d sales: relation details
    ('d-relation', '\\d sales', r"""SELECT c.relchecks, c.relkind, c.relhasindex, c.relhasrules, c.relhastriggers, c.relrowsecurity, c.relforcerowsecurity, false AS relhasoids, c.relispartition, '', c.reltablespace, CASE WHEN c.reloftype = 0 THEN '' ELSE c.reloftype::pg_catalog.regtype::pg_catalog.text END, c.relpersistence, c.relreplident, am.amname
FROM pg_catalog.pg_class c
 LEFT JOIN pg_catalog.pg_class tc ON (c.reltoastrelid = tc.oid)
LEFT JOIN pg_catalog.pg_am am ON (c.relam = am.oid)
WHERE c.oid = '{OID}';"""),
    # \d sales: columns
    ('d-columns', '\\d sales', r"""SELECT a.attname,
  pg_catalog.format_type(a.atttypid, a.atttypmod),
  (SELECT pg_catalog.pg_get_expr(d.adbin, d.adrelid, true)
   FROM pg_catalog.pg_attrdef d
   WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum AND a.atthasdef),
  a.attnotnull,
  (SELECT c.collname FROM pg_catalog.pg_collation c, pg_catalog.pg_type t
   WHERE c.oid = a.attcollation AND t.oid = a.atttypid AND a.attcollation <> t.typcollation) AS attcollation,
  a.attidentity,
  a.attgenerated
FROM pg_catalog.pg_attribute a
WHERE a.attrelid = '{OID}' AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum;"""),
    # \d sales: row-level policies
    ('d-policies', '\\d sales', r"""SELECT pol.polname, pol.polpermissive,
  CASE WHEN pol.polroles = '{0}' THEN NULL ELSE pg_catalog.array_to_string(array(select rolname from pg_catalog.pg_roles where oid = any (pol.polroles) order by 1),',') END,
  pg_catalog.pg_get_expr(pol.polqual, pol.polrelid),
  pg_catalog.pg_get_expr(pol.polwithcheck, pol.polrelid),
  CASE pol.polcmd
    WHEN 'r' THEN 'SELECT'
    WHEN 'a' THEN 'INSERT'
    WHEN 'w' THEN 'UPDATE'
    WHEN 'd' THEN 'DELETE'
    END AS cmd
FROM pg_catalog.pg_policy pol
WHERE pol.polrelid = '{OID}' ORDER BY 1;"""),
    # \d sales: extended statistics
    ('d-statistics', '\\d sales', r"""SELECT oid, stxrelid::pg_catalog.regclass, stxnamespace::pg_catalog.regnamespace::pg_catalog.text AS nsp, stxname,
pg_catalog.pg_get_statisticsobjdef_columns(oid) AS columns,
  'd' = any(stxkind) AS ndist_enabled,
  'f' = any(stxkind) AS deps_enabled,
  'm' = any(stxkind) AS mcv_enabled,
stxstattarget
FROM pg_catalog.pg_statistic_ext
WHERE stxrelid = '{OID}'
ORDER BY nsp, stxname;"""),
    # \d sales: publications
    ('d-publications', '\\d sales', r"""SELECT pubname
     , NULL
     , NULL
FROM pg_catalog.pg_publication p
     JOIN pg_catalog.pg_publication_namespace pn ON p.oid = pn.pnpubid
     JOIN pg_catalog.pg_class pc ON pc.relnamespace = pn.pnnspid
WHERE pc.oid ='{OID}' and pg_catalog.pg_relation_is_publishable('{OID}')
UNION
SELECT pubname
     , pg_get_expr(pr.prqual, c.oid)
     , (CASE WHEN pr.prattrs IS NOT NULL THEN
         (SELECT string_agg(attname, ', ')
           FROM pg_catalog.generate_series(0, pg_catalog.array_upper(pr.prattrs::pg_catalog.int2[], 1)) s,
                pg_catalog.pg_attribute
          WHERE attrelid = pr.prrelid AND attnum = prattrs[s])
        ELSE NULL END) FROM pg_catalog.pg_publication p
     JOIN pg_catalog.pg_publication_rel pr ON p.oid = pr.prpubid
     JOIN pg_catalog.pg_class c ON c.oid = pr.prrelid
WHERE pr.prrelid = '{OID}'
UNION
SELECT pubname
     , NULL
     , NULL
FROM pg_catalog.pg_publication p
WHERE p.puballtables AND pg_catalog.pg_relation_is_publishable('{OID}')
ORDER BY 1;"""),
    # \d sales: parents
    ('d-inherits', '\\d sales', r"""SELECT c.oid::pg_catalog.regclass
FROM pg_catalog.pg_class c, pg_catalog.pg_inherits i
WHERE c.oid = i.inhparent AND i.inhrelid = '{OID}'
  AND c.relkind != 'p' AND c.relkind != 'I'
ORDER BY inhseqno;"""),
    # \d sales: children / partitions
    ('d-partitions', '\\d sales', r"""SELECT c.oid::pg_catalog.regclass, c.relkind, inhdetachpending, pg_catalog.pg_get_expr(c.relpartbound, c.oid)
FROM pg_catalog.pg_class c, pg_catalog.pg_inherits i
WHERE c.oid = i.inhrelid AND i.inhparent = '{OID}'
ORDER BY pg_catalog.pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT', c.oid::pg_catalog.regclass::pg_catalog.text;"""),
    # \dn: schemas
    ('dn', '\\dn', r"""SELECT n.nspname AS "Name",
  pg_catalog.pg_get_userbyid(n.nspowner) AS "Owner"
FROM pg_catalog.pg_namespace n
WHERE n.nspname !~ '^pg_' AND n.nspname <> 'information_schema'
ORDER BY 1;"""),
    # \l: databases
    ('l', '\\l', r"""SELECT d.datname as "Name",
       pg_catalog.pg_get_userbyid(d.datdba) as "Owner",
       pg_catalog.pg_encoding_to_char(d.encoding) as "Encoding",
       d.datcollate as "Collate",
       d.datctype as "Ctype",
       d.daticulocale as "ICU Locale",
       CASE d.datlocprovider WHEN 'c' THEN 'libc' WHEN 'i' THEN 'icu' END AS "Locale Provider",
       pg_catalog.array_to_string(d.datacl, E'\n') AS "Access privileges"
FROM pg_catalog.pg_database d
ORDER BY 1;"""),
]

PSQL_CHECKS = {
    "dt": pairs("Schema", "Name", ("default", "sales")),
    "dt-pattern": pairs("Schema", "Name", ("ops", "audit_log")),
    "d-lookup": pairs("nspname", "relname", ("default", "sales")),
    "d-relation": rows(n=1),
    "d-columns": values("attname", *SALES_COLUMNS),
    "dn": values("Name", "default", "ops"),
    "l": rows(at_least=1),
}


def _with_oid(sql, relname):
    if "'{OID}'" not in sql:
        return sql
    return lambda target: sql.replace("'{OID}'", f"'{target.oid(relname)}'")


PSQL_QUERIES = [
    Q("psql", name, f"psql 15.18 -E, {cmd}", _with_oid(sql, "sales"), check=PSQL_CHECKS.get(name))
    for name, cmd, sql in PSQL_RECORDED
]


# ---------------------------------------------------------------------------------------------
# Grafana's PostgreSQL data source.
# - Test connection ("Save & test"): CheckHealth → Ping.
#   grafana/grafana@1b13755cdccfbc5420c9fcb7d6cf2dad7b2888e6
#   pkg/tsdb/grafana-postgresql-datasource/pgx/handler_checkhealth.go → pgxpool Ping →
#   jackc/pgx pgconn/pgconn.go `func (pgConn *PgConn) Ping` = Exec(ctx, "-- ping") (simple
#   protocol only); the older lib/pq engine
#   (grafana/grafana@0c059270ae12a6b64819f9b818dff64cd98a5276 sqleng/handler_checkhealth.go →
#   e.Ping() → lib/pq conn_go18.go Ping) sends ";".
# - Everything else: grafana/grafana@12f912ab8d010f4d95a4043a0efaa20fc4ca0100
#   public/app/plugins/datasource/grafana-postgresql-datasource/postgresMetaQuery.ts, called by
#   datasource.ts (grafana/grafana@04282cd93150390a7d83089cc520d96546d576a8): getVersion() and
#   getTimescaleDBVersion() when the data source is configured (configuration/
#   useAutoDetectFeatures.ts), showTables() for the query builder's table list, getSchema(table)
#   for its column list. showSchemas() is defined there too (not called by that datasource.ts).
#   The functions below return the TypeScript template literals' text as read at that commit.
# ---------------------------------------------------------------------------------------------

def _grafana_schema_constraint():
    # postgresMetaQuery.ts buildSchemaConstraint()
    return """
          quote_ident(table_schema) IN (
          SELECT
            CASE WHEN trim(s[i]) = '"$user"' THEN user ELSE trim(s[i]) END
          FROM
            generate_series(
              array_lower(string_to_array(current_setting('search_path'),','),1),
              array_upper(string_to_array(current_setting('search_path'),','),1)
            ) as i,
            string_to_array(current_setting('search_path'),',') s
          )"""


def grafana_show_schemas():
    return """SELECT schema_name AS "name"
    FROM information_schema.schemata
    WHERE schema_name NOT IN ('information_schema',
                              'pg_catalog',
                              'pg_toast',
                              '_timescaledb_cache',
                              '_timescaledb_catalog',
                              '_timescaledb_internal',
                              '_timescaledb_config',
                              'timescaledb_information',
                              'timescaledb_experimental')
    ORDER BY schema_name"""


def grafana_show_tables():
    c = _grafana_schema_constraint()
    return f"""SELECT
    CASE WHEN {c}
      THEN quote_ident(table_name)
      ELSE quote_ident(table_schema) || '.' || quote_ident(table_name)
    END AS "table"
    FROM information_schema.tables
    WHERE quote_ident(table_schema) NOT IN ('information_schema',
                             'pg_catalog',
                             '_timescaledb_cache',
                             '_timescaledb_catalog',
                             '_timescaledb_internal',
                             '_timescaledb_config',
                             'timescaledb_information',
                             'timescaledb_experimental')
    ORDER BY CASE WHEN {c} THEN 0 ELSE 1 END, 1"""


def grafana_get_schema(table):
    t = "'" + table.replace("'", "''") + "'"
    return f"""SELECT quote_ident(column_name) AS "column", data_type AS "type"
    FROM information_schema.columns
    WHERE
      CASE WHEN array_length(parse_ident({t}),1) = 2
        THEN quote_ident(table_schema) = (parse_ident({t}))[1]
          AND quote_ident(table_name) = (parse_ident({t}))[2]
        ELSE quote_ident(table_name) = {t}
          AND {_grafana_schema_constraint()}
      END"""


GRAFANA_QUERIES = [
    Q("grafana", "test-connection-pgx", "jackc/pgx pgconn.go Ping", "-- ping"),
    Q("grafana", "test-connection-libpq", "lib/pq conn_go18.go Ping", ";"),
    Q("grafana", "version", "postgresMetaQuery.ts getVersion()",
      "SELECT current_setting('server_version_num')::int/100 as version",
      check=first_value(lambda v: int(v) >= 900, "a version number (major*100 + minor) >= 900")),
    Q("grafana", "timescaledb", "postgresMetaQuery.ts getTimescaleDBVersion()",
      "SELECT extversion FROM pg_extension WHERE extname = 'timescaledb'"),
    Q("grafana", "schemas", "postgresMetaQuery.ts showSchemas()", grafana_show_schemas(),
      check=values("name", "default", "ops")),
    Q("grafana", "tables", "postgresMetaQuery.ts showTables()", grafana_show_tables(),
      check=values("table", "sales", "audit_log", suffix=True)),
    Q("grafana", "columns", "postgresMetaQuery.ts getSchema('sales')", grafana_get_schema("sales"),
      check=values("column", *SALES_COLUMNS)),
    Q("grafana", "columns-qualified", "postgresMetaQuery.ts getSchema('ops.audit_log')",
      grafana_get_schema("ops.audit_log"), check=values("column", *AUDIT_COLUMNS)),
]


# ---------------------------------------------------------------------------------------------
# pgjdbc (the JDBC driver of Metabase and DBeaver):
# pgjdbc/pgjdbc@3a699d57d957ca0c2b86e619d001a8763a130027 (REL42.7.13+13),
# pgjdbc/src/main/java/org/postgresql/jdbc/PgDatabaseMetaData.java and PgConnection.java. The
# strings are pgjdbc's concatenations, piece by piece; pgjdbc sends `?` as `$1, $2, …`
# (extended protocol, setString → varchar). On connect pgjdbc sends the first two only to
# servers older than 12 (core/v3/ConnectionFactoryImpl.java runInitialQueries; pgjdbc 42.5.5,
# Debian's libpostgresql-jdbc-java, sent them to PostgreSQL 15 too, seen in its log).
# ---------------------------------------------------------------------------------------------

def _jdbc(sql):
    """pgjdbc's native SQL: each `?` placeholder becomes `$n`."""
    n = 0

    def repl(_m):
        nonlocal n
        n += 1
        return f"${n}"
    return re.sub(r"\?", repl, sql)


# PgDatabaseMetaData.getSchemas(null, null)
PGJDBC_GET_SCHEMAS = (
    "SELECT nspname AS \"TABLE_SCHEM\", current_database() AS \"TABLE_CATALOG\" FROM pg_catalog.pg_namespace "
    + " WHERE nspname <> 'pg_toast' AND (nspname !~ '^pg_temp_' "
    + " OR nspname = (pg_catalog.current_schemas(true))[1]) AND (nspname !~ '^pg_toast_temp_' "
    + " OR nspname = replace((pg_catalog.current_schemas(true))[1], 'pg_temp_', 'pg_toast_temp_')) "
    + " ORDER BY \"TABLE_SCHEM\""
)

# PgDatabaseMetaData.getTables(null, "default", "%", {"TABLE", "PARTITIONED TABLE", "VIEW",
# "FOREIGN TABLE", "MATERIALIZED VIEW"})
_TABLE_TYPE_CLAUSES = [  # tableTypeClauses.get(type).get("SCHEMAS"), in the order asked
    "c.relkind = 'r' AND n.nspname !~ '^pg_' AND n.nspname <> 'information_schema'",
    "c.relkind = 'p' AND n.nspname !~ '^pg_' AND n.nspname <> 'information_schema'",
    "c.relkind = 'v' AND n.nspname <> 'pg_catalog' AND n.nspname <> 'information_schema'",
    "c.relkind = 'f'",
    "c.relkind = 'm'",
]
PGJDBC_GET_TABLES = _jdbc(
    "SELECT current_database() AS \"TABLE_CAT\", n.nspname AS \"TABLE_SCHEM\", c.relname AS \"TABLE_NAME\", "
    + " CASE n.nspname ~ '^pg_' OR n.nspname = 'information_schema' "
    + " WHEN true THEN CASE "
    + " WHEN n.nspname = 'pg_catalog' OR n.nspname = 'information_schema' THEN CASE c.relkind "
    + "  WHEN 'r' THEN 'SYSTEM TABLE' "
    + "  WHEN 'v' THEN 'SYSTEM VIEW' "
    + "  WHEN 'i' THEN 'SYSTEM INDEX' "
    + "  ELSE NULL "
    + "  END "
    + " WHEN n.nspname = 'pg_toast' THEN CASE c.relkind "
    + "  WHEN 'r' THEN 'SYSTEM TOAST TABLE' "
    + "  WHEN 'i' THEN 'SYSTEM TOAST INDEX' "
    + "  ELSE NULL "
    + "  END "
    + " ELSE CASE c.relkind "
    + "  WHEN 'r' THEN 'TEMPORARY TABLE' "
    + "  WHEN 'p' THEN 'TEMPORARY TABLE' "
    + "  WHEN 'i' THEN 'TEMPORARY INDEX' "
    + "  WHEN 'S' THEN 'TEMPORARY SEQUENCE' "
    + "  WHEN 'v' THEN 'TEMPORARY VIEW' "
    + "  ELSE NULL "
    + "  END "
    + " END "
    + " WHEN false THEN CASE c.relkind "
    + " WHEN 'r' THEN 'TABLE' "
    + " WHEN 'p' THEN 'PARTITIONED TABLE' "
    + " WHEN 'i' THEN 'INDEX' "
    + " WHEN 'P' then 'PARTITIONED INDEX' "
    + " WHEN 'S' THEN 'SEQUENCE' "
    + " WHEN 'v' THEN 'VIEW' "
    + " WHEN 'c' THEN 'TYPE' "
    + " WHEN 'f' THEN 'FOREIGN TABLE' "
    + " WHEN 'm' THEN 'MATERIALIZED VIEW' "
    + " ELSE NULL "
    + " END "
    + " ELSE NULL "
    + " END "
    + " AS \"TABLE_TYPE\", d.description AS \"REMARKS\", "
    + " '' as \"TYPE_CAT\", '' as \"TYPE_SCHEM\", '' as \"TYPE_NAME\", "
    + "'' AS \"SELF_REFERENCING_COL_NAME\", '' AS \"REF_GENERATION\" "
    + " FROM pg_catalog.pg_namespace n, pg_catalog.pg_class c "
    + " LEFT JOIN pg_catalog.pg_description d ON (c.oid = d.objoid AND d.objsubid = 0  and d.classoid = 'pg_class'::regclass) "
    + " WHERE c.relnamespace = n.oid "
    + " AND n.nspname LIKE ?"
    + " AND c.relname LIKE ?"
    + " AND (false "
    + "".join(" OR ( " + clause + " ) " for clause in _TABLE_TYPE_CLAUSES)
    + ") "
    + " ORDER BY \"TABLE_TYPE\",\"TABLE_SCHEM\",\"TABLE_NAME\" "
)

# PgDatabaseMetaData.getColumns(null, "default", "sales", null) (server >= 12)
PGJDBC_GET_COLUMNS = _jdbc(
    "SELECT * FROM ("
    + "SELECT current_database() AS current_database, n.nspname,c.relname,a.attname,a.atttypid,a.attnotnull "
    + " OR (t.typtype = 'd' AND t.typnotnull) AS attnotnull,a.atttypmod,a.attlen,t.typtypmod,"
    + "row_number() OVER (PARTITION BY a.attrelid ORDER BY a.attnum) AS attnum, "
    + "nullif(a.attidentity, '') as attidentity,"
    + "nullif(a.attgenerated, '') as attgenerated,"
    + "pg_catalog.pg_get_expr(def.adbin, def.adrelid) AS adsrc,dsc.description,t.typbasetype,t.typtype "
    + " FROM pg_catalog.pg_namespace n "
    + " JOIN pg_catalog.pg_class c ON (c.relnamespace = n.oid) "
    + " JOIN pg_catalog.pg_attribute a ON (a.attrelid=c.oid) "
    + " JOIN pg_catalog.pg_type t ON (a.atttypid = t.oid) "
    + " LEFT JOIN pg_catalog.pg_attrdef def ON (a.attrelid=def.adrelid AND a.attnum = def.adnum) "
    + " LEFT JOIN pg_catalog.pg_description dsc ON (c.oid=dsc.objoid AND a.attnum = dsc.objsubid) "
    + " LEFT JOIN pg_catalog.pg_class dc ON (dc.oid=dsc.classoid AND dc.relname='pg_class') "
    + " LEFT JOIN pg_catalog.pg_namespace dn ON (dc.relnamespace=dn.oid AND dn.nspname='pg_catalog') "
    + " WHERE c.relkind in ('r','p','v','f','m') and a.attnum > 0 AND NOT a.attisdropped "
    + " AND n.nspname LIKE ?"
    + " AND c.relname LIKE ?"
    + ") c WHERE true "
    + " ORDER BY nspname,c.relname,attnum "
)

# PgDatabaseMetaData.getPrimaryKeys(null, "default", "sales")
PGJDBC_GET_PRIMARY_KEYS = _jdbc(
    "SELECT "
    + "       result.TABLE_CAT AS \"TABLE_CAT\", "
    + "       result.TABLE_SCHEM AS \"TABLE_SCHEM\", "
    + "       result.TABLE_NAME AS \"TABLE_NAME\", "
    + "       result.COLUMN_NAME AS \"COLUMN_NAME\", "
    + "       result.KEY_SEQ AS \"KEY_SEQ\", "
    + "       result.PK_NAME AS \"PK_NAME\""
    + "FROM "
    + "     ("
    + "SELECT current_database() AS TABLE_CAT, n.nspname AS TABLE_SCHEM, "
    + "  ct.relname AS TABLE_NAME, a.attname AS COLUMN_NAME, "
    + "  (information_schema._pg_expandarray(con.conkey)).n AS KEY_SEQ, con.conname AS PK_NAME, "
    + "  information_schema._pg_expandarray(con.conkey) AS KEYS, a.attnum AS A_ATTNUM "
    + "FROM pg_catalog.pg_constraint con "
    + "  JOIN pg_catalog.pg_class ct ON (con.conrelid = ct.oid) "
    + "  JOIN pg_catalog.pg_namespace n ON (ct.relnamespace = n.oid) "
    + "  JOIN pg_catalog.pg_attribute a ON (a.attrelid = ct.oid) "
    + "WHERE con.contype = 'p' "
    + " AND n.nspname = ?"
    + " AND ct.relname = ?"
    + " ) result"
    + " where "
    + " result.A_ATTNUM = (result.KEYS).x "
    + " ORDER BY result.table_name, result.pk_name, result.key_seq"
)

JDBC_QUERIES = [
    Q("jdbc", "connect-extra-float-digits", "ConnectionFactoryImpl.runInitialQueries",
      "SET extra_float_digits = 3"),
    Q("jdbc", "connect-application-name", "ConnectionFactoryImpl.runInitialQueries",
      "SET application_name = 'PostgreSQL JDBC Driver'"),
    Q("jdbc", "get-isolation", "PgConnection.getTransactionIsolation",
      "SHOW TRANSACTION ISOLATION LEVEL", check=rows(n=1)),
    Q("jdbc", "set-isolation", "PgConnection.setTransactionIsolation (Metabase: READ UNCOMMITTED)",
      "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ UNCOMMITTED"),
    Q("jdbc", "getSchemas", "PgDatabaseMetaData.getSchemas", PGJDBC_GET_SCHEMAS,
      check=values("TABLE_SCHEM", "default", "ops")),
    Q("jdbc", "getTables", "PgDatabaseMetaData.getTables", PGJDBC_GET_TABLES,
      [("default", VARCHAR), ("%", VARCHAR)],
      check=all_of(pairs("TABLE_NAME", "TABLE_TYPE", ("sales", "TABLE")),
                   values("TABLE_SCHEM", "default"))),
    Q("jdbc", "getColumns", "PgDatabaseMetaData.getColumns", PGJDBC_GET_COLUMNS,
      [("default", VARCHAR), ("sales", VARCHAR)], check=values("attname", *SALES_COLUMNS)),
    # Topics have no primary key: no rows, as PostgreSQL answers for a table without one.
    Q("jdbc", "getPrimaryKeys", "PgDatabaseMetaData.getPrimaryKeys", PGJDBC_GET_PRIMARY_KEYS,
      [("default", VARCHAR), ("sales", VARCHAR)], check=rows(n=0)),
]


# ---------------------------------------------------------------------------------------------
# Metabase's PostgreSQL driver: metabase/metabase@008fd6675457cdd62da2265628bed3b725a607ea
# src/metabase/driver/postgres.clj (the HoneySQL forms are rendered as HoneySQL 2 renders them
# with quoting on: quoted identifiers, `[:inline …]` as literals, every other value a `?`
# parameter, which pgjdbc sends as `$n`; the same rendering is seen on the wire in
# datafusion-contrib/datafusion-postgres@4c18f5ad6334effead3b56c787f9b47899959acd
# datafusion-postgres/tests/metabase.rs, captured from Metabase v0.55.1 with the values inlined).
# Metabase also runs pgjdbc's getSchemas (syncable schemas), getColumns and getPrimaryKeys, and
# the isolation-level statements above, all under "jdbc".
# ---------------------------------------------------------------------------------------------

# sql-jdbc/connection.clj can-connect? (metabase/metabase@961d8c7fd45642f26d5fae500282ee66be53ed15)
METABASE_CAN_CONNECT = "SELECT 1"

# postgres.clj driver/db-default-timezone
METABASE_TIMEZONE = "show timezone;"

# postgres.clj sql-jdbc.sync/current-user-table-privileges (str/join "\n" …)
METABASE_TABLE_PRIVILEGES = "\n".join([
    "with table_privileges as (",
    " select",
    "   NULL as role,",
    "   t.schemaname as schema,",
    "   t.objectname as table,",
    "   pg_catalog.has_any_column_privilege(current_user, '\"' || replace(t.schemaname, '\"', '\"\"') || '\"' || '.' || '\"' || replace(t.objectname, '\"', '\"\"') || '\"',  'update') as update,",
    "   pg_catalog.has_any_column_privilege(current_user, '\"' || replace(t.schemaname, '\"', '\"\"') || '\"' || '.' || '\"' || replace(t.objectname, '\"', '\"\"') || '\"',  'select') as select,",
    "   pg_catalog.has_any_column_privilege(current_user, '\"' || replace(t.schemaname, '\"', '\"\"') || '\"' || '.' || '\"' || replace(t.objectname, '\"', '\"\"') || '\"',  'insert') as insert,",
    "   pg_catalog.has_table_privilege(     current_user, '\"' || replace(t.schemaname, '\"', '\"\"') || '\"' || '.' || '\"' || replace(t.objectname, '\"', '\"\"') || '\"',  'delete') as delete",
    " from (",
    "   select schemaname, tablename as objectname from pg_catalog.pg_tables",
    "   union",
    "   select schemaname, viewname as objectname from pg_catalog.pg_views",
    "   union",
    "   select schemaname, matviewname as objectname from pg_catalog.pg_matviews",
    " ) t",
    " where t.schemaname !~ '^pg_'",
    "   and t.schemaname <> 'information_schema'",
    "   and pg_catalog.has_schema_privilege(current_user, t.schemaname, 'usage')",
    ")",
    "select t.*",
    "from table_privileges t",
])


def _selectable(result):
    got = {(_text(s), _text(t)) for s, t, sel in zip(_column(result, "schema"),
                                                     _column(result, "table"),
                                                     _column(result, "select")) if sel}
    for w in [("default", "sales"), ("ops", "audit_log")]:
        assert w in got, f"{w!r} not selectable (Metabase skips it): {sorted(got)[:40]}"


# postgres.clj get-tables-sql (describe-database*, for the syncable schemas "default" and "ops")
METABASE_GET_TABLES = (
    'SELECT "n"."nspname" AS "schema", "c"."relname" AS "name", CASE "c"."relkind" '
    "WHEN 'r' THEN 'TABLE' WHEN 'p' THEN 'PARTITIONED TABLE' WHEN 'v' THEN 'VIEW' "
    "WHEN 'f' THEN 'FOREIGN TABLE' WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE NULL END AS \"type\", "
    '"d"."description" AS "description", "stat"."n_live_tup" AS "estimated_row_count" '
    'FROM "pg_catalog"."pg_class" AS "c" '
    'INNER JOIN "pg_catalog"."pg_namespace" AS "n" ON "c"."relnamespace" = "n"."oid" '
    'LEFT JOIN "pg_catalog"."pg_description" AS "d" ON ("c"."oid" = "d"."objoid") '
    'AND ("d"."objsubid" = $1) AND ("d"."classoid" = \'pg_class\'::regclass) '
    'LEFT JOIN "pg_stat_user_tables" AS "stat" ON ("n"."nspname" = "stat"."schemaname") '
    'AND ("c"."relname" = "stat"."relname") '
    'WHERE ("c"."relnamespace" = "n"."oid") AND ("n"."nspname" !~ $2) '
    'AND ("n"."nspname" <> $3) AND c.relkind in (\'r\', \'p\', \'v\', \'f\', \'m\') '
    'AND ("n"."nspname" IN ($4, $5)) ORDER BY "type" ASC, "schema" ASC, "name" ASC'
)

# postgres.clj enum-types (describe-fields-pre-process-xf)
METABASE_ENUM_TYPES = ("SELECT nspname, typname "
                       "FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
                       "WHERE t.oid IN (SELECT DISTINCT enumtypid FROM pg_enum e)")

# postgres.clj sql-jdbc.sync/describe-fields-sql (schema-names "default" and "ops")
METABASE_DESCRIBE_FIELDS = (
    'SELECT "c"."column_name" AS "name", '
    "CASE WHEN \"c\".\"udt_schema\" IN ('public', 'pg_catalog') THEN FORMAT('%s', \"c\".\"udt_name\") "
    "ELSE FORMAT('\"%s\".\"%s\"', \"c\".\"udt_schema\", \"c\".\"udt_name\") END AS \"database-type\", "
    '"c"."ordinal_position" - 1 AS "database-position", "c"."table_schema" AS "table-schema", '
    '"c"."table_name" AS "table-name", "pk"."column_name" IS NOT NULL AS "pk?", '
    "COL_DESCRIPTION(CAST(CAST(FORMAT('%I.%I', CAST(\"c\".\"table_schema\" AS TEXT), "
    'CAST("c"."table_name" AS TEXT)) AS REGCLASS) AS OID), "c"."ordinal_position") AS "field-comment", '
    "((\"column_default\" IS NULL) OR (LOWER(\"column_default\") = 'null')) AND (\"is_nullable\" = 'NO') "
    "AND NOT (((\"column_default\" IS NOT NULL) AND (\"column_default\" LIKE '%nextval(%')) "
    "OR (\"is_identity\" <> 'NO')) AS \"database-required\", "
    "((\"column_default\" IS NOT NULL) AND (\"column_default\" LIKE '%nextval(%')) "
    "OR (\"is_identity\" <> 'NO') AS \"database-is-auto-increment\" "
    'FROM "information_schema"."columns" AS "c" '
    'LEFT JOIN (SELECT "tc"."table_schema", "tc"."table_name", "kc"."column_name" '
    'FROM "information_schema"."table_constraints" AS "tc" '
    'INNER JOIN "information_schema"."key_column_usage" AS "kc" '
    'ON ("tc"."constraint_name" = "kc"."constraint_name") AND ("tc"."table_schema" = "kc"."table_schema") '
    'AND ("tc"."table_name" = "kc"."table_name") '
    "WHERE \"tc\".\"constraint_type\" = 'PRIMARY KEY') AS \"pk\" "
    'ON ("c"."table_schema" = "pk"."table_schema") AND ("c"."table_name" = "pk"."table_name") '
    'AND ("c"."column_name" = "pk"."column_name") '
    "WHERE c.table_schema !~ '^information_schema|catalog_history|pg_' "
    'AND ("c"."table_schema" IN ($1, $2)) '
    'UNION ALL SELECT "pa"."attname" AS "name", '
    "CASE WHEN \"ptn\".\"nspname\" IN ('public', 'pg_catalog') THEN FORMAT('%s', \"pt\".\"typname\") "
    "ELSE FORMAT('\"%s\".\"%s\"', \"ptn\".\"nspname\", \"pt\".\"typname\") END AS \"database-type\", "
    '"pa"."attnum" - 1 AS "database-position", "pn"."nspname" AS "table-schema", '
    '"pc"."relname" AS "table-name", FALSE AS "pk?", NULL AS "field-comment", '
    'FALSE AS "database-required", FALSE AS "database-is-auto-increment" '
    'FROM "pg_catalog"."pg_class" AS "pc" '
    'INNER JOIN "pg_catalog"."pg_namespace" AS "pn" ON "pn"."oid" = "pc"."relnamespace" '
    'INNER JOIN "pg_catalog"."pg_attribute" AS "pa" ON "pa"."attrelid" = "pc"."oid" '
    'INNER JOIN "pg_catalog"."pg_type" AS "pt" ON "pt"."oid" = "pa"."atttypid" '
    'INNER JOIN "pg_catalog"."pg_namespace" AS "ptn" ON "ptn"."oid" = "pt"."typnamespace" '
    "WHERE (\"pc\".\"relkind\" = 'm') AND (\"pa\".\"attnum\" >= 1) "
    'AND ("pn"."nspname" IN ($3, $4)) '
    'ORDER BY "table-schema" ASC, "table-name" ASC, "database-position" ASC'
)

METABASE_QUERIES = [
    Q("metabase", "can-connect", "sql_jdbc/connection.clj can-connect?", METABASE_CAN_CONNECT,
      check=first_value(lambda v: int(v) == 1, "1")),
    Q("metabase", "timezone", "postgres.clj db-default-timezone", METABASE_TIMEZONE,
      check=rows(n=1)),
    Q("metabase", "table-privileges", "postgres.clj current-user-table-privileges",
      METABASE_TABLE_PRIVILEGES, check=_selectable),
    Q("metabase", "tables", "postgres.clj get-tables-sql", METABASE_GET_TABLES,
      [(0, INT8), ("^pg_", VARCHAR), ("information_schema", VARCHAR), ("default", VARCHAR),
       ("ops", VARCHAR)],
      check=all_of(pairs("schema", "name", ("default", "sales"), ("ops", "audit_log")),
                   pairs("name", "type", ("sales", "TABLE")))),
    Q("metabase", "enum-types", "postgres.clj enum-types", METABASE_ENUM_TYPES),
    Q("metabase", "fields", "postgres.clj describe-fields-sql", METABASE_DESCRIBE_FIELDS,
      [("default", VARCHAR), ("ops", VARCHAR), ("default", VARCHAR), ("ops", VARCHAR)],
      check=pairs("table-name", "name", *[("sales", c) for c in SALES_COLUMNS],
                  *[("audit_log", c) for c in AUDIT_COLUMNS])),
]


# ---------------------------------------------------------------------------------------------
# DBeaver's PostgreSQL plugin: dbeaver/dbeaver@2428359b748778a5a345432906ab3da69289c20c
# (24.2.3+21), plugins/org.jkiss.dbeaver.ext.postgresql/src/org/jkiss/dbeaver/ext/postgresql/.
# DBeaver connects through pgjdbc (see "jdbc"), prepares every statement (`?` → `$n`,
# setString → varchar, setLong → int8), and on connect reads: the server version, whether
# pg_enum and pg_class.reltype exist, the data types, the database row, the current schema and
# user, search_path and standard_conforming_strings; then the schemas of the database, the
# tables of a schema (by its oid) and the columns of a table (by its oid).
# ---------------------------------------------------------------------------------------------

# model/PostgreDataTypeCache / PostgreDatabase.cacheDataTypes (server >= 10, default settings)
DBEAVER_DATA_TYPES = (
    "SELECT t.oid,t.*,c.relkind,format_type(nullif(t.typbasetype, 0), t.typtypmod) as base_type_name, d.description"
    "\nFROM pg_catalog.pg_type t"
    "\nLEFT OUTER JOIN pg_catalog.pg_type et ON et.oid=t.typelem "
    "\nLEFT OUTER JOIN pg_catalog.pg_class c ON c.oid=t.typrelid"
    "\nLEFT OUTER JOIN pg_catalog.pg_description d ON t.oid=d.objoid"
    "\nWHERE t.typname IS NOT NULL"
    "\nAND (c.relkind IS NULL OR c.relkind = 'c') AND (et.typcategory IS NULL OR et.typcategory <> 'C')"
)

# model/PostgreDatabase.SchemaCache.prepareLookupStatement (no schema filter)
DBEAVER_SCHEMAS = (
    "SELECT n.oid,n.*,d.description FROM pg_catalog.pg_namespace n\n"
    "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=n.oid AND d.objsubid=0 AND d.classoid='pg_namespace'::regclass\n"
    " ORDER BY nspname"
)

# model/PostgreSchema.TableCache.prepareLookupStatement (server >= 10, all tables of a schema)
DBEAVER_TABLES = _jdbc(
    "SELECT c.oid,c.*,d.description"
    ",pg_catalog.pg_get_expr(c.relpartbound, c.oid) as partition_expr,  pg_catalog.pg_get_partkeydef(c.oid) as partition_key "
    "\nFROM pg_catalog.pg_class c\n"
    "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=c.oid AND d.objsubid=0 AND d.classoid='pg_class'::regclass\n"
    "WHERE c.relnamespace=? AND c.relkind not in ('i','I','c')"
)

# model/PostgreSchema.TableCache.prepareChildrenStatement (columns of one table; sequences on)
DBEAVER_COLUMNS = _jdbc(
    "SELECT c.relname,a.*,pg_catalog.pg_get_expr(ad.adbin, ad.adrelid, true) as def_value,dsc.description"
    + ",dep.objid"
    + "\nFROM pg_catalog.pg_attribute a"
    + "\nINNER JOIN pg_catalog.pg_class c ON (a.attrelid=c.oid)"
    + "\nLEFT OUTER JOIN pg_catalog.pg_attrdef ad ON (a.attrelid=ad.adrelid AND a.attnum = ad.adnum)"
    + "\nLEFT OUTER JOIN pg_catalog.pg_description dsc ON (c.oid=dsc.objoid AND a.attnum = dsc.objsubid)"
    + "\nLEFT OUTER JOIN pg_depend dep on dep.refobjid = a.attrelid AND dep.deptype = 'i' "
    + "and dep.refobjsubid = a.attnum and dep.classid = dep.refclassid"
    + "\nWHERE NOT a.attisdropped AND c.relkind not in ('i','I','c')"
    + " AND c.oid=?"
    + "\nORDER BY a.attnum"
)

DBEAVER_QUERIES = [
    Q("dbeaver", "version", "model/PostgreDataSource.initialize", "SELECT version()",
      check=rows(n=1)),
    # PostgreUtils.getQueryForSystemColumnChecking via isMetaObjectExists
    Q("dbeaver", "probe-pg_enum", "PostgreDataSource.initialize → PostgreUtils.isMetaObjectExists",
      "SELECT * FROM pg_catalog.pg_enum WHERE 1<>1 LIMIT 1"),
    Q("dbeaver", "probe-reltype", "PostgreDataSource.initialize → PostgreUtils.isMetaObjectExists",
      "SELECT reltype FROM pg_catalog.pg_class WHERE 1<>1 LIMIT 1"),
    Q("dbeaver", "data-types", "model/PostgreDatabase.cacheDataTypes", DBEAVER_DATA_TYPES,
      check=all_of(rows(at_least=1), values("typname", "int8", "text", "timestamptz"))),
    Q("dbeaver", "database", "model/PostgreDatabase.readDatabaseInfo",
      _jdbc("SELECT db.oid,db.* FROM pg_catalog.pg_database db WHERE datname=?"),
      [(DATABASE, VARCHAR)]),
    Q("dbeaver", "current-schema", "model/PostgreExecutionContext.refreshDefaults",
      "SELECT current_schema(),session_user",
      check=first_value(lambda v: v == "default", "'default' (the session's default schema)")),
    Q("dbeaver", "search-path", "model/PostgreExecutionContext.refreshDefaults",
      "SHOW search_path", check=rows(n=1)),
    Q("dbeaver", "setting", "model/PostgreDataSource.SettingCache (standard_conforming_strings)",
      _jdbc("select * from pg_catalog.pg_settings where name=?"),
      [("standard_conforming_strings", VARCHAR)], check=values("setting", "on")),
    Q("dbeaver", "schemas", "model/PostgreDatabase.SchemaCache", DBEAVER_SCHEMAS,
      check=all_of(values("nspname", "default", "ops"), values("oid"))),
    Q("dbeaver", "tables", "model/PostgreSchema.TableCache (schema default)", DBEAVER_TABLES,
      [(lambda target: target.namespace_oid("default"), INT8)],
      check=pairs("relname", "relkind", ("sales", "r"))),
    Q("dbeaver", "tables-ops", "model/PostgreSchema.TableCache (schema ops)", DBEAVER_TABLES,
      [(lambda target: target.namespace_oid("ops"), INT8)],
      check=pairs("relname", "relkind", ("audit_log", "r"))),
    Q("dbeaver", "columns", "model/PostgreSchema.TableCache children (table sales)", DBEAVER_COLUMNS,
      [(lambda target: target.oid("sales"), INT8)], check=values("attname", *SALES_COLUMNS)),
]

TOOL_QUERIES = PSQL_QUERIES + GRAFANA_QUERIES + JDBC_QUERIES + METABASE_QUERIES + DBEAVER_QUERIES


# ---------------------------------------------------------------------------------------------
# The server under test
# ---------------------------------------------------------------------------------------------

class Target:
    def __init__(self, host, port, label):
        self.host, self.port, self.label = host, port, label
        self.user = "postgres"
        self._oids = {}

    def simple(self):
        conn = psycopg2.connect(host=self.host, port=self.port, user=self.user, dbname=DATABASE,
                                connect_timeout=10)
        conn.autocommit = True
        return conn

    def extended(self):
        return pg8000.native.Connection(self.user, host=self.host, port=self.port,
                                        database=DATABASE, timeout=30)

    def _lookup(self, sql):
        # The oid a tool found with its own listing query; 0 (nothing) when it cannot be had.
        if sql not in self._oids:
            try:
                conn = self.simple()
                try:
                    cur = conn.cursor()
                    cur.execute(sql)
                    row = cur.fetchone()
                    self._oids[sql] = int(row[0]) if row else 0
                finally:
                    conn.close()
            except (psycopg2.Error, ValueError, TypeError):
                self._oids[sql] = 0
        return self._oids[sql]

    def oid(self, relname):
        return self._lookup(f"SELECT c.oid FROM pg_catalog.pg_class c WHERE c.relname = '{relname}'")

    def namespace_oid(self, nspname):
        return self._lookup(
            f"SELECT n.oid FROM pg_catalog.pg_namespace n WHERE n.nspname = '{nspname}'")


def _produce(svc):
    from pulsar.schema import Integer, JsonSchema, Record, String

    class Sale(Record):
        amount = Integer()
        region = String()

    client = pulsar.Client(svc.url)
    try:
        producer = client.create_producer("persistent://public/default/sales",
                                          schema=JsonSchema(Sale))
        for i in range(SALES):
            producer.send(Sale(amount=i, region=["eu", "us"][i % 2]))
        producer.close()
        producer = client.create_producer("persistent://public/ops/audit_log")
        for i in range(AUDIT):
            producer.send(f"event {i}".encode(), partition_key=f"user-{i}")
        producer.close()
    finally:
        client.close()


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    reference = os.environ.get("LL_SQL_TOOLS_REFERENCE_PG")
    if reference:
        host, port = reference.rsplit(":", 1)
        yield Target(host, int(port), "PostgreSQL")
        return
    from conftest import Service, _binary
    svc = Service(_binary(), str(tmp_path_factory.mktemp("sql-tools")))
    svc.start()
    try:
        svc.create_namespace("public/ops")
        _produce(svc)
        t = Target("127.0.0.1", svc.pg_port, "ledgerlake")

        def visible():
            conn = t.simple()
            try:
                cur = conn.cursor()
                cur.execute('SELECT count(*) FROM sales')
                assert cur.fetchone()[0] == SALES
                cur.execute('SELECT count(*) FROM ops.audit_log')
                assert cur.fetchone()[0] == AUDIT
            finally:
                conn.close()
        eventually(visible, timeout=30)
        yield t
    finally:
        svc.stop()


def _inline(sql, params):
    """The simple-protocol form of a parameterised statement: each `$n` becomes its value as a
    literal (what pgjdbc's preferQueryMode=simple does)."""
    for n in range(len(params), 0, -1):
        v = params[n - 1]
        lit = str(v) if isinstance(v, int) else "'" + str(v).replace("'", "''") + "'"
        sql = sql.replace(f"${n}", lit)
    return sql


def _pg8000_message(e):
    info = e.args[0] if e.args and isinstance(e.args[0], dict) else None
    if info is None:
        return str(e)
    return f"{info.get('S', 'ERROR')}: {info.get('M', '')} (SQLSTATE {info.get('C', '?')})"


def run_simple(target, sql, params=()):
    """(columns, rows) through psycopg2's simple Query, or the server's error text."""
    conn = target.simple()
    try:
        cur = conn.cursor()
        try:
            cur.execute(_inline(sql, list(params)))
        except psycopg2.ProgrammingError as e:
            # The server answered EmptyQueryResponse (a comment-only or empty statement).
            if e.pgcode is None and "empty query" in str(e):
                return [], []
            raise
        if cur.description is None:
            return [], []
        return [d.name for d in cur.description], cur.fetchall()
    finally:
        conn.close()


def run_extended(target, sql, params=()):
    """(columns, rows) through pg8000's Parse/Bind/Describe/Execute with typed parameters."""
    conn = target.extended()
    try:
        ctx = conn.execute_unnamed(sql, vals=[v for v, _ in params],
                                   oids=[oid for _, oid in params])
        cols = [c["name"] for c in ctx.columns] if ctx.columns else []
        return cols, ctx.rows or []
    finally:
        conn.close()


def _run(target, protocol, sql, params, source=""):
    """Runs `sql`; a refusal fails the test with the server's own error text."""
    try:
        if protocol == "simple":
            return run_simple(target, sql, [v for v, _ in params])
        return run_extended(target, sql, params)
    except psycopg2.Error as e:
        msg = (e.pgerror or str(e)).strip() or \
            f"{type(e).__name__} without a server error (libpq got no result for the statement)"
    except pg8000.exceptions.DatabaseError as e:
        msg = _pg8000_message(e)
    where = f" ({source})" if source else ""
    pytest.fail(f"{target.label} refused it{where}: {msg}", pytrace=False)


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------

PSQL_META = [
    # (meta-command, patterns its output must match)
    ("\\dt", [r"^\s*default\s*\|\s*sales\s*\|\s*table\s*\|"]),
    ("\\dt ops.*", [r"^\s*ops\s*\|\s*audit_log\s*\|\s*table\s*\|"]),
    ("\\d sales", [r'Table "default\.sales"'] + [rf"^\s*{c}\s*\|" for c in SALES_COLUMNS]),
    ("\\d ops.audit_log", [r'Table "ops\.audit_log"'] + [rf"^\s*{c}\s*\|" for c in AUDIT_COLUMNS]),
    ("\\dn", [r"^\s*default\s*\|", r"^\s*ops\s*\|"]),
    ("\\l", [r"List of databases"]),
]


@pytest.mark.parametrize("command,patterns", PSQL_META, ids=[c for c, _ in PSQL_META])
def test_psql_meta_command(target, command, patterns):
    env = dict(os.environ, PGCONNECT_TIMEOUT="10")
    env.pop("PGPASSWORD", None)
    r = subprocess.run(["psql", "-h", target.host, "-p", str(target.port), "-U", target.user,
                        "-d", DATABASE, "-X", "-E", "-P", "pager=off", "-v", "ON_ERROR_STOP=1",
                        "-w", "-c", command],
                       capture_output=True, text=True, env=env, timeout=60)
    if r.returncode != 0:
        errors = " / ".join(l for l in r.stderr.splitlines() if l.strip())
        pytest.fail(f"psql {command}: {target.label} refused it: {errors}", pytrace=False)
    for p in patterns:
        assert re.search(p, r.stdout, re.M), f"no match for {p!r} in:\n{r.stdout[-3000:]}"


# Not working yet (strict: the test fails once they work, to be unmarked): none today.
NOT_YET = {}


def _tool_params():
    return [pytest.param(q, id=q.id, marks=pytest.mark.xfail(strict=True, reason=NOT_YET[q.id]))
            if q.id in NOT_YET else pytest.param(q, id=q.id) for q in TOOL_QUERIES]


@pytest.mark.parametrize("protocol", ["simple", "extended"])
@pytest.mark.parametrize("query", _tool_params())
def test_tool_query(target, query, protocol):
    sql = query.sql(target) if callable(query.sql) else query.sql
    params = [(v(target) if callable(v) else v, oid) for v, oid in query.params]
    result = _run(target, protocol, sql, params, query.source)
    if query.check:
        query.check(result)


@pytest.mark.parametrize("protocol", ["simple", "extended"])
def test_pg_expandarray_rows_and_composite_fields(target, protocol):
    """pgjdbc's helper as PostgreSQL answers it: a row per element with its position, two
    calls in one select list in step, fields read as `(row).field`."""
    sql = ("SELECT (information_schema._pg_expandarray(ARRAY[10, 20, 30])).x AS x, "
           "(information_schema._pg_expandarray(ARRAY[10, 20, 30])).n AS n ORDER BY n")
    _, got = _run(target, protocol, sql, [])
    assert [(int(x), int(n)) for x, n in got] == [(10, 1), (20, 2), (30, 3)]


def _rfc3339(t):
    # Grafana formats $__timeFrom/$__timeTo with Go's time.RFC3339Nano in UTC.
    return t.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _time_series_queries():
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    time_filter = (f"publish_time BETWEEN '{_rfc3339(now - datetime.timedelta(hours=6))}' "
                   f"AND '{_rfc3339(now + datetime.timedelta(hours=1))}'")
    return {
        # A panel's SQL with `$__timeGroupAlias(publish_time, '1m')` and
        # `$__timeFilter(publish_time)` as Grafana expands them without TimescaleDB
        # (grafana/grafana@02ab314b81e2adc656bd7d08cc0533304a0037ff
        # pkg/tsdb/grafana-postgresql-datasource/macros.go: floor(extract(epoch from …)/60)*60).
        "grafana-macros": "SELECT floor(extract(epoch from publish_time)/60)*60 AS \"time\", "
                          f"count(*) AS \"value\" FROM sales WHERE {time_filter} "
                          "GROUP BY 1 ORDER BY 1",
        # The same panel written with date_trunc, and with date_bin, on a typed column too.
        "date_trunc": "SELECT date_trunc('minute', publish_time) AS \"time\", count(*) AS \"value\", "
                      f"sum(amount) AS amount FROM sales WHERE {time_filter} GROUP BY 1 ORDER BY 1",
        "date_bin": "SELECT date_bin(INTERVAL '1 minute', publish_time, "
                    "TIMESTAMPTZ '2000-01-01 00:00:00+00') AS \"time\", count(*) AS \"value\" "
                    f"FROM sales WHERE {time_filter} GROUP BY 1 ORDER BY 1",
        "schema-qualified": "SELECT date_trunc('minute', publish_time) AS \"time\", count(*) AS \"value\" "
                            f"FROM ops.audit_log WHERE {time_filter} GROUP BY 1 ORDER BY 1",
    }


TIME_SERIES = ["grafana-macros", "date_trunc", "date_bin", "schema-qualified"]


@pytest.mark.parametrize("protocol", ["simple", "extended"])
@pytest.mark.parametrize("variant", TIME_SERIES)
def test_grafana_time_series(target, variant, protocol):
    """A Grafana time-series panel over a topic: one row per minute, time ascending."""
    cols, result = _run(target, protocol, _time_series_queries()[variant], [])
    assert [c.lower() for c in cols[:2]] == ["time", "value"], cols
    assert result, "no rows"
    times = [r[0] for r in result]
    assert times == sorted(times), times
    if variant == "grafana-macros":
        assert all(float(t) % 60 == 0 for t in times), times
    else:
        assert all(isinstance(t, datetime.datetime) and t.second == 0 and t.microsecond == 0
                   for t in times), times
    expected = AUDIT if variant == "schema-qualified" else SALES
    assert sum(int(r[1]) for r in result) == expected, result
    if variant == "date_trunc":
        assert sum(int(r[2]) for r in result) == sum(range(SALES)), result
