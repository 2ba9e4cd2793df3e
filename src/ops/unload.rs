//! Unloading a whole namespace across the cluster (`PUT /admin/v2/namespaces/{t}/{ns}/unload`).
//!
//! Each node unloads the topics of the namespace it serves (closing their clients, saving
//! cursors, sealing the open ledgers, releasing them, as a topic unload does); the node asked
//! first asks every other live node to do the same for its own topics (`?local=true`, with the
//! caller's `Authorization` header), so one call moves a namespace's topics wherever they are.
//! Clients reconnect and placement spreads the topics again. A node that cannot be asked makes
//! the call fail naming it (what was unloaded stays unloaded; calling again is safe).

use std::time::Duration;

use super::{Operations, OpsError};
use crate::broker::BrokerError;
use crate::naming::NamespaceName;

/// Longest wait for another node's part.
const PEER_TIMEOUT: Duration = Duration::from_secs(60);

impl Operations {
    /// Unloads the topics of `namespace` served here and, unless `only_here`, asks every other
    /// live node to unload those it serves. Returns how many topics this node unloaded.
    pub async fn unload_namespace(
        &self,
        namespace: &NamespaceName,
        only_here: bool,
        authorization: Option<&str>,
    ) -> Result<usize, OpsError> {
        if self.tenancy.namespace(namespace).await?.is_none() {
            return Err(OpsError::NotFound(format!(
                "Namespace {namespace} does not exist"
            )));
        }
        let mut unloaded = 0;
        for topic in self.broker.loaded_in(namespace) {
            match self.broker.unload(&topic).await {
                Ok(true) => unloaded += 1,
                Ok(false) | Err(BrokerError::TopicNotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if only_here {
            return Ok(unloaded);
        }
        let me = self.membership.me().id.clone();
        let peers = self
            .membership
            .nodes()
            .await
            .map_err(|e| OpsError::Unavailable(e.to_string()))?;
        let http = reqwest::Client::builder()
            .timeout(PEER_TIMEOUT)
            .build()
            .map_err(|e| OpsError::Unavailable(format!("http client: {e}")))?;
        let mut failed = Vec::new();
        for peer in peers.iter().filter(|n| n.id != me && !n.draining) {
            let url = format!(
                "{}/admin/v2/namespaces/{}/{}/unload?local=true",
                peer.web_service_url.trim_end_matches('/'),
                namespace.tenant,
                namespace.name
            );
            let mut request = http.put(&url);
            if let Some(value) = authorization {
                request = request.header(reqwest::header::AUTHORIZATION, value);
            }
            match request.send().await {
                Ok(r) if r.status().is_success() => {}
                Ok(r) => failed.push(format!("{} answered {}", peer.id, r.status())),
                Err(e) => failed.push(format!("{}: {e}", peer.id)),
            }
        }
        if failed.is_empty() {
            Ok(unloaded)
        } else {
            Err(OpsError::Unavailable(format!(
                "unloading {namespace} on other nodes failed: {}",
                failed.join("; ")
            )))
        }
    }
}
