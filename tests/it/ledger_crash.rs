//! Crash test: a child process appends at full speed to many topics and reports every
//! acknowledged entry on stdout; the parent SIGKILLs it at a random moment, recovers the log and
//! checks that every acknowledged entry is present and byte-identical, and that each topic holds
//! exactly the dense sequence its writer produced (no gap, no duplicate, no invented entry).
//! At least 20 rounds on the same data directory.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ledgerlake::config::LedgerConfig;
use ledgerlake::ledger::metadata::sqlite::SqliteMetadataStore;
use ledgerlake::ledger::{LedgerState, Log, MetadataStore, Position, TopicLog};
use rustix::process::Signal;

use crate::common::*;

const CHILD_ENV: &str = "LL_TEST_CRASH_CHILD_DIR";
const TOPICS: usize = 8;
const ROUNDS: usize = 20;

fn topic_name(i: usize) -> String {
    format!("persistent://public/crash/t{i}")
}

/// The payload the writer of topic `t` appends as its `seq`-th entry.
fn payload(t: usize, seq: u64) -> Bytes {
    let len = 24 + (seq as usize * 37) % 400;
    let mut v = format!("{t}:{seq}:").into_bytes();
    while v.len() < len {
        v.push((seq.wrapping_mul(131) as usize + v.len() * 7 + t) as u8);
    }
    Bytes::from(v)
}

fn seq_of(payload: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(payload.split(|b| *b == b':').nth(1)?).ok()?;
    s.parse().ok()
}

fn config() -> LedgerConfig {
    LedgerConfig {
        segment_size: bytesize::ByteSize::mib(2),
        rollover_size: bytesize::ByteSize::kib(256),
        max_entry_size: bytesize::ByteSize::kib(64),
        ..LedgerConfig::default()
    }
}

async fn open(dir: &Path) -> Result<Log, Box<dyn std::error::Error>> {
    let meta: Arc<dyn MetadataStore> =
        Arc::new(SqliteMetadataStore::open(&dir.join("metadata.db")).await?);
    Ok(Log::open(&dir.join("ledger"), config(), meta).await?)
}

/// All entries of a topic from `from_ledger` on, in order.
async fn entries_from(
    t: &TopicLog,
    from: Option<Position>,
) -> Result<Vec<(Position, Bytes)>, Box<dyn std::error::Error>> {
    let mut out = Vec::new();
    for l in t.ledgers() {
        if l.entry_count == 0 || l.state == LedgerState::Deleted {
            continue;
        }
        let first = match from {
            Some(p) if l.id < p.ledger => continue,
            Some(p) if l.id == p.ledger => p.entry + 1,
            _ => 0,
        };
        if first >= l.entry_count {
            continue;
        }
        for e in t.read_entries(l.id, first, l.entry_count - 1).await? {
            out.push((e.position, e.payload));
        }
    }
    Ok(out)
}

/// The child: appends as fast as it can and prints `A <topic> <ledger> <entry> <seq>` per ack.
#[test]
#[ignore = "child process of crash_sigkill_rounds_keep_every_acknowledged_entry"]
fn crash_child_writer() -> TestResult {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return Ok(());
    };
    let dir = PathBuf::from(dir);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let log = Arc::new(open(&dir).await?);
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let printer = std::thread::spawn(move || {
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            let _ = writeln!(out, "READY");
            let _ = out.flush();
            while let Ok(line) = rx.recv() {
                let _ = out.write_all(line.as_bytes());
                while let Ok(more) = rx.try_recv() {
                    let _ = out.write_all(more.as_bytes());
                }
                let _ = out.flush();
            }
        });
        let mut tasks = Vec::new();
        for t in 0..TOPICS {
            let topic = log.topic(&topic_name(t)).await?;
            // Resume after the last entry that survived.
            let next = match topic.last_confirmed() {
                Some(pos) => {
                    let e = topic.read_entry(pos).await?;
                    seq_of(&e.payload).ok_or("unparsable payload")? + 1
                }
                None => 0,
            };
            let tx = tx.clone();
            tasks.push(tokio::spawn(async move {
                let (rtx, mut rrx) = tokio::sync::mpsc::channel(32);
                let acker = tokio::spawn(async move {
                    while let Some((seq, r)) = rrx.recv().await {
                        let r: ledgerlake::ledger::AppendReceipt = r;
                        match r.durable().await {
                            Ok(pos) => {
                                let _ =
                                    tx.send(format!("A {t} {} {} {seq}\n", pos.ledger, pos.entry));
                            }
                            Err(_) => return,
                        }
                    }
                });
                let mut seq = next;
                loop {
                    let Ok(r) = topic.append(seq as i64, payload(t, seq)).await else {
                        break;
                    };
                    if rtx.send((seq, r)).await.is_err() {
                        break;
                    }
                    seq += 1;
                }
                let _ = acker.await;
            }));
        }
        drop(tx);
        for t in tasks {
            let _ = t.await;
        }
        let _ = printer.join();
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}

#[test]
fn crash_sigkill_rounds_keep_every_acknowledged_entry() -> TestResult {
    let dir = tempfile::tempdir()?;
    let rt = runtime()?;
    // Per topic: position of the last verified entry and the next expected seq.
    let mut verified: HashMap<usize, (Option<Position>, u64)> = HashMap::new();
    let mut total_acked = 0usize;
    let mut rng_state = 0x1234_5678u64;
    for round in 0..ROUNDS {
        let mut child = ChildGuard(
            Command::new(std::env::current_exe()?)
                .args([
                    "--exact",
                    "ledger_crash::crash_child_writer",
                    "--ignored",
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .env(CHILD_ENV, dir.path())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()?,
        );
        let stdout = child.0.stdout.take().ok_or("no stdout")?;
        let (line_tx, line_rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line_tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Wait for READY, then let it write for a random 80–400 ms and SIGKILL it.
        loop {
            let line = line_rx
                .recv_timeout(Duration::from_secs(120))
                .map_err(|_| format!("round {round}: child never became ready"))?;
            if line.ends_with("READY") {
                break;
            }
        }
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        std::thread::sleep(Duration::from_millis(80 + rng_state % 320));
        signal(&child.0, Signal::KILL)?;
        child.0.wait()?;
        let _ = reader.join();
        let acks: Vec<(usize, Position, u64)> = line_rx
            .try_iter()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                if f.len() == 5 && f[0] == "A" {
                    Some((
                        f[1].parse().ok()?,
                        Position::new(f[2].parse().ok()?, f[3].parse().ok()?),
                        f[4].parse().ok()?,
                    ))
                } else {
                    None
                }
            })
            .collect();
        assert!(
            !acks.is_empty(),
            "round {round}: child acknowledged nothing"
        );
        total_acked += acks.len();

        rt.block_on(async {
            let log = open(dir.path()).await?;
            let mut by_pos: HashMap<(usize, Position), u64> = HashMap::new();
            for t in 0..TOPICS {
                let topic = log.topic(&topic_name(t)).await?;
                let (from, mut next_seq) = verified.get(&t).copied().unwrap_or((None, 0));
                let mut last = from;
                for (pos, bytes) in entries_from(&topic, from).await? {
                    let seq =
                        seq_of(&bytes).ok_or_else(|| format!("round {round}: garbage at {pos}"))?;
                    assert_eq!(
                        seq, next_seq,
                        "round {round}: topic {t} at {pos}: gap or duplicate"
                    );
                    assert_eq!(
                        bytes,
                        payload(t, seq),
                        "round {round}: topic {t} seq {seq} differs"
                    );
                    by_pos.insert((t, pos), seq);
                    next_seq += 1;
                    last = Some(pos);
                }
                verified.insert(t, (last, next_seq));
            }
            for (t, pos, seq) in &acks {
                match by_pos.get(&(*t, *pos)) {
                    Some(s) => assert_eq!(s, seq, "round {round}: ack {pos} holds another entry"),
                    None => {
                        // Verified in an earlier round? Then it must still read back identical.
                        let topic = log.topic(&topic_name(*t)).await?;
                        let e = topic.read_entry(*pos).await.map_err(|e| {
                            format!(
                                "round {round}: acknowledged entry {t}/{pos} (seq {seq}) lost: {e}"
                            )
                        })?;
                        assert_eq!(e.payload, payload(*t, *seq));
                    }
                }
            }
            log.shutdown().await?;
            Ok::<(), Box<dyn std::error::Error>>(())
        })?;
    }
    assert!(
        total_acked > ROUNDS * 10,
        "too few acknowledged entries: {total_acked}"
    );
    Ok(())
}
