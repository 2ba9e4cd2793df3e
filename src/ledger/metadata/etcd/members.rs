//! Keeping a client's requests off etcd members that do not answer.
//!
//! The etcd client balances requests over every member the metadata URL lists. A member that
//! is down keeps its share: its connection is dialled again for each request, and the request
//! fails (on a three-member etcd that lost one, about a third of the node's metadata requests
//! and lease renewals would fail, although the other two members serve). So, with more than
//! one member, a guard asks each member for its status every [`PROBE_INTERVAL`], takes those
//! that do not answer within [`PROBE_TIMEOUT`] out of the client's balance, and puts each back
//! once it answers again.
//!
//! Invariant: at least one member stays in the balance. When no member answers, none is
//! taken out (there is nothing better to send requests to), and those taken out earlier stay
//! out until they answer.

use std::collections::HashSet;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

/// How often each member is asked.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// How long a member has to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The task guarding one client's balance; it ends when this is dropped.
#[derive(Debug)]
pub(super) struct MemberGuard {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MemberGuard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One member: its endpoint as the client's balance knows it, and a client of its own that
/// asks it alone.
struct Member {
    endpoint: String,
    probe: Client,
}

/// Guards `client`, connected to `endpoints` with `options`: one round of probes before it
/// returns (a member already down at start takes no requests), then a round every
/// [`PROBE_INTERVAL`]. `None` for a single member (there is no other to send requests to).
pub(super) async fn guard(
    client: &Client,
    endpoints: &[String],
    options: &ConnectOptions,
) -> Result<Option<MemberGuard>, etcd_client::Error> {
    if endpoints.len() < 2 {
        return Ok(None);
    }
    let options = options
        .clone()
        .with_connect_timeout(PROBE_TIMEOUT)
        .with_timeout(PROBE_TIMEOUT);
    let mut members = Vec::with_capacity(endpoints.len());
    for endpoint in endpoints {
        // The balanced channel dials lazily: this succeeds for a member that is down.
        let probe = Client::connect([endpoint.as_str()], Some(options.clone())).await?;
        members.push(Member {
            endpoint: endpoint.clone(),
            probe,
        });
    }
    let client = client.clone();
    let mut out = HashSet::new();
    probe_round(&client, &mut members, &mut out).await;
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(PROBE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            probe_round(&client, &mut members, &mut out).await;
        }
    });
    Ok(Some(MemberGuard { task }))
}

/// Asks every member at once; puts back those in `out` that answered, then takes those that
/// did not answer out of `client`'s balance while a member that answered is in it (see the
/// module's invariant).
async fn probe_round(client: &Client, members: &mut [Member], out: &mut HashSet<String>) {
    let answers = futures::future::join_all(members.iter_mut().map(|m| async {
        let answered = matches!(
            tokio::time::timeout(PROBE_TIMEOUT, m.probe.status()).await,
            Ok(Ok(_))
        );
        (m.endpoint.as_str(), answered)
    }))
    .await;
    let back: Vec<&str> = answers
        .iter()
        .filter(|(e, answered)| *answered && out.contains(*e))
        .map(|(e, _)| *e)
        .collect();
    for endpoint in back {
        match client.add_endpoint(endpoint).await {
            Ok(()) => {
                out.remove(endpoint);
                tracing::info!(endpoint, "etcd member answers again; requests go to it");
            }
            Err(e) => tracing::warn!(endpoint, error = %e, "etcd member could not be put back"),
        }
    }
    let serving = answers
        .iter()
        .any(|(e, answered)| *answered && !out.contains(*e));
    if !serving {
        return;
    }
    for (endpoint, answered) in answers {
        if !answered && !out.contains(endpoint) {
            match client.remove_endpoint(endpoint).await {
                Ok(()) => {
                    out.insert(endpoint.to_string());
                    tracing::warn!(
                        endpoint,
                        "etcd member does not answer; requests go to the others"
                    );
                }
                Err(e) => {
                    tracing::warn!(endpoint, error = %e, "etcd member could not be taken out")
                }
            }
        }
    }
}
