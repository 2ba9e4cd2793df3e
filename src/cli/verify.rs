//! `ledgerlake verify [TOPIC…|--all] [--deep] [--json]`: asks a running service to check that
//! each topic's messages are held exactly once across its log and its lake table (every id of
//! both tiers read; see the library's `verify` module), and reports what it found.
//!
//! Exit status: 0 when every topic is clean, 1 when anything was found or a topic could not be
//! verified. A progress bar on a terminal; `--json` prints one JSON document of all reports.

use anyhow::{bail, Context};
use clap::Args;
use serde_json::Value;

use super::admin::{get, send};
use crate::naming::TopicName;
use crate::verify::{Finding, Tier, TopicReport};

/// Arguments of `ledgerlake verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Topics (`x`, `tenant/ns/x` or `persistent://tenant/ns/x`); a partitioned topic is
    /// verified with all its partitions.
    #[arg(required_unless_present = "all")]
    pub topics: Vec<String>,
    /// Every topic of every namespace of every tenant.
    #[arg(long, conflicts_with = "topics")]
    pub all: bool,
    /// Also compare the payloads of messages both tiers hold (CRC32C of each).
    #[arg(long)]
    pub deep: bool,
    /// Print the reports as JSON.
    #[arg(long)]
    pub json: bool,
    /// HTTP address of the running service.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Bearer token (when authentication is on; needs admin rights on the topics).
    #[arg(long, env = "LEDGERLAKE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

pub fn run(args: VerifyArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(verify(args))
}

async fn verify(args: VerifyArgs) -> anyhow::Result<()> {
    let token = args.token.as_deref();
    let topics = if args.all {
        every_topic(&args.url, token).await?
    } else {
        let mut out = Vec::new();
        for t in &args.topics {
            let name: TopicName = t.parse().with_context(|| format!("topic '{t}'"))?;
            out.push(name.base());
        }
        out.dedup();
        out
    };
    let bar = indicatif::ProgressBar::new(topics.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed_precise} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut reports = Vec::new();
    let mut failures = Vec::new();
    for topic in &topics {
        bar.set_message(topic.to_string());
        let path = format!(
            "/persistent/{}/{}/{}/verify{}",
            topic.namespace.tenant,
            topic.namespace.name,
            topic.local,
            if args.deep { "?deep=true" } else { "" }
        );
        match send(&args.url, token, get(path)).await {
            Ok(Some(v)) => match serde_json::from_value::<TopicReport>(v) {
                Ok(r) => reports.push(r),
                Err(e) => failures.push((topic.to_string(), format!("unreadable report: {e}"))),
            },
            Ok(None) => failures.push((topic.to_string(), "empty answer".into())),
            Err(e) => failures.push((topic.to_string(), format!("{e:#}"))),
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let dirty = reports.iter().filter(|r| !r.is_clean()).count();
    if args.json {
        let failed: Vec<Value> = failures
            .iter()
            .map(|(t, e)| serde_json::json!({ "topic": t, "error": e }))
            .collect();
        let doc = serde_json::json!({
            "clean": dirty == 0 && failures.is_empty(),
            "topics": reports,
            "errors": failed,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        for r in &reports {
            print!("{}", describe(r));
        }
        for (t, e) in &failures {
            println!("ERROR {t}: {e}");
        }
    }
    if dirty > 0 || !failures.is_empty() {
        bail!(
            "{dirty} of {} topics have findings, {} could not be verified",
            topics.len(),
            failures.len()
        );
    }
    Ok(())
}

/// Every topic (base names, partitions folded) of every namespace of every tenant.
async fn every_topic(url: &str, token: Option<&str>) -> anyhow::Result<Vec<TopicName>> {
    let strings = |v: Option<Value>| -> Vec<String> {
        v.and_then(|v| serde_json::from_value::<Vec<String>>(v).ok())
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for tenant in strings(send(url, token, get("/tenants".into())).await?) {
        for ns in strings(send(url, token, get(format!("/namespaces/{tenant}"))).await?) {
            let topics = strings(send(url, token, get(format!("/persistent/{ns}"))).await?);
            for t in topics {
                if let Ok(name) = t.parse::<TopicName>() {
                    out.push(name.base());
                }
            }
        }
    }
    out.sort_by_key(|t| t.to_string());
    out.dedup();
    Ok(out)
}

/// A report as text: one line for the topic, one per finding.
fn describe(r: &TopicReport) -> String {
    let entries: u64 = r.partitions.iter().map(|p| p.entries_read).sum();
    let rows: u64 = r.partitions.iter().map(|p| p.rows_lake).sum();
    let ledgers: u64 = r.partitions.iter().map(|p| p.ledgers).sum();
    let mut out = format!(
        "{} {}: {} partition(s), {ledgers} ledgers, {entries} entries read from the log, \
         {rows} rows from {} lake file(s){}\n",
        if r.is_clean() { "ok  " } else { "FAIL" },
        r.topic,
        r.partitions.len().max(1),
        r.files_read,
        if r.deep { ", payloads compared" } else { "" },
    );
    for f in &r.findings {
        out.push_str("  ");
        out.push_str(&finding_text(f));
        out.push('\n');
    }
    if r.findings_dropped > 0 {
        out.push_str(&format!("  … and {} more\n", r.findings_dropped));
    }
    out
}

fn finding_text(f: &Finding) -> String {
    let entries = |first: u64, last: u64| {
        if first == last {
            format!("entry {first}")
        } else {
            format!("entries {first}-{last}")
        }
    };
    match f {
        Finding::Gap {
            tier,
            partition,
            ledger,
            first_entry,
            last_entry,
            batch_indexes,
        } => {
            let which = if batch_indexes.is_empty() {
                String::new()
            } else {
                format!(" (batch indexes {batch_indexes:?})")
            };
            let tier = match tier {
                Tier::Log => "log",
                Tier::Lake => "lake",
            };
            format!(
                "gap in the {tier}: partition {partition} ledger {ledger} {}{which}",
                entries(*first_entry, *last_entry)
            )
        }
        Finding::Duplicate {
            partition,
            ledger,
            entry,
            batch_index,
            copies,
            files,
        } => format!(
            "duplicate: partition {partition} ledger {ledger} entry {entry} batch index \
             {batch_index} held {copies} times, in {}",
            files.join(", ")
        ),
        Finding::Unexpected {
            partition,
            ledger,
            rows,
            detail,
        } => format!("unexpected: partition {partition} ledger {ledger}: {rows} row(s): {detail}"),
        Finding::PayloadMismatch {
            partition,
            ledger,
            entry,
            batch_index,
        } => format!(
            "payload differs: partition {partition} ledger {ledger} entry {entry} batch index \
             {batch_index}"
        ),
        Finding::MissingFile { path, detail } => format!("missing file {path}: {detail}"),
        Finding::UnreadableFile { path, detail } => format!("unreadable file {path}: {detail}"),
        Finding::UnreadableEntries {
            partition,
            ledger,
            first_entry,
            last_entry,
            detail,
        } => format!(
            "unreadable in the log: partition {partition} ledger {ledger} {}: {detail}",
            entries(*first_entry, *last_entry)
        ),
        Finding::Inconsistent {
            partition,
            ledger,
            detail,
        } => {
            let at = match (partition, ledger) {
                (Some(p), Some(l)) => format!(" partition {p} ledger {l}"),
                (Some(p), None) => format!(" partition {p}"),
                _ => String::new(),
            };
            format!("inconsistent{at}: {detail}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn findings_read_as_one_line_each() {
        let gap = Finding::Gap {
            tier: Tier::Lake,
            partition: 2,
            ledger: 9,
            first_entry: 3,
            last_entry: 5,
            batch_indexes: vec![],
        };
        assert_eq!(
            finding_text(&gap),
            "gap in the lake: partition 2 ledger 9 entries 3-5"
        );
        let r = TopicReport {
            topic: "persistent://public/default/t".into(),
            findings: vec![gap],
            ..TopicReport::default()
        };
        let text = describe(&r);
        assert!(text.starts_with("FAIL persistent://public/default/t: 1 partition(s)"));
        assert_eq!(text.lines().count(), 2);
    }
}
