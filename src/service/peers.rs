//! How this node meets the other nodes of its cluster: its bookie listener (plain or TLS, with
//! the admission check of ADR 0012) and the [`Dialer`] it opens their bookies with (the node
//! token it presents, the certificate authorities it trusts for TLS listeners, ADR 0013).

use std::sync::Arc;

use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::{bind, node_id, ServiceError};
use crate::auth::Access;
use crate::bookie::dial::Dialer;
use crate::config::Config;
use crate::ledger::Log;

/// Starts the bookie listener when `server.bookie_addr` is set, speaking TLS with `tls` when
/// `server.bookie_tls` is on; the address to advertise (`None`: no listener).
pub(super) async fn start_bookie(
    config: &Config,
    (log, access): (&Arc<Log>, &Access),
    advertised: &str,
    tls: Option<TlsAcceptor>,
    stop: CancellationToken,
) -> Result<Option<String>, ServiceError> {
    let Some(addr) = config.server.bookie_addr else {
        return Ok(None);
    };
    let listener = bind(addr, "bookie").await?;
    let bound = listener.local_addr().map_err(ServiceError::Http)?;
    let check = crate::bookie::peer_check(access, &config.broker.authentication.superuser_roles);
    // Validation requires the certificate with `bookie_tls`, so `tls` is there when asked for.
    let tls = tls.filter(|_| config.server.bookie_tls);
    let speaks = if tls.is_some() { "TLS" } else { "plain TCP" };
    crate::bookie::serve(listener, log.clone(), check, tls, stop);
    tracing::info!(bookie_addr = %bound, speaks, "bookie listening (node-to-node)");
    // Bound to every interface: advertise the broker's advertised host.
    Ok(Some(if bound.ip().is_unspecified() {
        node_id(advertised, bound)
    } else {
        bound.to_string()
    }))
}

/// The dialer of this node's connections to other bookies: its node token while
/// authentication is on (ADR 0012: no hello is sent with it off), and TLS trusting
/// `server.bookie_tls_trust_certs_file` when set.
pub(super) fn dialer(config: &Config) -> Result<Dialer, ServiceError> {
    let auth = &config.broker.authentication;
    let spec = auth.node_token.as_deref().filter(|_| auth.enabled);
    let token = spec
        .map(crate::bookie::dial::load_token)
        .transpose()
        .map_err(|(path, source)| ServiceError::NodeToken { path, source })?;
    if token.as_deref().is_some_and(str::is_empty) {
        let path = spec.unwrap_or_default().trim_start_matches("file:").into();
        let source = std::io::Error::new(std::io::ErrorKind::InvalidData, "the file is empty");
        return Err(ServiceError::NodeToken { path, source });
    }
    let trust = config.server.bookie_tls_trust_certs_file.as_deref();
    let tls = trust.map(crate::tls::client_config).transpose()?;
    Ok(Dialer::new(token, tls, config.server.bookie_tls))
}
