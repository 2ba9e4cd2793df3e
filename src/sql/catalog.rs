//! Topics as DataFusion catalogs: tenant → catalog, namespace → schema, topic → table, so a
//! topic is `<tenant>.<namespace>.<topic>` (the session defaults to `public.default`, so a
//! topic of the default namespace is just `<topic>`). Quote names that are not plain lowercase
//! identifiers: `public.default."orders-v2"`.
//!
//! Besides the topic itself, a schema resolves:
//! - `"<topic>@<snapshot id>"` and `"<topic>@<RFC 3339 time>"`: the lake table as of that
//!   snapshot (the newest snapshot committed at or before that time), lake only;
//! - `"<topic>$snapshots"`: the table's snapshots (id, parent, time, operation, summary);
//!   `"<topic>$history"`, `"<topic>$files"` and `"<topic>$partitions"`
//!   ([`super::metadata_tables`]).
//!
//! Invariants: the listing is taken once per session (one per request) and holds only the
//! topics the session's principal may read, so another tenant's topic is "not found or not
//! authorized" wherever it is named (queries, `SHOW TABLES`, `information_schema`); tables are
//! opened, and their seams pinned, when the planner resolves them. A session whose statements
//! name their tables ([`Scope::Tables`]) lists only those, by name prefix, so a query's cost
//! does not grow with the number of topics stored; one that reads the catalogs themselves
//! (`information_schema`, `pg_catalog`, `SHOW`) lists every topic ([`Scope::All`]).

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{CatalogProvider, CatalogProviderList, SchemaProvider};
use datafusion::common::{DataFusionError, Result as DFResult};
use datafusion::datasource::{MemTable, TableProvider, TableType};
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::resolve::resolve_table_references;
use futures::TryStreamExt;
use iceberg::table::Table;

use super::lake_scan::LakeSide;
use super::table::TopicTable;
use super::table_cache::TableCache;
use super::tail::{TailLedger, TailPart, TailSource};
use super::SqlError;
use crate::auth::{Access, Action, Principal, Resource};
use crate::lake::commit::{read_watermark, watermark_key};
use crate::lake::typed::PayloadCodec;
use crate::lake::LakeHandle;
use crate::lake::{naming, schema as lake_schema, typed};
use crate::ledger::metadata::{MetadataError, TopicRecord};
use crate::ledger::Log;
use crate::naming::{NamespaceName, TopicName};
use crate::replay::Replay;
use crate::schema as topic_schema;

/// What opening a table needs.
#[derive(Debug, Clone)]
pub struct Shared {
    /// The log (tail and listing).
    pub log: Arc<Log>,
    /// The lake (`None` when disabled).
    pub lake: Option<LakeHandle>,
    /// Reads by position for the tail (`None` when the lake is disabled).
    pub replay: Option<Replay>,
    /// Lake table handles kept between queries.
    pub(crate) tables: Arc<TableCache>,
}

/// tenant → namespace → topic names (base names of partitioned topics).
pub(crate) type Listing = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// Which topics a session lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Every topic (the statements read the catalogs, or name tables in a way not resolved
    /// here).
    All,
    /// Only these tables: (tenant, namespace, table name as the statement gives it, any
    /// `@…`/`$…` suffix included).
    Tables(BTreeSet<(String, String, String)>),
}

impl Scope {
    /// The tables `statements` name, resolved against the session's default catalog and
    /// schema ([`DEFAULT_CATALOG`]`.default`); [`Scope::All`] when one reads `information_schema`
    /// (`SHOW` reads it) or the schema every catalog resolves besides its namespaces
    /// (`extra_schema`: `pg_catalog`), or cannot be resolved.
    pub(crate) fn of(statements: &[DFStatement], extra_schema: &str) -> Scope {
        let mut tables = BTreeSet::new();
        for statement in statements {
            let Ok((refs, _ctes)) = resolve_table_references(statement, true) else {
                return Scope::All;
            };
            for r in refs {
                let r = r.resolve(DEFAULT_CATALOG, "default");
                if r.schema.as_ref() == "information_schema" || r.schema.as_ref() == extra_schema {
                    return Scope::All;
                }
                tables.insert((
                    r.catalog.to_string(),
                    r.schema.to_string(),
                    r.table.to_string(),
                ));
            }
        }
        Scope::Tables(tables)
    }
}

/// The topic records `scope` asks for: every topic, or those of each named table (a topic and
/// its partitions share its name as their prefix; names that merely start like it are left
/// out by the caller's parse).
async fn scoped_topics(log: &Log, scope: &Scope) -> Result<Vec<TopicRecord>, MetadataError> {
    let meta = log.metadata();
    let Scope::Tables(tables) = scope else {
        return meta.list_topics().await;
    };
    let mut out = Vec::new();
    for (tenant, namespace, table) in tables {
        let Ok((local, _)) = parse_table_name(table) else {
            continue; // the planner reports the name
        };
        for domain in ["persistent", "non-persistent"] {
            let prefix = format!("{domain}://{tenant}/{namespace}/{local}");
            out.extend(
                meta.list_topics_under(&prefix)
                    .await?
                    .into_iter()
                    .filter(|t| {
                        t.name
                            .parse::<TopicName>()
                            .is_ok_and(|n| n.base().local == local)
                    }),
            );
        }
    }
    Ok(out)
}

/// The catalogs of one session.
#[derive(Debug)]
pub struct TopicCatalogList {
    shared: Shared,
    listing: Arc<Listing>,
    /// A schema every catalog resolves besides its namespaces (`pg_catalog`, over the same
    /// listing), by name.
    extra: (&'static str, Arc<dyn SchemaProvider>),
}

/// Builds the schema every catalog resolves besides its namespaces, from the session's listing:
/// its name and constructor (the `pg_catalog` of `super::pg_catalog`, given by the engine).
pub(crate) type ExtraSchema = (
    &'static str,
    fn(Shared, Arc<Listing>) -> DFResult<Arc<dyn SchemaProvider>>,
);

impl TopicCatalogList {
    /// Lists the topics in `scope` existing now that `principal` may read (`consume`, asked
    /// as [`Action::Query`]); the others are neither listed nor resolvable.
    pub(crate) async fn load(
        shared: Shared,
        access: &Access,
        principal: &Principal,
        extra: ExtraSchema,
        scope: &Scope,
    ) -> Result<TopicCatalogList, SqlError> {
        let mut listing = Listing::new();
        let mut asked: std::collections::HashMap<TopicName, bool> = Default::default();
        let topics = scoped_topics(&shared.log, scope)
            .await
            .map_err(|e| SqlError::Execution(format!("listing topics: {e}")))?;
        for t in topics {
            let Ok(name) = t.name.parse::<TopicName>() else {
                continue;
            };
            let base = name.base();
            let visible = match asked.get(&base) {
                Some(v) => *v,
                None => {
                    let resource = Resource::Topic(base.clone());
                    let v = access.permits(principal, Action::Query, &resource).await;
                    asked.insert(base.clone(), v);
                    v
                }
            };
            if !visible {
                continue;
            }
            listing
                .entry(base.namespace.tenant.clone())
                .or_default()
                .entry(base.namespace.name.clone())
                .or_default()
                .insert(base.local.clone());
        }
        let listing = Arc::new(listing);
        let (name, build) = extra;
        let provider = build(shared.clone(), listing.clone())
            .map_err(|e| SqlError::Execution(e.to_string()))?;
        Ok(TopicCatalogList {
            shared,
            listing,
            extra: (name, provider),
        })
    }
}

impl CatalogProviderList for TopicCatalogList {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn register_catalog(
        &self,
        _name: String,
        _catalog: Arc<dyn CatalogProvider>,
    ) -> Option<Arc<dyn CatalogProvider>> {
        // Catalogs are the tenants; nothing else can be registered.
        None
    }

    fn catalog_names(&self) -> Vec<String> {
        self.listing.keys().cloned().collect()
    }

    /// A listed tenant, or the session's default catalog (which always resolves, so
    /// `pg_catalog` and `information_schema` do for a principal that reads no topic of it).
    fn catalog(&self, name: &str) -> Option<Arc<dyn CatalogProvider>> {
        (self.listing.contains_key(name) || name == DEFAULT_CATALOG).then(|| {
            Arc::new(TenantCatalog {
                shared: self.shared.clone(),
                listing: self.listing.clone(),
                tenant: name.to_string(),
                extra: self.extra.clone(),
            }) as Arc<dyn CatalogProvider>
        })
    }
}

/// The catalog of unqualified names (the session's default).
pub(crate) const DEFAULT_CATALOG: &str = "public";

#[derive(Debug)]
struct TenantCatalog {
    shared: Shared,
    listing: Arc<Listing>,
    tenant: String,
    extra: (&'static str, Arc<dyn SchemaProvider>),
}

impl CatalogProvider for TenantCatalog {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .listing
            .get(&self.tenant)
            .map(|n| n.keys().cloned().collect())
            .unwrap_or_default();
        names.push(self.extra.0.to_string());
        names
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        if name == self.extra.0 {
            return Some(self.extra.1.clone());
        }
        let topics = self.listing.get(&self.tenant)?.get(name)?.clone();
        Some(Arc::new(NamespaceSchema {
            shared: self.shared.clone(),
            tenant: self.tenant.clone(),
            namespace: name.to_string(),
            topics,
        }))
    }
}

#[derive(Debug)]
struct NamespaceSchema {
    shared: Shared,
    tenant: String,
    namespace: String,
    topics: BTreeSet<String>,
}

/// What a table name asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Wanted {
    /// Lake and tail now.
    Live,
    /// The lake as of a snapshot id.
    Snapshot(i64),
    /// The lake as of a time (ms since the epoch).
    AsOf(i64),
    /// The snapshots metadata table.
    Snapshots,
    /// The history metadata table.
    History,
    /// The current snapshot's files.
    Files,
    /// Rows, files and bytes per partition.
    Partitions,
}

fn parse_table_name(name: &str) -> Result<(&str, Wanted), String> {
    for (suffix, wanted) in [
        ("$snapshots", Wanted::Snapshots),
        ("$history", Wanted::History),
        ("$files", Wanted::Files),
        ("$partitions", Wanted::Partitions),
    ] {
        if let Some(topic) = name.strip_suffix(suffix) {
            return Ok((topic, wanted));
        }
    }
    let Some((topic, at)) = name.rsplit_once('@') else {
        return Ok((name, Wanted::Live));
    };
    if let Ok(id) = at.parse::<i64>() {
        return Ok((topic, Wanted::Snapshot(id)));
    }
    match humantime::parse_rfc3339_weak(at) {
        Ok(t) => {
            let ms = t
                .duration_since(std::time::UNIX_EPOCH)
                .map_err(|_| format!("'{at}' is before 1970"))?
                .as_millis() as i64;
            Ok((topic, Wanted::AsOf(ms)))
        }
        Err(_) => Err(format!(
            "'{name}': after '@' give a snapshot id or an RFC 3339 time (2026-11-30T12:00:00Z)"
        )),
    }
}

#[async_trait]
impl SchemaProvider for NamespaceSchema {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        self.topics.iter().cloned().collect()
    }

    async fn table(&self, name: &str) -> DFResult<Option<Arc<dyn TableProvider>>> {
        let (topic, wanted) = parse_table_name(name).map_err(DataFusionError::Plan)?;
        if !self.topics.contains(topic) {
            return Ok(None);
        }
        let namespace = NamespaceName::new(&self.tenant, &self.namespace)
            .map_err(|e| DataFusionError::Plan(format!("{e}")))?;
        let base = TopicName::persistent(&namespace, topic)
            .map_err(|e| DataFusionError::Plan(format!("{e}")))?;
        let opened = match wanted {
            Wanted::Live => open_live(&self.shared, &base).await,
            other => open_lake_only(&self.shared, &base, other).await,
        };
        opened.map(Some).map_err(|e| match e {
            SqlError::Invalid(m) => DataFusionError::Plan(m),
            other => DataFusionError::External(Box::new(other)),
        })
    }

    /// Without opening the table (listing `information_schema.tables` must not load every
    /// lake table).
    async fn table_type(&self, name: &str) -> DFResult<Option<TableType>> {
        Ok(self.table_exist(name).then_some(TableType::Base))
    }

    fn table_exist(&self, name: &str) -> bool {
        parse_table_name(name).is_ok_and(|(t, _)| self.topics.contains(t))
    }
}

/// Where a topic's rows are in the lake, and that table if it exists.
#[derive(Default)]
struct LakeTableOf {
    /// `None` without a lake.
    at: Option<naming::TopicTable>,
    /// The table, loaded on the lake runtime, as a read-only handle here.
    table: Option<Table>,
}

impl LakeTableOf {
    /// The `topic` column's value of the topic's rows, in a namespace's shared table.
    fn topic(&self) -> Option<&String> {
        self.at.as_ref().and_then(|t| t.topic.as_ref())
    }
}

fn lake_failed(e: crate::lake::LakeError) -> SqlError {
    match e {
        crate::lake::LakeError::Stopped => SqlError::Stopped,
        other => SqlError::Execution(other.to_string()),
    }
}

/// Loads the topic's lake table: its own, or its namespace's shared one.
async fn load_lake_table(shared: &Shared, base: &TopicName) -> Result<LakeTableOf, SqlError> {
    let Some(lake) = &shared.lake else {
        return Ok(LakeTableOf::default());
    };
    let at = lake.table_of(base).await.map_err(lake_failed)?;
    let loaded = lake.load_table_here(&at.ident).await.map_err(lake_failed)?;
    Ok(LakeTableOf {
        at: Some(at),
        table: loaded.map(|t| shared.tables.reuse(t)),
    })
}

/// The query schema of a lake schema: Iceberg's Arrow types, top-level strings as string views
/// (DataFusion's Parquet reader reads them so; grouping, comparing and filtering views is
/// cheaper; the tail converts its `Utf8` to match).
fn iceberg_to_arrow(schema: &iceberg::spec::Schema) -> Result<SchemaRef, SqlError> {
    let converted = iceberg::arrow::schema_to_arrow_schema(schema)
        .map_err(|e| SqlError::Execution(format!("table schema: {e}")))?;
    Ok(super::tail::strings_as(
        &Arc::new(converted),
        &arrow::datatypes::DataType::Utf8,
        arrow::datatypes::DataType::Utf8View,
    ))
}

/// The schema of a topic with no lake table yet: the envelope plus the typed columns its
/// schema asks for, exactly as the offload engine will create them.
fn schema_without_table(
    wanted: &[(String, iceberg::spec::Type)],
) -> Result<iceberg::spec::Schema, SqlError> {
    let envelope = lake_schema::envelope_schema();
    let mut fields: Vec<_> = envelope.as_struct().fields().to_vec();
    let mut next_id = envelope.highest_field_id() + 1;
    for (name, t) in wanted {
        let id = next_id;
        next_id += 1;
        let t = typed::renumber(t, &mut next_id);
        fields.push(Arc::new(iceberg::spec::NestedField::optional(
            id,
            name.clone(),
            t,
        )));
    }
    iceberg::spec::Schema::builder()
        .with_fields(fields)
        .build()
        .map_err(|e| SqlError::Execution(format!("table schema: {e}")))
}

/// The topic partition `partition` of `base` (`base` itself when -1).
fn partition_name(base: &TopicName, partition: i32) -> TopicName {
    match u32::try_from(partition) {
        Ok(p) => base.partition_name(p),
        Err(_) => base.clone(),
    }
}

/// The columns of the topic `tenant/namespace/topic` as a query would see them (the lake
/// table's current schema, or the topic schema's when nothing is offloaded), without reading
/// its tail.
pub(crate) async fn topic_schema(
    shared: &Shared,
    tenant: &str,
    namespace: &str,
    topic: &str,
) -> Result<SchemaRef, SqlError> {
    let namespace =
        NamespaceName::new(tenant, namespace).map_err(|e| SqlError::Invalid(e.to_string()))?;
    let base =
        TopicName::persistent(&namespace, topic).map_err(|e| SqlError::Invalid(e.to_string()))?;
    let table = load_lake_table(shared, &base).await?;
    let codec = codec_of(shared, &base, &table).await?;
    columns_of(&table, codec.as_ref())
}

/// The topic's payload codec and the typed columns it asks for (none in a shared table,
/// which holds the envelope only).
async fn codec_of(
    shared: &Shared,
    base: &TopicName,
    table: &LakeTableOf,
) -> Result<Option<(PayloadCodec, Vec<(String, iceberg::spec::Type)>)>, SqlError> {
    if table.topic().is_some() {
        return Ok(None);
    }
    let versions = topic_schema::versions(&shared.log.metadata(), &base.to_string())
        .await
        .map_err(|e| SqlError::Execution(format!("topic schema: {e}")))?;
    Ok(typed::topic_codec(&base.to_string(), &versions))
}

/// The table's columns: the lake table's current schema, else (nothing offloaded yet) the
/// shared table's schema or the envelope plus the typed columns `codec` asks for.
fn columns_of(
    table: &LakeTableOf,
    codec: Option<&(PayloadCodec, Vec<(String, iceberg::spec::Type)>)>,
) -> Result<SchemaRef, SqlError> {
    match &table.table {
        Some(t) => iceberg_to_arrow(t.metadata().current_schema()),
        None if table.topic().is_some() => iceberg_to_arrow(&lake_schema::shared_schema()),
        None => {
            let wanted = codec.map(|(_, w)| w.as_slice()).unwrap_or(&[]);
            iceberg_to_arrow(&schema_without_table(wanted)?)
        }
    }
}

async fn open_live(shared: &Shared, base: &TopicName) -> Result<Arc<dyn TableProvider>, SqlError> {
    // 1. The lake table: snapshot and watermark from one metadata file.
    let located = load_lake_table(shared, base).await?;
    let codec = codec_of(shared, base, &located).await?;
    let schema = columns_of(&located, codec.as_ref())?;
    let own = located.topic().cloned();
    let watermark = match &located.table {
        Some(t) => read_watermark(t).map_err(|e| SqlError::Execution(e.to_string()))?,
        None => Default::default(),
    };
    let table = located.table;
    // 2. Then the log's end, per partition.
    let logs = shared
        .log
        .partitions_to_read(base)
        .await
        .map_err(|e| SqlError::Execution(format!("listing partitions: {e}")))?;
    let mut parts = Vec::with_capacity(logs.len());
    for (partition, log) in logs {
        let Some(end) = log.last_confirmed() else {
            continue;
        };
        let committed = watermark
            .get(&watermark_key(own.as_deref(), partition))
            .copied();
        let ledgers: Vec<TailLedger> = log
            .ledgers()
            .into_iter()
            .filter(|l| committed.is_none_or(|w| l.id > w) && l.id <= end.ledger)
            .filter_map(|l| {
                let count = if l.id == end.ledger {
                    end.entry + 1
                } else {
                    l.entry_count
                };
                (count > 0).then_some(TailLedger {
                    id: l.id,
                    count,
                    min_publish_ms: l.min_publish_ms,
                    max_publish_ms: l.max_publish_ms,
                })
            })
            .collect();
        if !ledgers.is_empty() {
            let lake = shared
                .replay
                .as_ref()
                .map(|r| r.topic(&partition_name(base, partition)));
            parts.push(TailPart {
                partition,
                log,
                lake,
                ledgers,
            });
        }
    }
    let table_name = format!(
        "{}.{}.{}",
        base.namespace.tenant, base.namespace.name, base.local
    );
    // No tail at all when every partition's ledgers are in the lake: the plan is the lake scan
    // alone, without a union (DataFusion 53 mis-orders some sorts over a union whose children
    // project one column twice, e.g. `SELECT entry_id AS e ... ORDER BY entry_id`).
    let tail = (!parts.is_empty()).then(|| {
        Arc::new(TailSource {
            topic: own.as_deref().map(Arc::from),
            table_name,
            schema: schema.clone(),
            codec: codec.map(|(c, _)| c),
            parts,
        })
    });
    let lake = table.zip(shared.lake.clone()).and_then(|(t, lake)| {
        let snapshot = t.metadata().current_snapshot()?.snapshot_id();
        Some(LakeSide {
            table: t,
            snapshot,
            lake,
            topic: own,
        })
    });
    Ok(Arc::new(TopicTable::new(schema, lake, tail)))
}

async fn open_lake_only(
    shared: &Shared,
    base: &TopicName,
    wanted: Wanted,
) -> Result<Arc<dyn TableProvider>, SqlError> {
    let no_table = || SqlError::Invalid(format!("topic {base} has no lake table yet"));
    let lake = shared.lake.as_ref().ok_or_else(no_table)?;
    let located = load_lake_table(shared, base).await?;
    let own = located.topic().cloned();
    let table = located.table.ok_or_else(no_table)?;
    let snapshot_id = match wanted {
        // A shared table's snapshot summaries name every topic's ranges.
        Wanted::Snapshots if own.is_some() => {
            return Err(SqlError::Invalid(format!(
                "{base} is in a namespace whose topics share one lake table: its $snapshots \
                 would show every topic's commits; use $history"
            )))
        }
        Wanted::Snapshots => {
            let batches: Vec<_> = table
                .inspect()
                .snapshots()
                .scan()
                .await
                .map_err(|e| SqlError::Execution(e.to_string()))?
                .try_collect()
                .await
                .map_err(|e| SqlError::Execution(e.to_string()))?;
            let schema = match batches.first() {
                Some(b) => b.schema(),
                None => iceberg_to_arrow(&table.inspect().snapshots().schema())?,
            };
            let mem = MemTable::try_new(schema, vec![batches])
                .map_err(|e| SqlError::Execution(e.to_string()))?;
            return Ok(Arc::new(mem));
        }
        Wanted::History => return Ok(Arc::new(super::metadata_tables::history(&table)?)),
        Wanted::Files => {
            let files = super::metadata_tables::files(&table, own.as_deref()).await?;
            return Ok(Arc::new(files));
        }
        Wanted::Partitions => {
            let partitions = super::metadata_tables::partitions(&table, own.as_deref()).await?;
            return Ok(Arc::new(partitions));
        }
        Wanted::Snapshot(id) => id,
        Wanted::AsOf(ms) => table
            .metadata()
            .history()
            .iter()
            .filter(|h| h.timestamp_ms <= ms)
            .max_by_key(|h| h.timestamp_ms)
            .map(|h| h.snapshot_id)
            .ok_or_else(|| {
                SqlError::Invalid(format!(
                    "table of {base} has no snapshot at or before {ms} ms"
                ))
            })?,
        Wanted::Live => return open_live(shared, base).await,
    };
    let snapshot = table
        .metadata()
        .snapshot_by_id(snapshot_id)
        .ok_or_else(|| {
            SqlError::Invalid(format!("table of {base} has no snapshot {snapshot_id}"))
        })?;
    let schema = snapshot
        .schema(table.metadata())
        .map_err(|e| SqlError::Execution(e.to_string()))?;
    let schema = iceberg_to_arrow(&schema)?;
    let side = LakeSide {
        table,
        snapshot: snapshot_id,
        lake: lake.clone(),
        topic: own,
    };
    Ok(Arc::new(TopicTable::new(schema, Some(side), None)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_select_live_snapshot_time_or_metadata() {
        assert_eq!(parse_table_name("t"), Ok(("t", Wanted::Live)));
        assert_eq!(parse_table_name("t@42"), Ok(("t", Wanted::Snapshot(42))));
        assert_eq!(
            parse_table_name("t@1970-01-01T00:00:01Z"),
            Ok(("t", Wanted::AsOf(1000)))
        );
        assert_eq!(
            parse_table_name("a-b$snapshots"),
            Ok(("a-b", Wanted::Snapshots))
        );
        assert_eq!(parse_table_name("a$files"), Ok(("a", Wanted::Files)));
        assert_eq!(
            parse_table_name("a$partitions"),
            Ok(("a", Wanted::Partitions))
        );
        assert_eq!(parse_table_name("a$history"), Ok(("a", Wanted::History)));
        assert!(parse_table_name("t@yesterday").is_err());
    }

    fn scope(sql: &str) -> Scope {
        Scope::of(
            &super::super::guard::parse(sql).unwrap_or_default(),
            "pg_catalog",
        )
    }

    fn tables(names: &[(&str, &str, &str)]) -> Scope {
        Scope::Tables(
            names
                .iter()
                .map(|(c, s, t)| (c.to_string(), s.to_string(), t.to_string()))
                .collect(),
        )
    }

    #[test]
    fn a_statement_naming_its_tables_lists_only_those() {
        assert_eq!(
            scope("SELECT * FROM Orders"),
            tables(&[("public", "default", "orders")])
        );
        assert_eq!(
            scope(
                "SELECT * FROM acme.sales.\"o-v2@42\" a JOIN p b ON a.k = b.k \
                 WHERE a.k IN (SELECT k FROM ns2.q)"
            ),
            tables(&[
                ("acme", "sales", "o-v2@42"),
                ("public", "default", "p"),
                ("public", "ns2", "q"),
            ])
        );
        assert_eq!(
            scope("WITH c AS (SELECT 1 AS x) SELECT * FROM c; SELECT 2"),
            tables(&[])
        );
        assert_eq!(
            scope("EXPLAIN SELECT * FROM \"t$files\""),
            tables(&[("public", "default", "t$files")])
        );
    }

    #[test]
    fn a_statement_reading_the_catalogs_lists_every_topic() {
        for sql in [
            "SHOW TABLES",
            "SELECT table_name FROM information_schema.tables",
            "SELECT * FROM t JOIN pg_catalog.pg_class c ON true",
            "SELECT relname FROM pg_class",
        ] {
            assert_eq!(scope(sql), Scope::All, "{sql}");
        }
    }
}
