//! `ledgerlake sql ["SELECT ..."]`: runs read-only SQL on a running service (HTTP `POST /sql`)
//! and prints an aligned table (or CSV / JSON with `--format`). Without a query it reads
//! statements from standard input, `;`-terminated, with a prompt when the input is a terminal.

use std::io::{BufRead, IsTerminal, Write};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};

use crate::sql::format::ARROW_STREAM;

/// Output formats of `ledgerlake sql`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// An aligned table.
    Table,
    /// CSV with a header row.
    Csv,
    /// A JSON array of row objects.
    Json,
}

/// Arguments of `ledgerlake sql`.
#[derive(Debug, Args)]
pub struct SqlArgs {
    /// The statement; omit it to read statements from standard input.
    pub query: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: OutputFormat,
    /// HTTP address of the running service.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Token, when the service has authentication on.
    #[arg(long, env = "LEDGERLAKE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

pub fn run(args: SqlArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let http = reqwest::Client::new();
        match &args.query {
            Some(q) => {
                let out = run_one(&http, &args, q).await?;
                print!("{out}");
                Ok(())
            }
            None => interactive(&http, &args).await,
        }
    })
}

async fn interactive(http: &reqwest::Client, args: &SqlArgs) -> anyhow::Result<()> {
    let stdin = std::io::stdin();
    let prompt = stdin.is_terminal();
    let mut pending = String::new();
    let mut failed = false;
    loop {
        if prompt {
            print!(
                "{}",
                if pending.is_empty() {
                    "ledgerlake> "
                } else {
                    "        ...> "
                }
            );
            std::io::stdout().flush()?;
        }
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let trimmed = line.trim();
        if pending.is_empty() && matches!(trimmed, "\\q" | "quit" | "exit") {
            break;
        }
        pending.push_str(&line);
        while let Some(end) = pending.find(';') {
            let statement: String = pending[..end].trim().to_string();
            pending = pending[end + 1..].to_string();
            if statement.is_empty() {
                continue;
            }
            failed |= !print_result(run_one(http, args, &statement).await);
        }
    }
    if !pending.trim().is_empty() {
        failed |= !print_result(run_one(http, args, pending.trim()).await);
    }
    if failed && !prompt {
        bail!("some statements failed");
    }
    Ok(())
}

/// Prints a statement's output, or its error on stderr; whether it succeeded.
fn print_result(result: anyhow::Result<String>) -> bool {
    match result {
        Ok(out) => {
            print!("{out}");
            true
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            false
        }
    }
}

async fn run_one(http: &reqwest::Client, args: &SqlArgs, query: &str) -> anyhow::Result<String> {
    let url = format!("{}/sql", args.url.trim_end_matches('/'));
    let accept = match args.format {
        OutputFormat::Table => ARROW_STREAM,
        OutputFormat::Csv => "text/csv",
        OutputFormat::Json => "application/json",
    };
    let mut req = http
        .post(&url)
        .header("accept", accept)
        .header("content-type", "text/plain")
        .body(query.to_string());
    if let Some(t) = &args.token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.with_context(|| format!("POST {url}"))?;
    let status = resp.status();
    let body = resp.bytes().await.context("reading the result")?;
    if !status.is_success() {
        let reason = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["reason"].as_str().map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        bail!("{reason} ({status})");
    }
    match args.format {
        OutputFormat::Table => {
            let reader =
                arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(body), None)
                    .context("decoding the Arrow result")?;
            let schema = reader.schema();
            let batches: Vec<_> = reader
                .collect::<Result<_, _>>()
                .context("decoding the Arrow result")?;
            let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
            if schema.fields().is_empty() {
                return Ok("OK\n".into());
            }
            let table = if batches.is_empty() {
                arrow::util::pretty::pretty_format_batches(&[
                    arrow::array::RecordBatch::new_empty(schema),
                ])?
            } else {
                arrow::util::pretty::pretty_format_batches(&batches)?
            };
            Ok(format!(
                "{table}\n({rows} row{})\n",
                if rows == 1 { "" } else { "s" }
            ))
        }
        _ => {
            let mut text = String::from_utf8_lossy(&body).into_owned();
            if !text.ends_with('\n') {
                text.push('\n');
            }
            Ok(text)
        }
    }
}
