//! `ledgerlake top`: a live view of a running service's busiest topic partitions (in and out
//! rates, backlog and its age, offload lag, hot-partition and lag-spiral flags), redrawn every
//! interval with plain ANSI escapes so it works over SSH and in any terminal. `--once` prints
//! one table and exits (for scripts); `--json` prints the rows as JSON.
//!
//! It polls `GET /admin/v2/broker-stats/topics`. The table layout is written here (a few
//! lines) rather than with a terminal UI crate: nothing is interactive.

use std::io::Write;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use serde_json::Value;

/// Arguments of `ledgerlake top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// HTTP address of the running service.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Token (a service with authentication on).
    #[arg(long, env = "LEDGERLAKE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Rows shown.
    #[arg(long, short = 'n', default_value_t = 20)]
    pub limit: usize,
    /// Refresh interval.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// What the rows are sorted by.
    #[arg(long, value_enum, default_value_t = SortBy::Rate)]
    pub sort: SortBy,
    /// Print one table and exit.
    #[arg(long)]
    pub once: bool,
    /// Print the rows as JSON (implies `--once`).
    #[arg(long)]
    pub json: bool,
}

/// Order of the rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SortBy {
    /// Messages in + out per second.
    Rate,
    /// Backlog entries.
    Backlog,
    /// Offload lag bytes.
    Lag,
}

/// One topic partition's row.
#[derive(Debug, Clone, serde::Serialize)]
struct Row {
    topic: String,
    rate_in: f64,
    rate_out: f64,
    throughput_in: f64,
    backlog: u64,
    backlog_age_seconds: u64,
    offload_lag_bytes: u64,
    hot: bool,
    lag_spiral: Vec<String>,
    reading_lake: Vec<String>,
}

fn rows(stats: &Value) -> Vec<Row> {
    let mut out = Vec::new();
    let Some(namespaces) = stats.as_object() else {
        return out;
    };
    let bundles = namespaces
        .values()
        .filter_map(Value::as_object)
        .flat_map(|b| b.values());
    for bundle in bundles {
        let Some(topics) = bundle["persistent"].as_object() else {
            continue;
        };
        for (topic, t) in topics {
            let f = |k: &str| t[k].as_f64().unwrap_or(0.0);
            let u = |k: &str| t[k].as_u64().unwrap_or(0);
            let subs = t["subscriptions"].as_object();
            let flagged = |k: &str| -> Vec<String> {
                subs.map(|s| {
                    s.iter()
                        .filter(|(_, v)| v[k] == Value::Bool(true))
                        .map(|(n, _)| n.clone())
                        .collect()
                })
                .unwrap_or_default()
            };
            out.push(Row {
                topic: topic.clone(),
                rate_in: f("msgRateIn"),
                rate_out: f("msgRateOut"),
                throughput_in: f("msgThroughputIn"),
                backlog: u("msgBacklog"),
                backlog_age_seconds: u("backlogAgeSeconds"),
                offload_lag_bytes: u("offloadLagBytes"),
                hot: t["hot"] == Value::Bool(true),
                lag_spiral: flagged("lagGrowing"),
                reading_lake: flagged("readingLake"),
            });
        }
    }
    out
}

fn sort(rows: &mut [Row], by: SortBy) {
    let key = |r: &Row| match by {
        SortBy::Rate => r.rate_in + r.rate_out,
        SortBy::Backlog => r.backlog as f64,
        SortBy::Lag => r.offload_lag_bytes as f64,
    };
    rows.sort_by(|a, b| {
        key(b)
            .total_cmp(&key(a))
            .then_with(|| a.topic.cmp(&b.topic))
    });
}

fn human_bytes(b: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1}{}", units[i])
}

/// The table: a header, then one line per row (flags last).
fn table(rows: &[Row], total: usize) -> String {
    let width = rows.iter().map(|r| r.topic.len()).max().unwrap_or(5).max(5);
    let mut s = format!(
        "{:width$}  {:>10}  {:>10}  {:>10}  {:>10}  {:>8}  {:>10}  FLAGS\n",
        "TOPIC", "IN msg/s", "OUT msg/s", "IN /s", "BACKLOG", "AGE s", "OFFLOAD LAG"
    );
    for r in rows {
        let mut flags = Vec::new();
        if r.hot {
            flags.push("HOT".to_string());
        }
        for sub in &r.lag_spiral {
            flags.push(format!("LAG-SPIRAL({sub})"));
        }
        for sub in &r.reading_lake {
            flags.push(format!("LAKE-REPLAY({sub})"));
        }
        s.push_str(&format!(
            "{:width$}  {:>10.1}  {:>10.1}  {:>10}  {:>10}  {:>8}  {:>10}  {}\n",
            r.topic,
            r.rate_in,
            r.rate_out,
            human_bytes(r.throughput_in),
            r.backlog,
            r.backlog_age_seconds,
            human_bytes(r.offload_lag_bytes as f64),
            flags.join(" ")
        ));
    }
    s.push_str(&format!(
        "{} of {total} loaded topic partitions\n",
        rows.len()
    ));
    s
}

async fn fetch(client: &reqwest::Client, url: &str, token: Option<&str>) -> anyhow::Result<Value> {
    let full = format!("{}/admin/v2/broker-stats/topics", url.trim_end_matches('/'));
    let mut b = client.get(&full);
    if let Some(t) = token {
        b = b.bearer_auth(t);
    }
    let resp = b.send().await.with_context(|| format!("GET {full}"))?;
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        bail!("GET {full} refused ({status}): {}", body["reason"]);
    }
    Ok(body)
}

/// Runs `ledgerlake top`.
pub fn run(args: TopArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = reqwest::Client::new();
    let mut out = std::io::stdout();
    loop {
        let stats = rt.block_on(fetch(&client, &args.url, args.token.as_deref()))?;
        let mut all = rows(&stats);
        let total = all.len();
        sort(&mut all, args.sort);
        all.truncate(args.limit);
        if args.json {
            println!("{}", serde_json::to_string_pretty(&all)?);
            return Ok(());
        }
        let text = table(&all, total);
        if args.once {
            print!("{text}");
            return Ok(());
        }
        // Home, clear screen, then the table: one write per refresh.
        write!(
            out,
            "\x1b[H\x1b[2J{} ledgerlake top  {}\n\n{text}",
            args.url,
            chrono_now()
        )?;
        out.flush()?;
        std::thread::sleep(args.interval.max(Duration::from_millis(100)));
    }
}

fn chrono_now() -> String {
    chrono::Utc::now().format("%H:%M:%S UTC").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rows_flatten_sort_and_flag() {
        let stats = json!({"public/default": {"0x00000000_0xffffffff": {"persistent": {
            "persistent://public/default/a": {"msgRateIn": 5.0, "msgRateOut": 0.0,
                "msgBacklog": 100, "hot": true,
                "subscriptions": {"s": {"lagGrowing": true, "readingLake": false}}},
            "persistent://public/default/b": {"msgRateIn": 50.0, "msgRateOut": 1.0,
                "msgBacklog": 1, "subscriptions": {}}
        }}}});
        let mut r = rows(&stats);
        sort(&mut r, SortBy::Rate);
        assert_eq!(r[0].topic, "persistent://public/default/b");
        sort(&mut r, SortBy::Backlog);
        assert_eq!(r[0].topic, "persistent://public/default/a");
        let t = table(&r, 2);
        assert!(t.contains("HOT LAG-SPIRAL(s)"), "{t}");
        assert!(t.ends_with("2 of 2 loaded topic partitions\n"), "{t}");
    }
}
