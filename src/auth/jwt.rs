//! JSON Web Tokens as Pulsar clients send them (`AuthenticationToken`): HS256 with a secret key,
//! or RS256/RS384/RS512/PS256/PS384/PS512/ES256/ES384 with a public key. The role is read from
//! a configurable claim (`sub` by default); `exp` is enforced when present (no leeway), `nbf`
//! too; an audience is required only when configured. Tokens without `exp` never expire, as
//! with Pulsar.
//!
//! Key files are what `ledgerlake token create-secret-key` / `create-key-pair` write (the same
//! forms as `pulsar tokens`): a secret key as raw bytes, keys as DER (PKCS#8 private key,
//! X.509 SubjectPublicKeyInfo public key). PEM files are accepted too, and a key may be given
//! inline as `data:;base64,<base64>` instead of a path (Pulsar's form); `file://` prefixes are
//! stripped.
//!
//! Invariants:
//! - A token is accepted only if signed with the configured key by an algorithm of the
//!   configured family: `alg: none`, an HMAC token against a public key (the key-confusion
//!   attack) and an RSA token against an EC key are refused.
//! - Secrets are never printed (the `Debug` output names the algorithm only).

use std::collections::HashSet;
use std::fmt;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};

use super::{AuthError, Authenticator, Principal};

/// Why a key or a token could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The key file could not be read.
    #[error("reading key {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The key's contents are not a key of the expected kind.
    #[error("key {path} is not a usable {kind} key: {reason}")]
    Invalid {
        /// Where the key came from.
        path: String,
        /// What kind of key was expected.
        kind: &'static str,
        /// Why it is not usable.
        reason: String,
    },
    /// An algorithm name that is not supported.
    #[error("unsupported token algorithm {0} (use HS256, RS256, RS384, RS512, PS256, PS384, PS512, ES256 or ES384)")]
    Algorithm(String),
    /// Generating a key or signing failed.
    #[error("{0}")]
    Crypto(String),
}

/// Reads key material: `data:;base64,…` inline, else a file (a `file://` prefix is stripped).
pub fn read_key(spec: &str) -> Result<Vec<u8>, KeyError> {
    if let Some(b64) = spec.strip_prefix("data:;base64,") {
        return base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|e| KeyError::Invalid {
                path: "data:".into(),
                kind: "inline",
                reason: e.to_string(),
            });
    }
    let path = spec.strip_prefix("file://").unwrap_or(spec);
    std::fs::read(Path::new(path)).map_err(|source| KeyError::Read {
        path: path.to_string(),
        source,
    })
}

/// Parses an algorithm name (`RS256`, `ES256`, …).
pub fn algorithm(name: &str) -> Result<Algorithm, KeyError> {
    let alg = match name.to_ascii_uppercase().as_str() {
        "HS256" => Algorithm::HS256,
        "RS256" => Algorithm::RS256,
        "RS384" => Algorithm::RS384,
        "RS512" => Algorithm::RS512,
        "PS256" => Algorithm::PS256,
        "PS384" => Algorithm::PS384,
        "PS512" => Algorithm::PS512,
        "ES256" => Algorithm::ES256,
        "ES384" => Algorithm::ES384,
        _ => return Err(KeyError::Algorithm(name.to_string())),
    };
    Ok(alg)
}

fn is_ec(alg: Algorithm) -> bool {
    matches!(alg, Algorithm::ES256 | Algorithm::ES384)
}

/// `bytes` as PEM: unchanged when already PEM, else DER wrapped with `tag`.
fn as_pem(bytes: &[u8], tag: &str) -> Vec<u8> {
    if bytes.starts_with(b"-----BEGIN") {
        return bytes.to_vec();
    }
    pem::encode(&pem::Pem::new(tag, bytes.to_vec())).into_bytes()
}

/// Checks tokens signed with one key.
pub struct JwtAuthenticator {
    key: DecodingKey,
    validation: Validation,
    /// Claim holding the role.
    role_claim: String,
}

impl fmt::Debug for JwtAuthenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtAuthenticator")
            .field("algorithms", &self.validation.algorithms)
            .field("role_claim", &self.role_claim)
            .finish()
    }
}

/// What a [`JwtAuthenticator`] checks besides the signature.
#[derive(Debug, Clone, Default)]
pub struct JwtRules {
    /// Claim holding the role (`sub` when empty).
    pub role_claim: String,
    /// When set, tokens must carry this audience in `aud`.
    pub audience: Option<String>,
}

impl JwtAuthenticator {
    /// Tokens signed with the HMAC secret key in `spec` (HS256).
    pub fn with_secret_key(spec: &str, rules: JwtRules) -> Result<Self, KeyError> {
        let secret = read_key(spec)?;
        if secret.is_empty() {
            return Err(KeyError::Invalid {
                path: spec.to_string(),
                kind: "secret",
                reason: "it is empty".into(),
            });
        }
        let key = DecodingKey::from_secret(&secret);
        Ok(Self::new(key, Algorithm::HS256, rules))
    }

    /// Tokens signed with the private key matching the public key in `spec`, by `alg`.
    pub fn with_public_key(spec: &str, alg: Algorithm, rules: JwtRules) -> Result<Self, KeyError> {
        let bytes = as_pem(&read_key(spec)?, "PUBLIC KEY");
        let (kind, key) = if is_ec(alg) {
            ("EC public", DecodingKey::from_ec_pem(&bytes))
        } else if alg == Algorithm::HS256 {
            return Err(KeyError::Algorithm(
                "HS256 (a public key needs an RS, PS or ES algorithm)".into(),
            ));
        } else {
            ("RSA public", DecodingKey::from_rsa_pem(&bytes))
        };
        let key = key.map_err(|e| KeyError::Invalid {
            path: spec.to_string(),
            kind,
            reason: e.to_string(),
        })?;
        Ok(Self::new(key, alg, rules))
    }

    fn new(key: DecodingKey, alg: Algorithm, rules: JwtRules) -> Self {
        let family: Vec<Algorithm> = match alg {
            Algorithm::HS256 => vec![Algorithm::HS256, Algorithm::HS384, Algorithm::HS512],
            Algorithm::ES256 | Algorithm::ES384 => vec![alg],
            _ => vec![
                Algorithm::RS256,
                Algorithm::RS384,
                Algorithm::RS512,
                Algorithm::PS256,
                Algorithm::PS384,
                Algorithm::PS512,
            ],
        };
        let mut validation = Validation::new(alg);
        validation.algorithms = family;
        validation.leeway = 0;
        validation.validate_nbf = true;
        validation.required_spec_claims = HashSet::new();
        match &rules.audience {
            Some(aud) => {
                validation.set_audience(&[aud]);
                // Without this a token lacking `aud` would pass.
                validation.required_spec_claims.insert("aud".to_string());
            }
            None => validation.validate_aud = false,
        }
        let role_claim = if rules.role_claim.is_empty() {
            "sub".to_string()
        } else {
            rules.role_claim
        };
        JwtAuthenticator {
            key,
            validation,
            role_claim,
        }
    }

    /// The principal a token names, or why it is refused.
    pub fn check(&self, token: &str) -> Result<Principal, AuthError> {
        let data = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
            token,
            &self.key,
            &self.validation,
        )
        .map_err(|e| match e.kind() {
            ErrorKind::ExpiredSignature => AuthError::Expired,
            ErrorKind::InvalidSignature => AuthError::InvalidToken("bad signature".into()),
            ErrorKind::InvalidAlgorithm => {
                AuthError::InvalidToken("algorithm not accepted for this key".into())
            }
            ErrorKind::InvalidAudience => AuthError::InvalidToken("wrong audience".into()),
            ErrorKind::ImmatureSignature => AuthError::InvalidToken("not valid yet (nbf)".into()),
            other => AuthError::InvalidToken(format!("{other:?}")),
        })?;
        let role = match data.claims.get(&self.role_claim) {
            Some(serde_json::Value::String(s)) if !s.is_empty() => s.clone(),
            _ => {
                return Err(AuthError::InvalidToken(format!(
                    "no role in claim '{}'",
                    self.role_claim
                )))
            }
        };
        // `exp` may be a fraction of a second; a token counts as expired from its ceiling on.
        let expires_at = data
            .claims
            .get("exp")
            .and_then(serde_json::Value::as_f64)
            .map(|t| t.max(0.0).ceil() as u64);
        Ok(Principal { role, expires_at })
    }
}

impl Authenticator for JwtAuthenticator {
    fn authenticate(&self, method: &str, data: &[u8]) -> Result<Principal, AuthError> {
        if method != "token" {
            return Err(AuthError::UnsupportedMethod(method.to_string()));
        }
        let token = std::str::from_utf8(data).map_err(|_| AuthError::InvalidCredentials)?;
        self.check(token.strip_prefix("token:").unwrap_or(token).trim())
    }
}

/// A new HS256 secret key: 32 random bytes.
pub fn new_secret_key() -> Vec<u8> {
    use rand::RngCore as _;
    let mut key = vec![0u8; 32];
    rand::rng().fill_bytes(&mut key);
    key
}

/// A new key pair for `alg` (RS* and PS*: RSA 2048; ES256: P-256; ES384: P-384), as DER:
/// (PKCS#8 private key, X.509 SubjectPublicKeyInfo public key).
pub fn new_key_pair(alg: Algorithm) -> Result<(Vec<u8>, Vec<u8>), KeyError> {
    use aws_lc_rs::encoding::{AsDer, PublicKeyX509Der};
    use aws_lc_rs::signature::{self, KeyPair as _};
    let crypto = |e: aws_lc_rs::error::Unspecified| KeyError::Crypto(format!("{e}"));
    match alg {
        Algorithm::ES256 | Algorithm::ES384 => {
            let curve = if alg == Algorithm::ES256 {
                &signature::ECDSA_P256_SHA256_FIXED_SIGNING
            } else {
                &signature::ECDSA_P384_SHA384_FIXED_SIGNING
            };
            let pair = signature::EcdsaKeyPair::generate(curve).map_err(crypto)?;
            let private = pair.to_pkcs8v1().map_err(crypto)?.as_ref().to_vec();
            let public: PublicKeyX509Der = pair.public_key().as_der().map_err(crypto)?;
            Ok((private, public.as_ref().to_vec()))
        }
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => Err(KeyError::Algorithm(
            format!("{alg:?} (use create-secret-key for HMAC)"),
        )),
        _ => {
            let pair = aws_lc_rs::rsa::KeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048)
                .map_err(crypto)?;
            let private: aws_lc_rs::encoding::Pkcs8V1Der = pair.as_der().map_err(crypto)?;
            let public: PublicKeyX509Der = pair.public_key().as_der().map_err(crypto)?;
            Ok((private.as_ref().to_vec(), public.as_ref().to_vec()))
        }
    }
}

/// How to sign a new token.
pub enum Signer {
    /// HS256 with a secret key (raw bytes).
    Secret(Vec<u8>),
    /// A private key (DER or PEM PKCS#8) with its algorithm.
    Private(Vec<u8>, Algorithm),
}

/// A signed token for `subject` (claim `sub`), expiring `expiry` from now when given.
pub fn create_token(
    signer: &Signer,
    subject: &str,
    expiry: Option<std::time::Duration>,
) -> Result<String, KeyError> {
    let mut claims = serde_json::Map::new();
    claims.insert("sub".into(), subject.into());
    if let Some(d) = expiry {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |t| t.as_secs());
        claims.insert("exp".into(), (now + d.as_secs()).into());
    }
    let invalid = |reason: String| KeyError::Invalid {
        path: "private key".into(),
        kind: "signing",
        reason,
    };
    let (header, key) = match signer {
        Signer::Secret(secret) => (
            Header::new(Algorithm::HS256),
            EncodingKey::from_secret(secret),
        ),
        Signer::Private(bytes, alg) => {
            let pem = as_pem(bytes, "PRIVATE KEY");
            let key = if is_ec(*alg) {
                EncodingKey::from_ec_pem(&pem)
            } else {
                EncodingKey::from_rsa_pem(&pem)
            };
            (Header::new(*alg), key.map_err(|e| invalid(e.to_string()))?)
        }
    };
    jsonwebtoken::encode(&header, &claims, &key).map_err(|e| invalid(e.to_string()))
}

/// The header and claims of a token, unverified (for `token show`).
pub fn inspect(token: &str) -> Result<(serde_json::Value, serde_json::Value), KeyError> {
    let part = |i: usize| -> Result<serde_json::Value, KeyError> {
        let text = token.trim().split('.').nth(i).unwrap_or_default();
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(text.trim_end_matches('='))
            .map_err(|e| KeyError::Crypto(format!("not a JWT: {e}")))?;
        serde_json::from_slice(&bytes).map_err(|e| KeyError::Crypto(format!("not a JWT: {e}")))
    };
    Ok((part(0)?, part(1)?))
}

#[cfg(test)]
mod tests;
