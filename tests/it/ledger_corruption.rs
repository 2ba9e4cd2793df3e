//! Corruption is detected and reported with ledger, entry, file and offset; never returned as data.

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bytes::Bytes;
use ledgerlake::config::LedgerConfig;
use ledgerlake::ledger::index::read_index_file;
use ledgerlake::ledger::metadata::sqlite::SqliteMetadataStore;
use ledgerlake::ledger::segment::segment_path;
use ledgerlake::ledger::{Log, MetadataStore, OpenError, Position, ReadError};

use crate::common::{runtime, TestResult};

async fn open(
    dir: &std::path::Path,
    config: LedgerConfig,
) -> Result<Log, Box<dyn std::error::Error>> {
    let meta: Arc<dyn MetadataStore> =
        Arc::new(SqliteMetadataStore::open(&dir.join("metadata.db")).await?);
    Ok(Log::open(&dir.join("ledger"), config, meta).await?)
}

#[test]
fn flipped_byte_in_sealed_ledger_is_reported_not_returned() -> TestResult {
    runtime()?.block_on(async {
        let dir = tempfile::tempdir()?;
        let log = open(dir.path(), LedgerConfig::default()).await?;
        let topic = log.topic("persistent://public/default/c").await?;
        for i in 0..50u64 {
            let payload = Bytes::from(format!("message number {i} with some padding bytes"));
            topic.append(i as i64, payload).await?.durable().await?;
        }
        let sealed = topic.seal_current().await?.ok_or("nothing sealed")?;
        log.shutdown().await?;
        drop((topic, log));

        // Flip one payload byte of entry 10 in the segment file.
        let index = read_index_file(&dir.path().join("ledger/index"), sealed.id)?;
        let at = index[10];
        let path = segment_path(&dir.path().join("ledger/segments"), at.segment);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)?;
        let victim = u64::from(at.offset) + 40;
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, victim)?;
        b[0] ^= 0x20;
        f.write_all_at(&b, victim)?;
        f.sync_all()?;

        let log = open(dir.path(), LedgerConfig::default()).await?;
        let topic = log.topic("persistent://public/default/c").await?;
        match topic.read_entry(Position::new(sealed.id, 10)).await {
            Err(ReadError::Corrupt {
                ledger,
                entry,
                path: p,
                offset,
                reason,
            }) => {
                assert_eq!((ledger, entry), (sealed.id, 10));
                assert_eq!(p, path);
                assert_eq!(offset, u64::from(at.offset));
                assert!(reason.contains("checksum"), "{reason}");
            }
            other => return Err(format!("expected corruption, got {other:?}").into()),
        }
        let msg = topic
            .read_entries(sealed.id, 0, 49)
            .await
            .err()
            .map(|e| e.to_string())
            .ok_or("range read returned corrupt data")?;
        assert!(
            msg.contains(&format!("{}:10", sealed.id)) && msg.contains(".seg"),
            "{msg}"
        );
        // Neighbours are intact.
        let e = topic.read_entry(Position::new(sealed.id, 11)).await?;
        assert_eq!(&e.payload[..], b"message number 11 with some padding bytes");
        log.shutdown().await?;
        Ok(())
    })
}

#[test]
fn corruption_inside_a_synced_segment_stops_recovery_with_its_location() -> TestResult {
    runtime()?.block_on(async {
        let dir = tempfile::tempdir()?;
        let config = LedgerConfig {
            segment_size: bytesize::ByteSize::mib(1),
            max_entry_size: bytesize::ByteSize::kib(64),
            ..LedgerConfig::default()
        };
        let log = open(dir.path(), config.clone()).await?;
        let topic = log.topic("t").await?;
        // ~3 MiB into one open ledger: it spans several segments and stays open (no seal).
        for i in 0..3000u64 {
            topic
                .append(i as i64, Bytes::from(vec![7u8; 1000]))
                .await?
                .durable()
                .await?;
        }
        log.shutdown().await?;
        drop((topic, log));
        let first = segment_path(&dir.path().join("ledger/segments"), 1);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&first)?;
        f.write_all_at(&[0xFF], 5000)?;
        f.sync_all()?;
        match open(dir.path(), config).await {
            Err(e) => {
                let open_err = e.downcast_ref::<OpenError>().ok_or("other error")?;
                match open_err {
                    OpenError::Corrupt { path, offset, .. } => {
                        assert_eq!(path, &first);
                        assert!(*offset <= 5000);
                    }
                    other => return Err(format!("unexpected: {other}").into()),
                }
            }
            Ok(_) => return Err("recovery accepted a corrupt segment".into()),
        }
        Ok(())
    })
}

/// 10,000 topics with open ledgers share the journal: the process does not open a file per
/// topic (or per ledger).
#[test]
fn ten_thousand_open_ledgers_do_not_need_ten_thousand_files() -> TestResult {
    fn open_fds() -> std::io::Result<usize> {
        Ok(std::fs::read_dir("/proc/self/fd")?.count())
    }
    runtime()?.block_on(async {
        let dir = tempfile::tempdir()?;
        let log = open(dir.path(), LedgerConfig::default()).await?;
        let before = open_fds()?;
        let mut receipts = Vec::new();
        for i in 0..10_000u32 {
            let t = log.topic(&format!("persistent://public/many/t{i}")).await?;
            receipts.push(t.append(0, Bytes::from(format!("m{i}"))).await?);
        }
        for r in receipts {
            r.durable().await?;
        }
        let during = open_fds()?;
        assert!(
            during < before + 64,
            "10,000 open ledgers opened {} files",
            during - before
        );
        // Every one of them is readable.
        let t = log.topic("persistent://public/many/t9999").await?;
        let l = t.ledgers()[0].id;
        assert_eq!(
            &t.read_entry(Position::new(l, 0)).await?.payload[..],
            b"m9999"
        );
        log.shutdown().await?;
        Ok(())
    })
}
