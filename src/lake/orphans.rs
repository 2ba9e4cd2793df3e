//! Files of a table: which data files its snapshots reference, and removal of the ones no
//! snapshot references (left by failed or crashed offload attempts).
//!
//! Invariants:
//! - A file is deleted only if no snapshot of the table (any branch, any age still in the
//!   metadata) references it AND it is older than the safety window; the caller holds the
//!   table's writer slot, so no attempt of ours is writing meanwhile.
//! - Only the table's `data/` folder is cleaned; metadata files are the catalog's business.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use iceberg::table::Table;
use object_store::ObjectStoreExt;

use super::{Lake, LakeError};

/// Data files referenced by a snapshot, with the manifests they came from.
#[derive(Debug, Clone, Default)]
pub struct FileReport {
    /// Locations of live data files of the current snapshot.
    pub current: Vec<String>,
    /// Locations any snapshot reads (live entries of its manifests).
    pub referenced: HashSet<String>,
}

/// Lists the data files referenced by the table's snapshots.
pub async fn referenced_files(table: &Table) -> Result<FileReport, LakeError> {
    let metadata = table.metadata();
    let io = table.file_io();
    let mut seen_manifests = HashSet::new();
    let mut report = FileReport::default();
    let current = metadata.current_snapshot_id();
    for snapshot in metadata.snapshots() {
        let list = super::inspect::manifest_list(table, snapshot).await?;
        let is_current = Some(snapshot.snapshot_id()) == current;
        for mf in list.entries() {
            if !is_current && !seen_manifests.insert(mf.manifest_path.clone()) {
                continue;
            }
            let manifest = mf
                .load_manifest(io)
                .await
                .map_err(LakeError::iceberg("reading a manifest"))?;
            // A `DELETED` entry only records a removal: no read of that snapshot needs it.
            for entry in manifest.entries().iter().filter(|e| e.is_alive()) {
                let path = entry.data_file().file_path().to_string();
                if is_current {
                    report.current.push(path.clone());
                }
                report.referenced.insert(path);
            }
        }
    }
    report.current.sort();
    report.current.dedup();
    Ok(report)
}

/// What an orphan sweep did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct OrphanReport {
    /// Files listed under the data folder.
    pub listed: usize,
    /// Unreferenced files deleted.
    pub deleted: Vec<String>,
    /// Unreferenced files kept because they are younger than the safety window.
    pub too_young: usize,
}

/// Deletes data files of `table` that no snapshot references and that are older than
/// `min_age`.
pub async fn delete_orphans(
    lake: &Lake,
    table: &Table,
    min_age: Duration,
) -> Result<OrphanReport, LakeError> {
    let referenced = referenced_files(table).await?.referenced;
    let data_dir = format!(
        "{}/data/",
        table.metadata().location().trim_end_matches('/')
    );
    let listing = lake.list_under(&data_dir).await?;
    let now = SystemTime::now();
    let mut report = OrphanReport {
        listed: listing.len(),
        ..Default::default()
    };
    for meta in listing {
        let location = lake.location_of(&meta.location);
        if referenced.contains(&location) {
            continue;
        }
        let age = now
            .duration_since(SystemTime::from(meta.last_modified))
            .unwrap_or_default();
        if age < min_age {
            report.too_young += 1;
            continue;
        }
        lake.store()
            .delete(&meta.location)
            .await
            .map_err(LakeError::store(format!("deleting orphan {location}")))?;
        tracing::info!(file = %location, "deleted orphan data file");
        report.deleted.push(location);
    }
    Ok(report)
}
