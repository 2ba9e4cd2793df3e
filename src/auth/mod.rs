//! Who is asking, and whether they may: one [`Access`] shared by every surface (the Pulsar
//! protocol, the admin API, SQL over PostgreSQL and HTTP).
//!
//! - [`Authenticator`] turns credentials into a [`Principal`]: CONNECT's `auth_method_name` +
//!   `auth_data`, a PostgreSQL password, an HTTP `Authorization: Bearer` token. Two
//!   implementations, tried in that order when both are configured: [`StaticTokens`] maps
//!   opaque tokens listed in the configuration to roles; [`jwt::JwtAuthenticator`] checks JSON
//!   Web Tokens signed with a secret or a private key (method `token`, as the Pulsar clients
//!   send both). A principal remembers when its token expires, so long-lived connections can
//!   ask for a fresh one.
//! - [`Authorizer`] decides one [`Action`] of a principal on one [`Resource`]. Every operation
//!   of every surface asks it once. With authentication off, [`AllowAuthenticated`] allows
//!   everything (every request is anonymous); with it on, the service installs the tenancy
//!   authorizer ([`crate::tenancy::authorizer`]: superusers, tenant admins, grants).
//!
//! Invariant: with authentication on, no request reaches an operation without a principal that
//! the authenticator accepted; with it off, every request is the anonymous principal.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use crate::naming::{NamespaceName, TopicName};

pub mod jwt;

/// Who a connection or request authenticated as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Role name (what authorization checks); empty for the anonymous principal.
    pub role: String,
    /// When the credentials expire (seconds since the Unix epoch); `None`: never.
    pub expires_at: Option<u64>,
}

impl Principal {
    /// The principal of every request while authentication is off.
    pub fn anonymous() -> Self {
        Principal::role("")
    }

    /// A principal of `role` whose credentials do not expire.
    pub fn role(role: &str) -> Self {
        Principal {
            role: role.to_string(),
            expires_at: None,
        }
    }

    /// Whether the credentials have expired at `now` (seconds since the Unix epoch).
    pub fn expired_at(&self, now: u64) -> bool {
        self.expires_at.is_some_and(|exp| exp <= now)
    }

    /// Whether this is the anonymous principal.
    pub fn is_anonymous(&self) -> bool {
        self.role.is_empty()
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_anonymous() {
            f.write_str("anonymous")
        } else {
            write!(f, "role '{}'", self.role)
        }
    }
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
    /// Authentication is on and no credentials were given.
    #[error("credentials are required (a token)")]
    Missing,
    /// The token has expired.
    #[error("the token has expired")]
    Expired,
    /// The token is not acceptable (signature, algorithm, audience, claims).
    #[error("invalid token: {0}")]
    InvalidToken(String),
}

/// Checks the credentials of a CONNECT.
pub trait Authenticator: Send + Sync + fmt::Debug {
    /// Returns the principal for `method` + `data`, or why they are refused.
    fn authenticate(&self, method: &str, data: &[u8]) -> Result<Principal, AuthError>;
}

/// What a principal asks to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Look a topic up (LOOKUP, PARTITIONED_METADATA, GET_SCHEMA).
    Lookup,
    /// Produce to a topic.
    Produce,
    /// Subscribe to a topic (consumers and readers).
    Consume,
    /// Run a SQL query (over the topics it names).
    Query,
    /// Read through the admin API (stats, policies, listings).
    AdminRead,
    /// Change through the admin API (create, delete, set policies, offload).
    AdminWrite,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Lookup => "look up",
            Action::Produce => "produce to",
            Action::Consume => "consume from",
            Action::Query => "query",
            Action::AdminRead => "read",
            Action::AdminWrite => "change",
        })
    }
}

/// What an action is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    /// The whole service (cluster-wide admin paths, SQL sessions before a table is named).
    Cluster,
    /// A tenant.
    Tenant(String),
    /// A namespace.
    Namespace(NamespaceName),
    /// A topic (a partition is authorized as its partitioned topic).
    Topic(TopicName),
    /// A subscription of a topic: consuming through it also obeys the subscription's rules.
    Subscription {
        /// The (base) topic.
        topic: TopicName,
        /// The subscription's name.
        name: String,
    },
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resource::Cluster => f.write_str("the cluster"),
            Resource::Tenant(t) => write!(f, "tenant {t}"),
            Resource::Namespace(n) => write!(f, "namespace {n}"),
            Resource::Topic(t) => write!(f, "topic {t}"),
            Resource::Subscription { topic, name } => {
                write!(f, "subscription '{name}' of topic {topic}")
            }
        }
    }
}

/// Why an action was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{principal} is not authorized to {action} {resource}")]
pub struct Denied {
    /// Who asked.
    pub principal: String,
    /// What.
    pub action: Action,
    /// On what.
    pub resource: String,
}

/// Decides whether a principal may perform an action on a resource. Called once per operation
/// on every surface; implementations must be cheap (cache what they read).
#[async_trait::async_trait]
pub trait Authorizer: Send + Sync + fmt::Debug {
    /// `Ok` when `principal` may do `action` on `resource`.
    async fn authorize(
        &self,
        principal: &Principal,
        action: Action,
        resource: &Resource,
    ) -> Result<(), Denied>;
}

/// Allows every action of every principal that authentication let in (the behaviour before
/// authorization existed).
#[derive(Debug, Default)]
pub struct AllowAuthenticated;

#[async_trait::async_trait]
impl Authorizer for AllowAuthenticated {
    async fn authorize(&self, _: &Principal, _: Action, _: &Resource) -> Result<(), Denied> {
        Ok(())
    }
}

/// Why a request was refused, whichever step refused it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// No credentials, or wrong ones.
    #[error("authentication failed: {0}")]
    Unauthenticated(AuthError),
    /// Authenticated, but not allowed.
    #[error(transparent)]
    Denied(#[from] Denied),
}

/// Authentication and authorization together, built once by the service and shared by every
/// surface.
#[derive(Debug, Clone)]
pub struct Access {
    /// `None` when authentication is off.
    authenticator: Option<Arc<dyn Authenticator>>,
    authorizer: Arc<dyn Authorizer>,
}

impl Access {
    /// What `config` asks for; fails when a configured key cannot be read.
    pub fn from_config(
        config: &crate::config::AuthenticationConfig,
    ) -> Result<Self, jwt::KeyError> {
        let mut chain: Vec<Arc<dyn Authenticator>> = Vec::new();
        if !config.tokens.is_empty() {
            let tokens = config.tokens.clone().into_iter().collect();
            chain.push(Arc::new(StaticTokens::new(tokens)));
        }
        let rules = jwt::JwtRules {
            role_claim: config.token_auth_claim.clone(),
            audience: config.token_audience.clone(),
        };
        if let Some(secret) = &config.token_secret_key {
            chain.push(Arc::new(jwt::JwtAuthenticator::with_secret_key(
                secret,
                rules.clone(),
            )?));
        }
        if let Some(public) = &config.token_public_key {
            let alg = jwt::algorithm(&config.token_public_alg)?;
            chain.push(Arc::new(jwt::JwtAuthenticator::with_public_key(
                public, alg, rules,
            )?));
        }
        let authenticator = config
            .enabled
            .then(|| Arc::new(AnyOf(chain)) as Arc<dyn Authenticator>);
        Ok(Access {
            authenticator,
            authorizer: Arc::new(AllowAuthenticated),
        })
    }

    /// The same authentication, deciding with `authorizer`.
    pub fn with_authorizer(self, authorizer: Arc<dyn Authorizer>) -> Self {
        Access { authorizer, ..self }
    }

    /// Whether clients must present credentials (and so whether permissions apply).
    pub fn required(&self) -> bool {
        self.authenticator.is_some()
    }

    /// The principal of `method` + `data` (CONNECT's fields); anonymous when authentication is
    /// off.
    pub fn authenticate(&self, method: &str, data: &[u8]) -> Result<Principal, AuthError> {
        match &self.authenticator {
            None => Ok(Principal::anonymous()),
            Some(a) => a.authenticate(method, data),
        }
    }

    /// The principal of a bearer token or PostgreSQL password (`None`: none given); anonymous
    /// when authentication is off.
    pub fn authenticate_token(&self, token: Option<&str>) -> Result<Principal, AuthError> {
        match (&self.authenticator, token) {
            (None, _) => Ok(Principal::anonymous()),
            (Some(_), None) => Err(AuthError::Missing),
            (Some(a), Some(t)) => a.authenticate("token", t.as_bytes()),
        }
    }

    /// Asks the authorizer; a refusal is logged with role, action and resource.
    pub async fn authorize(
        &self,
        principal: &Principal,
        action: Action,
        resource: &Resource,
    ) -> Result<(), Denied> {
        let decision = self.authorizer.authorize(principal, action, resource).await;
        if let Err(denied) = &decision {
            tracing::warn!(role = %principal.role, %action, %resource, "refused: {denied}");
        }
        decision
    }

    /// Whether the authorizer allows it, without logging a refusal (for filtering listings:
    /// a role's SQL catalog shows only the topics it may read).
    pub async fn permits(
        &self,
        principal: &Principal,
        action: Action,
        resource: &Resource,
    ) -> bool {
        self.authorizer
            .authorize(principal, action, resource)
            .await
            .is_ok()
    }
}

/// The first of several authenticators that accepts the credentials; when none does, the
/// last one's reason (an empty list accepts nobody).
#[derive(Debug)]
struct AnyOf(Vec<Arc<dyn Authenticator>>);

impl Authenticator for AnyOf {
    fn authenticate(&self, method: &str, data: &[u8]) -> Result<Principal, AuthError> {
        let mut refused = AuthError::InvalidCredentials;
        for a in &self.0 {
            match a.authenticate(method, data) {
                Ok(p) => return Ok(p),
                Err(e) => refused = e,
            }
        }
        Err(refused)
    }
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
            .map(|role| Principal::role(role))
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
            Ok(Principal::role("admin"))
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

    #[tokio::test]
    async fn access_is_anonymous_when_off_and_checked_when_on() {
        let off = Access::from_config(&crate::config::AuthenticationConfig::default())
            .expect("no keys to read");
        assert!(!off.required());
        assert_eq!(off.authenticate_token(None), Ok(Principal::anonymous()));
        assert_eq!(off.authenticate("none", b""), Ok(Principal::anonymous()));
        let on = Access::from_config(&crate::config::AuthenticationConfig {
            enabled: true,
            tokens: [("t0k".to_string(), "app".to_string())]
                .into_iter()
                .collect(),
            ..Default::default()
        })
        .expect("no keys to read");
        assert!(on.required());
        assert_eq!(on.authenticate_token(None), Err(AuthError::Missing));
        assert_eq!(
            on.authenticate_token(Some("bad")),
            Err(AuthError::InvalidCredentials)
        );
        let app = on.authenticate_token(Some("t0k")).expect("valid token");
        assert_eq!(app.role, "app");
        let topic: TopicName = "t/n/x".parse().expect("valid name");
        assert!(on
            .authorize(&app, Action::Produce, &Resource::Topic(topic))
            .await
            .is_ok());
    }
}
