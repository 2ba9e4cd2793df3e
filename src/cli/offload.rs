//! `ledgerlake offload <topic> [--wait]`: asks a running service to offload everything written
//! to a topic so far, and with `--wait` follows the progress until the commit is done.

use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;

use crate::naming::TopicName;

/// Arguments of `ledgerlake offload`.
#[derive(Debug, Args)]
pub struct OffloadArgs {
    /// Topic (`x`, `tenant/ns/x` or `persistent://tenant/ns/x`); a partitioned topic's table
    /// holds all its partitions.
    pub topic: String,
    /// Wait until the offload has committed (or failed), showing progress.
    #[arg(long)]
    pub wait: bool,
    /// HTTP address of the running service.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Give up waiting after this long.
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

fn path(topic: &TopicName) -> String {
    format!(
        "admin/v2/persistent/{}/{}/{}",
        topic.namespace.tenant, topic.namespace.name, topic.local
    )
}

pub fn run(args: OffloadArgs) -> anyhow::Result<()> {
    let topic: TopicName = args.topic.parse()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(offload(args, topic))
}

async fn offload(args: OffloadArgs, topic: TopicName) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let url = format!(
        "{}/{}/offload",
        args.url.trim_end_matches('/'),
        path(&topic)
    );
    let resp = http
        .put(&url)
        .send()
        .await
        .with_context(|| format!("PUT {url}"))?;
    let status = resp.status();
    let body: serde_json::Value = resp.json().await.unwrap_or_default();
    if !status.is_success() {
        bail!("offload of {topic} refused ({status}): {}", body["reason"]);
    }
    let ticket = body["request"].as_u64().unwrap_or(u64::MAX);
    if !args.wait {
        println!("offload of {topic} requested");
        return Ok(());
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {elapsed_precise} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    let deadline = tokio::time::Instant::now() + args.timeout;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let s: serde_json::Value = http
            .get(&url)
            .send()
            .await
            .with_context(|| format!("GET {url}"))?
            .json()
            .await
            .context("offload status is not JSON")?;
        let entries = s["progressEntries"].as_u64().unwrap_or(0);
        let bytes = s["progressBytes"].as_u64().unwrap_or(0);
        bar.set_message(format!(
            "{} — {entries} entries, {} read",
            s["status"].as_str().unwrap_or("?"),
            bytesize::ByteSize::b(bytes)
        ));
        bar.tick();
        let done = s["completedRequest"].as_u64().unwrap_or(0) >= ticket;
        if done {
            bar.finish_and_clear();
            match s["status"].as_str() {
                Some("ERROR") => bail!("offload of {topic} failed: {}", s["lastError"]),
                _ => {
                    println!(
                        "offloaded {topic}: status {}, first message not in the lake: {}, snapshot {}",
                        s["status"].as_str().unwrap_or("?"),
                        s["firstUnoffloadedMessage"],
                        s["lastSnapshotId"]
                    );
                    return Ok(());
                }
            }
        }
        if tokio::time::Instant::now() > deadline {
            bar.abandon();
            bail!("offload of {topic} still running after {:?}", args.timeout);
        }
    }
}
