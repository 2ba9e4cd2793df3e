//! Lake commits apply to the table version they were built on, or not at all, and report a
//! commit the catalog database did not keep as failed (`Lake::commit`; the SQLite catalog
//! here, PostgreSQL in the fault suite's catalog-kill test).

use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::ErrorKind;
use ledgerlake::config::LakePartitioning;
use ledgerlake::lake::{naming, outcome_unknown, Lake};
use ledgerlake::naming::TopicName;
use sqlx::Connection;

use crate::common::{runtime, TestResult};
use crate::offload::config;

fn set_property(table: &Table, key: &str, value: &str) -> Result<Transaction, iceberg::Error> {
    let tx = Transaction::new(table);
    tx.update_table_properties()
        .set(key.to_string(), value.to_string())
        .apply(tx)
}

async fn current(lake: &Lake, table: &Table) -> Result<Table, Box<dyn std::error::Error>> {
    Ok(lake
        .load_table(table.identifier())
        .await?
        .ok_or("the table disappeared")?)
}

/// The test's table property `k`.
fn property_k(t: &Table) -> Option<&str> {
    t.metadata().properties().get("k").map(String::as_str)
}

fn location(t: &Table) -> String {
    t.metadata_location().unwrap_or_default().to_string()
}

#[test]
fn a_commit_applies_to_its_own_version_or_not_at_all() -> TestResult {
    let rt = runtime()?;
    rt.block_on(async {
        let dir = tempfile::tempdir()?;
        let cfg = config(dir.path())?;
        let lake = Lake::open(&cfg).await?;
        let topic: TopicName = "persistent://t/n/pinned".parse()?;
        let v0 = lake
            .load_or_create_table(&topic, LakePartitioning::Day)
            .await?;
        assert_eq!(naming::table_ident(&topic), *v0.identifier());

        // A commit on the current version lands, and what it returns is what the catalog holds.
        let v1 = lake.commit(set_property(&v0, "k", "1")?, &v0).await?;
        let now = current(&lake, &v0).await?;
        assert_eq!(location(&now), location(&v1));
        assert_eq!(property_k(&now), Some("1"));

        // A transaction built on the older version is refused, provably unapplied, although
        // iceberg's own commit would re-base it onto the newer version and apply it.
        let stale = lake
            .commit(set_property(&v0, "k", "stale")?, &v0)
            .await
            .err()
            .ok_or("a commit built on a stale version applied")?;
        assert_eq!(stale.kind(), ErrorKind::CatalogCommitConflicts, "{stale}");
        assert!(!outcome_unknown(&stale));
        let now = current(&lake, &v0).await?;
        assert_eq!(location(&now), location(&v1));
        assert_eq!(property_k(&now), Some("1"));
        let rebased = set_property(&v0, "k", "rebased")?
            .commit(lake.catalog().as_ref())
            .await?;
        assert_eq!(
            property_k(&rebased),
            Some("rebased"),
            "iceberg's Transaction::commit no longer re-bases: the pinned view may be simpler now"
        );
        let v2 = current(&lake, &v0).await?;
        lose_commits(&cfg.catalog_uri(), true).await?;

        // The catalog database accepts the pointer swap, then fails to commit it (a deferred
        // constraint the swap violates, as a crash between the UPDATE and the COMMIT would).
        // Ours reports the commit failed, with an unknown outcome ...
        let err = lake
            .commit(set_property(&v2, "k", "ours")?, &v2)
            .await
            .err()
            .ok_or("a commit the catalog database did not keep was reported done")?;
        assert!(outcome_unknown(&err), "{err}");
        let now = current(&lake, &v0).await?;
        assert_eq!(location(&now), location(&v2));
        // ... where iceberg's SQL catalog ignores the COMMIT's error and reports success.
        let lost = set_property(&v2, "k", "lost")?
            .commit(lake.catalog().as_ref())
            .await?;
        assert_eq!(
            property_k(&lost),
            Some("lost"),
            "iceberg's SQL catalog now reports a failed COMMIT: the pinned view may be simpler"
        );
        let now = current(&lake, &v0).await?;
        assert_eq!(
            location(&now),
            location(&v2),
            "the catalog kept a commit whose COMMIT failed"
        );

        lose_commits(&cfg.catalog_uri(), false).await?;
        let v3 = lake.commit(set_property(&v2, "k", "3")?, &v2).await?;
        let now = current(&lake, &v0).await?;
        assert_eq!(location(&now), location(&v3));
        assert_eq!(property_k(&now), Some("3"));
        Ok(())
    })
}

/// Makes every later change of the catalog's table pointers fail at COMMIT (`on`), or not.
async fn lose_commits(uri: &str, on: bool) -> TestResult {
    let mut db = sqlx::SqliteConnection::connect(uri).await?;
    let statements: &[&str] = if on {
        &[
            "CREATE TABLE guard (id INTEGER PRIMARY KEY)",
            "CREATE TABLE guarded (ref INTEGER REFERENCES guard(id) DEFERRABLE INITIALLY DEFERRED)",
            "CREATE TRIGGER lose_commit AFTER UPDATE ON iceberg_tables
             BEGIN INSERT INTO guarded VALUES (42); END",
        ]
    } else {
        &["DROP TRIGGER lose_commit"]
    };
    for s in statements {
        sqlx::query(s).execute(&mut db).await?;
    }
    db.close().await?;
    Ok(())
}
