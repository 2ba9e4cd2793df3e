//! `ledgerlake admin …`: the admin API from the command line, with the shape of pulsar-admin's
//! verbs (`tenants create`, `namespaces grant-permission`, `topics create-partitioned-topic`, …).
//! Each verb is one HTTP request to a running service; the answer is printed as a table (a
//! list one item per line, an object one `key  value` row per field) or, with `--json`, as the
//! service's JSON. A refused request prints the service's reason and exits non-zero.
//!
//! The two-column layout is written here (a few lines) rather than with a table crate.

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde_json::{json, Value};

use crate::naming::{NamespaceName, TopicName};

mod policies;
mod topics;

/// Arguments of `ledgerlake admin`.
#[derive(Debug, Args)]
pub struct AdminArgs {
    /// HTTP address of the running service.
    #[arg(long, global = true, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Token (a service with authentication on).
    #[arg(long, global = true, env = "LEDGERLAKE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print the service's JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: AdminCommand,
}

/// What to administer.
#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Clusters (`list`, `get`).
    #[command(subcommand)]
    Clusters(ClusterVerb),
    /// Tenants.
    #[command(subcommand)]
    Tenants(TenantVerb),
    /// Namespaces, their policies and permissions.
    #[command(subcommand)]
    Namespaces(NamespaceVerb),
    /// Topics, their stats and permissions.
    #[command(subcommand)]
    Topics(TopicVerb),
    /// Resource groups (quotas shared by the namespaces attached to them).
    #[command(subcommand, name = "resourcegroups")]
    ResourceGroups(GroupVerb),
}

/// `admin clusters …`.
#[derive(Debug, Subcommand)]
pub enum ClusterVerb {
    /// Every cluster's name.
    List,
    /// A cluster's URLs.
    Get { cluster: String },
}

/// `admin tenants …`.
#[derive(Debug, Subcommand)]
pub enum TenantVerb {
    /// Every tenant's name.
    List,
    /// A tenant's admin roles and allowed clusters.
    Get { tenant: String },
    /// Create a tenant.
    Create(TenantArgs),
    /// Replace a tenant's admin roles and allowed clusters.
    Update(TenantArgs),
    /// Delete a tenant (it must have no namespace).
    Delete { tenant: String },
}

/// A tenant and its settings.
#[derive(Debug, Args)]
pub struct TenantArgs {
    tenant: String,
    /// Roles that administer the tenant, comma-separated.
    #[arg(long, short = 'r', value_delimiter = ',')]
    admin_roles: Vec<String>,
    /// Clusters the tenant may use, comma-separated.
    #[arg(long, short = 'c', value_delimiter = ',', default_value = "standalone")]
    allowed_clusters: Vec<String>,
}

/// `admin namespaces …`.
#[derive(Debug, Subcommand)]
pub enum NamespaceVerb {
    /// The namespaces of a tenant.
    List { tenant: String },
    /// Create `tenant/namespace`.
    Create { namespace: String },
    /// Delete `tenant/namespace` (it must have no topic).
    Delete { namespace: String },
    /// The namespace's policies (Pulsar's `Policies` document).
    Policies { namespace: String },
    /// Grants on the namespace, by role.
    Permissions { namespace: String },
    /// Grant actions on every topic of the namespace to a role.
    GrantPermission(GrantArgs),
    /// Take a role's grants on the namespace away.
    RevokePermission(RevokeArgs),
    /// Limit each topic partition of the namespace (-1: unlimited).
    SetPublishRate(RateArgs),
    /// The namespace's publish rate.
    GetPublishRate { namespace: String },
    /// Attach the namespace to a resource group (superusers).
    SetResourceGroup {
        namespace: String,
        #[arg(long = "resource-group-name", short = 'r')]
        group: String,
    },
    /// Detach the namespace from its resource group (superusers).
    RemoveResourceGroup { namespace: String },
    /// Quotas and limits.
    #[command(flatten)]
    Policy(policies::PolicyVerb),
}

/// `grant-permission NAME --role R --actions produce,consume`.
#[derive(Debug, Args)]
pub struct GrantArgs {
    name: String,
    #[arg(long)]
    role: String,
    /// `produce`, `consume` (also `functions`, `sources`, `sinks`, `packages`).
    #[arg(long, value_delimiter = ',', required = true)]
    actions: Vec<String>,
}

/// `revoke-permission NAME --role R`.
#[derive(Debug, Args)]
pub struct RevokeArgs {
    name: String,
    #[arg(long)]
    role: String,
}

/// `set-publish-rate NAME --msg-publish-rate N --byte-publish-rate B`.
#[derive(Debug, Args)]
pub struct RateArgs {
    namespace: String,
    #[arg(long = "msg-publish-rate", short = 'm', default_value_t = -1)]
    msgs: i64,
    #[arg(long = "byte-publish-rate", short = 'b', default_value_t = -1)]
    bytes: i64,
}

/// `admin topics …`.
#[derive(Debug, Subcommand)]
pub enum TopicVerb {
    /// The topics of a namespace (`tenant/namespace`): topics and partitions.
    List { namespace: String },
    /// The partitioned topics of a namespace.
    ListPartitionedTopics { namespace: String },
    /// Create a partitioned topic.
    CreatePartitionedTopic {
        topic: String,
        #[arg(long, short = 'p')]
        partitions: u32,
    },
    /// Delete a topic (`--partitioned` for a partitioned one); `--force` closes its clients.
    Delete {
        topic: String,
        #[arg(long)]
        partitioned: bool,
        #[arg(long, short = 'f')]
        force: bool,
    },
    /// A topic's stats.
    Stats { topic: String },
    /// Grants on the topic (its namespace's and its own).
    Permissions { topic: String },
    /// Grant actions on one topic to a role.
    GrantPermission(GrantArgs),
    /// Take a role's topic-level grants away.
    RevokePermission(RevokeArgs),
    /// Topics, subscriptions and messages.
    #[command(flatten)]
    Ops(topics::TopicOpVerb),
}

/// `admin resourcegroups …`.
#[derive(Debug, Subcommand)]
pub enum GroupVerb {
    /// Every resource group's name.
    List,
    /// A resource group's quotas.
    Get { group: String },
    /// Create or replace a resource group (-1: unlimited).
    Create {
        group: String,
        #[arg(long = "msg-publish-rate", short = 'm', default_value_t = -1)]
        msgs: i64,
        #[arg(long = "byte-publish-rate", short = 'b', default_value_t = -1)]
        bytes: i64,
    },
    /// Delete a resource group (no namespace may use it).
    Delete { group: String },
}

/// One admin request: method, path under `/admin/v2`, JSON body.
pub(super) struct Request {
    method: reqwest::Method,
    path: String,
    body: Option<Value>,
}

pub(super) fn get(path: String) -> Request {
    Request {
        method: reqwest::Method::GET,
        path,
        body: None,
    }
}

fn with(method: reqwest::Method, path: String, body: Option<Value>) -> Request {
    Request { method, path, body }
}

fn ns_path(name: &str) -> anyhow::Result<String> {
    let ns: NamespaceName = name
        .parse()
        .with_context(|| format!("'{name}' is not tenant/namespace"))?;
    Ok(format!("/namespaces/{}/{}", ns.tenant, ns.name))
}

fn topic_path(name: &str) -> anyhow::Result<String> {
    let t: TopicName = name.parse()?;
    Ok(format!(
        "/persistent/{}/{}/{}",
        t.namespace.tenant, t.namespace.name, t.local
    ))
}

fn request(command: AdminCommand) -> anyhow::Result<Request> {
    use reqwest::Method as M;
    Ok(match command {
        AdminCommand::Clusters(ClusterVerb::List) => get("/clusters".into()),
        AdminCommand::Clusters(ClusterVerb::Get { cluster }) => get(format!("/clusters/{cluster}")),
        AdminCommand::Tenants(v) => match v {
            TenantVerb::List => get("/tenants".into()),
            TenantVerb::Get { tenant } => get(format!("/tenants/{tenant}")),
            TenantVerb::Create(a) => tenant_request(M::PUT, a),
            TenantVerb::Update(a) => tenant_request(M::POST, a),
            TenantVerb::Delete { tenant } => with(M::DELETE, format!("/tenants/{tenant}"), None),
        },
        AdminCommand::Namespaces(v) => namespace_request(v)?,
        AdminCommand::Topics(v) => topic_request(v)?,
        AdminCommand::ResourceGroups(v) => match v {
            GroupVerb::List => get("/resourcegroups".into()),
            GroupVerb::Get { group } => get(format!("/resourcegroups/{group}")),
            GroupVerb::Create { group, msgs, bytes } => with(
                M::PUT,
                format!("/resourcegroups/{group}"),
                Some(json!({ "publishRateInMsgs": msgs, "publishRateInBytes": bytes })),
            ),
            GroupVerb::Delete { group } => {
                with(M::DELETE, format!("/resourcegroups/{group}"), None)
            }
        },
    })
}

fn tenant_request(method: reqwest::Method, a: TenantArgs) -> Request {
    let body = json!({ "adminRoles": a.admin_roles, "allowedClusters": a.allowed_clusters });
    with(method, format!("/tenants/{}", a.tenant), Some(body))
}

fn namespace_request(v: NamespaceVerb) -> anyhow::Result<Request> {
    use reqwest::Method as M;
    Ok(match v {
        NamespaceVerb::List { tenant } => get(format!("/namespaces/{tenant}")),
        NamespaceVerb::Create { namespace } => with(M::PUT, ns_path(&namespace)?, None),
        NamespaceVerb::Delete { namespace } => with(M::DELETE, ns_path(&namespace)?, None),
        NamespaceVerb::Policies { namespace } => get(ns_path(&namespace)?),
        NamespaceVerb::Permissions { namespace } => {
            get(format!("{}/permissions", ns_path(&namespace)?))
        }
        NamespaceVerb::GrantPermission(g) => with(
            M::POST,
            format!("{}/permissions/{}", ns_path(&g.name)?, g.role),
            Some(json!(g.actions)),
        ),
        NamespaceVerb::RevokePermission(r) => with(
            M::DELETE,
            format!("{}/permissions/{}", ns_path(&r.name)?, r.role),
            None,
        ),
        NamespaceVerb::SetPublishRate(r) => with(
            M::POST,
            format!("{}/publishRate", ns_path(&r.namespace)?),
            Some(json!({
                "publishThrottlingRateInMsg": r.msgs,
                "publishThrottlingRateInByte": r.bytes
            })),
        ),
        NamespaceVerb::GetPublishRate { namespace } => {
            get(format!("{}/publishRate", ns_path(&namespace)?))
        }
        NamespaceVerb::SetResourceGroup { namespace, group } => with(
            M::POST,
            format!("{}/resourcegroup/{group}", ns_path(&namespace)?),
            None,
        ),
        NamespaceVerb::RemoveResourceGroup { namespace } => with(
            M::DELETE,
            format!("{}/resourcegroup", ns_path(&namespace)?),
            None,
        ),
        NamespaceVerb::Policy(v) => policies::request(v)?,
    })
}

fn topic_request(v: TopicVerb) -> anyhow::Result<Request> {
    use reqwest::Method as M;
    Ok(match v {
        TopicVerb::List { namespace } => {
            let ns: NamespaceName = namespace.parse()?;
            get(format!("/persistent/{}/{}", ns.tenant, ns.name))
        }
        TopicVerb::ListPartitionedTopics { namespace } => {
            let ns: NamespaceName = namespace.parse()?;
            get(format!("/persistent/{}/{}/partitioned", ns.tenant, ns.name))
        }
        TopicVerb::CreatePartitionedTopic { topic, partitions } => with(
            M::PUT,
            format!("{}/partitions", topic_path(&topic)?),
            Some(json!(partitions)),
        ),
        TopicVerb::Delete {
            topic,
            partitioned,
            force,
        } => {
            let suffix = if partitioned { "/partitions" } else { "" };
            with(
                M::DELETE,
                format!("{}{suffix}?force={force}", topic_path(&topic)?),
                None,
            )
        }
        TopicVerb::Stats { topic } => get(format!("{}/stats", topic_path(&topic)?)),
        TopicVerb::Permissions { topic } => get(format!("{}/permissions", topic_path(&topic)?)),
        TopicVerb::GrantPermission(g) => with(
            M::POST,
            format!("{}/permissions/{}", topic_path(&g.name)?, g.role),
            Some(json!(g.actions)),
        ),
        TopicVerb::RevokePermission(r) => with(
            M::DELETE,
            format!("{}/permissions/{}", topic_path(&r.name)?, r.role),
            None,
        ),
        TopicVerb::Ops(op) => topics::request(&op)?
            .with_context(|| format!("{op:?} reads messages: not a single request"))?,
    })
}

/// Runs one admin verb against the service.
pub fn run(args: AdminArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if let AdminCommand::Topics(TopicVerb::Ops(op)) = &args.command {
        let paths = topics::message_paths(op)?;
        if !paths.is_empty() {
            let token = args.token.as_deref();
            return rt.block_on(read_messages(&args.url, token, paths, args.json));
        }
    }
    let req = request(args.command)?;
    let answer = rt.block_on(send(&args.url, args.token.as_deref(), req))?;
    match answer {
        None => {}
        Some(v) if args.json => println!("{}", serde_json::to_string_pretty(&v)?),
        Some(v) => print!("{}", render(&v)),
    }
    Ok(())
}

/// Reads messages (peek, examine): one request per path, stopping at the end of the backlog
/// after the first; prints each message's id, metadata, properties and payload.
async fn read_messages(
    url: &str,
    token: Option<&str>,
    paths: Vec<String>,
    as_json: bool,
) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let mut messages = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let full = format!("{}/admin/v2{path}", url.trim_end_matches('/'));
        let mut builder = client.get(&full);
        if let Some(t) = token {
            builder = builder.bearer_auth(t);
        }
        let resp = builder
            .send()
            .await
            .with_context(|| format!("GET {full}"))?;
        let status = resp.status();
        if status == reqwest::StatusCode::NOT_FOUND && i > 0 {
            break;
        }
        let headers = resp.headers().clone();
        let body = resp.bytes().await?;
        if !status.is_success() {
            let reason = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| v["reason"].as_str().map(str::to_string))
                .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
            bail!("GET {path} refused ({status}): {reason}");
        }
        messages.push(topics::message_json(&headers, &body));
    }
    if as_json {
        println!("{}", serde_json::to_string_pretty(&messages)?);
    } else {
        for (i, m) in messages.iter().enumerate() {
            println!("--- message {} ---", i + 1);
            print!("{}", render(m));
        }
    }
    Ok(())
}

pub(super) async fn send(
    url: &str,
    token: Option<&str>,
    req: Request,
) -> anyhow::Result<Option<Value>> {
    let url = format!("{}/admin/v2{}", url.trim_end_matches('/'), req.path);
    let mut builder = reqwest::Client::new().request(req.method.clone(), &url);
    if let Some(t) = token {
        builder = builder.bearer_auth(t);
    }
    if let Some(body) = &req.body {
        builder = builder.json(body);
    }
    let resp = builder
        .send()
        .await
        .with_context(|| format!("{} {url}", req.method))?;
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    let value: Option<Value> = serde_json::from_str(&text).ok();
    if !status.is_success() {
        let reason = value
            .as_ref()
            .and_then(|v| v["reason"].as_str().map(str::to_string))
            .unwrap_or(text);
        bail!("{} {} refused ({status}): {reason}", req.method, req.path);
    }
    Ok(value)
}

/// A list one item per line; an object one aligned `key  value` row per field; anything else
/// as JSON.
fn render(v: &Value) -> String {
    let scalar = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    match v {
        Value::Array(items) => items.iter().map(|i| scalar(i) + "\n").collect(),
        Value::Object(fields) => {
            let width = fields.keys().map(|k| k.chars().count()).max().unwrap_or(0);
            fields
                .iter()
                .map(|(k, v)| format!("{k:width$}  {}\n", scalar(v)))
                .collect()
        }
        other => scalar(other) + "\n",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_lists_and_key_value_rows() {
        assert_eq!(render(&json!(["a", "b"])), "a\nb\n");
        assert_eq!(
            render(&json!({"adminRoles": ["x"], "n": 1})),
            "adminRoles  [\"x\"]\nn           1\n"
        );
        assert_eq!(render(&json!("Prefix")), "Prefix\n");
    }

    #[test]
    fn verbs_map_to_pulsars_paths() -> anyhow::Result<()> {
        let r = namespace_request(NamespaceVerb::GrantPermission(GrantArgs {
            name: "t/ns".into(),
            role: "app".into(),
            actions: vec!["produce".into()],
        }))?;
        assert_eq!(
            (r.method, r.path.as_str()),
            (reqwest::Method::POST, "/namespaces/t/ns/permissions/app")
        );
        assert_eq!(r.body, Some(json!(["produce"])));
        let r = topic_request(TopicVerb::Delete {
            topic: "persistent://t/ns/x".into(),
            partitioned: true,
            force: false,
        })?;
        assert_eq!(r.path, "/persistent/t/ns/x/partitions?force=false");
        assert!(ns_path("no-slash").is_err());
        Ok(())
    }
}
