//! Authentication of connections (CONNECT's `auth_method_name` + `auth_data`) behind a small
//! trait, so later issues can plug in JWT validation, tenants and authorization.
//!
//! Today's implementation, [`StaticTokens`], maps opaque tokens (method `token`, as the Pulsar
//! clients send them) to roles listed in the configuration.

use std::collections::HashMap;
use std::fmt;

/// Who a connection authenticated as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Role name (what authorization will check).
    pub role: String,
}

/// Why a connection was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The client used a method this broker does not accept.
    #[error("authentication method '{0}' is not supported (use 'token')")]
    UnsupportedMethod(String),
    /// The credentials are wrong.
    #[error("invalid credentials")]
    InvalidCredentials,
}

/// Checks the credentials of a CONNECT.
pub trait Authenticator: Send + Sync + fmt::Debug {
    /// Returns the principal for `method` + `data`, or why they are refused.
    fn authenticate(&self, method: &str, data: &[u8]) -> Result<Principal, AuthError>;
}

/// The authenticator `config` asks for (`None`: authentication off). The broker and the SQL
/// surfaces share it.
pub fn from_config(
    config: &crate::config::AuthenticationConfig,
) -> Option<std::sync::Arc<dyn Authenticator>> {
    config.enabled.then(|| {
        let tokens = config.tokens.clone().into_iter().collect();
        std::sync::Arc::new(StaticTokens::new(tokens)) as std::sync::Arc<dyn Authenticator>
    })
}

/// Opaque tokens mapped to roles.
pub struct StaticTokens {
    /// Invariant: keys are the exact token strings clients send.
    tokens: HashMap<String, String>,
}

impl fmt::Debug for StaticTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the secrets.
        f.debug_struct("StaticTokens")
            .field("tokens", &self.tokens.len())
            .finish()
    }
}

impl StaticTokens {
    /// An authenticator accepting exactly these token → role pairs.
    pub fn new(tokens: HashMap<String, String>) -> Self {
        Self { tokens }
    }
}

impl Authenticator for StaticTokens {
    fn authenticate(&self, method: &str, data: &[u8]) -> Result<Principal, AuthError> {
        if method != "token" {
            return Err(AuthError::UnsupportedMethod(method.to_string()));
        }
        let token = std::str::from_utf8(data).map_err(|_| AuthError::InvalidCredentials)?;
        // Clients may send the token with a "token:" prefix (Pulsar's file/URL forms).
        let token = token.strip_prefix("token:").unwrap_or(token).trim();
        self.tokens
            .get(token)
            .map(|role| Principal { role: role.clone() })
            .ok_or(AuthError::InvalidCredentials)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_map_to_roles() {
        let a = StaticTokens::new(HashMap::from([("s3cret".to_string(), "admin".to_string())]));
        assert_eq!(
            a.authenticate("token", b"s3cret"),
            Ok(Principal {
                role: "admin".into()
            })
        );
        assert_eq!(
            a.authenticate("token", b"wrong"),
            Err(AuthError::InvalidCredentials)
        );
        assert!(matches!(
            a.authenticate("none", b""),
            Err(AuthError::UnsupportedMethod(_))
        ));
        assert!(!format!("{a:?}").contains("s3cret"));
    }
}
