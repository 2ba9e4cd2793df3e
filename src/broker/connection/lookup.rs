//! CONNECT, LOOKUP, PARTITIONED_METADATA and GET_SCHEMA. Lookup failures go inside the typed
//! responses: the C++ client matches a bare ERROR only against its other pending requests.

use std::sync::Arc;

use super::{authorized, Completion, Connection};
use crate::auth::Action;
use crate::broker::backlog::ClientInfo;
use crate::broker::error::server_error;
use crate::broker::{PROTOCOL_VERSION, SERVER_VERSION};
use crate::cluster::ownership::Placement;
use crate::naming::{schema_version_bytes, schema_version_from_bytes};
use crate::protocol::command;
use crate::protocol::proto::{self, ServerError};
use crate::schema;

/// Most characters of a client's version kept for its consumers' stats.
const MAX_CLIENT_VERSION: usize = 256;

impl Connection {
    /// CONNECT: authenticates, then answers CONNECTED; `Err` closes the connection.
    pub(super) async fn on_connect(&mut self, c: proto::CommandConnect) -> Result<(), String> {
        let method = c.auth_method_name.as_deref().unwrap_or("none");
        let data = c.auth_data.as_deref().unwrap_or(&[]);
        match self.broker.access.authenticate(method, data) {
            Ok(principal) => {
                tracing::debug!(conn = self.id, %principal, "authenticated");
                self.principal = Some(principal);
                self.auth_method = method.to_string();
                self.supports_auth_refresh = c
                    .feature_flags
                    .as_ref()
                    .and_then(|f| f.supports_auth_refresh)
                    .unwrap_or(false);
            }
            Err(e) => {
                self.send(command::connect_refused(
                    ServerError::AuthenticationError,
                    e.to_string(),
                ))
                .await;
                return Err(format!("authentication failed: {e}"));
            }
        }
        // Kept for the consumers' and producers' stats, bounded: a client names itself as it
        // likes.
        self.client = Arc::new(ClientInfo {
            address: self.client.address.clone(),
            version: c.client_version.chars().take(MAX_CLIENT_VERSION).collect(),
        });
        let version = c.protocol_version.unwrap_or(0).min(PROTOCOL_VERSION);
        let max = self.broker.config.max_message_size.as_u64() as i32;
        self.send(command::connected(SERVER_VERSION, version, max))
            .await;
        Ok(())
    }

    /// Every refresh check: a connection whose credentials expired is asked for fresh ones
    /// (AUTH_CHALLENGE), and closed when its client cannot refresh or left the last challenge
    /// unanswered. `Err` closes the connection.
    pub(super) async fn check_credentials(&mut self) -> Result<(), String> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let Some(principal) = &self.principal else {
            return Ok(());
        };
        if !principal.expired_at(now) {
            return Ok(());
        }
        if !self.supports_auth_refresh {
            return Err(format!(
                "the credentials of {principal} expired and the client cannot refresh them"
            ));
        }
        if self.refresh_pending {
            return Err(format!(
                "the credentials of {principal} expired and the client sent no fresh ones"
            ));
        }
        self.refresh_pending = true;
        tracing::debug!(conn = self.id, %principal, "credentials expired: asking for fresh ones");
        let challenge =
            command::auth_challenge(SERVER_VERSION, PROTOCOL_VERSION, &self.auth_method);
        self.send(challenge).await;
        Ok(())
    }

    /// AUTH_RESPONSE: fresh credentials must authenticate as the same role; else the
    /// connection closes (`Err`).
    pub(super) fn on_auth_response(&mut self, r: proto::CommandAuthResponse) -> Result<(), String> {
        let data = r.response.unwrap_or_default();
        let method = data
            .auth_method_name
            .as_deref()
            .unwrap_or(&self.auth_method);
        let fresh = self
            .broker
            .access
            .authenticate(method, data.auth_data.as_deref().unwrap_or(&[]))
            .map_err(|e| format!("refreshing credentials failed: {e}"))?;
        let role = self.principal.as_ref().map(|p| p.role.clone());
        if role.as_deref() != Some(fresh.role.as_str()) {
            return Err(format!(
                "refreshed credentials name {fresh}, not the connection's role"
            ));
        }
        tracing::debug!(conn = self.id, principal = %fresh, "credentials refreshed");
        self.principal = Some(fresh);
        self.refresh_pending = false;
        Ok(())
    }

    pub(super) fn on_partitioned_metadata(&mut self, m: proto::CommandPartitionedTopicMetadata) {
        let (broker, principal) = (self.broker.clone(), self.principal());
        self.defer(async move {
            let partitions =
                match authorized(&broker, &principal, &m.topic, Action::Lookup, None).await {
                    Ok(name) => broker.partitions(&name).await,
                    Err(e) => Err(e),
                };
            Completion::reply(match partitions {
                Ok(n) => command::partitioned_metadata(m.request_id, n),
                Err(e) => command::partitioned_metadata_failed(
                    m.request_id,
                    server_error(&e),
                    e.to_string(),
                ),
            })
        });
    }

    pub(super) fn on_lookup(&mut self, l: proto::CommandLookupTopic) {
        let (broker, principal) = (self.broker.clone(), self.principal());
        self.defer(async move {
            Completion::reply(
                match authorized(&broker, &principal, &l.topic, Action::Lookup, None).await {
                    Ok(name) => {
                        let authoritative = l.authoritative.unwrap_or(false);
                        match broker.placement(&name, authoritative).await {
                            Ok(Placement::Local { .. }) => {
                                let me = broker.ownership.me();
                                command::lookup_connect(
                                    l.request_id,
                                    &me.broker_service_url,
                                    me.broker_service_url_tls.as_deref(),
                                )
                            }
                            // The node named serves the topic, or is to: either way its
                            // answer is final.
                            Ok(Placement::Remote { node, .. }) => command::lookup_redirect(
                                l.request_id,
                                &node.broker_service_url,
                                node.broker_service_url_tls.as_deref(),
                                true,
                            ),
                            Err(e) => command::lookup_failed(
                                l.request_id,
                                server_error(&e),
                                e.to_string(),
                            ),
                        }
                    }
                    Err(e) => command::lookup_failed(l.request_id, server_error(&e), e.to_string()),
                },
            )
        });
    }

    pub(super) fn on_get_schema(&mut self, g: proto::CommandGetSchema) {
        let (broker, principal) = (self.broker.clone(), self.principal());
        self.defer(async move {
            let result = match authorized(&broker, &principal, &g.topic, Action::Lookup, None).await
            {
                Ok(name) => {
                    let wanted = g
                        .schema_version
                        .as_deref()
                        .and_then(schema_version_from_bytes);
                    match schema::versions(&broker.metadata(), &name.base().to_string()).await {
                        Ok(all) => {
                            let found = match wanted {
                                Some(v) => all.into_iter().find(|(n, _)| *n == v),
                                None => all.into_iter().last(),
                            };
                            found
                                .map(|(v, sc)| (sc, schema_version_bytes(v)))
                                .ok_or((ServerError::TopicNotFound, "schema not found".to_string()))
                        }
                        Err(e) => Err((ServerError::MetadataError, e.to_string())),
                    }
                }
                Err(e) => Err((server_error(&e), e.to_string())),
            };
            Completion::reply(command::get_schema_response(g.request_id, result))
        });
    }
}
