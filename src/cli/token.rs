//! `ledgerlake token …`: the verbs of `pulsar tokens`, writing keys in the same forms (a raw
//! secret key; DER PKCS#8 private and X.509 public keys), so keys and tokens move between
//! ledgerlake and Pulsar.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context};
use base64::Engine as _;
use clap::{Args, Subcommand};

use crate::auth::jwt::{self, JwtAuthenticator, JwtRules, Signer};

/// Token and key subcommands.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// A new HS256 secret key (32 random bytes) for `--auth-token-secret-key`.
    CreateSecretKey {
        /// Write the key to this file (raw bytes; mode 0600) instead of stdout.
        #[arg(long, short = 'o')]
        output: Option<PathBuf>,
        /// Write the key base64-encoded.
        #[arg(long, short = 'e')]
        base64: bool,
    },
    /// A new key pair: the private key signs tokens, the public key goes to
    /// `--auth-token-public-key`.
    CreateKeyPair {
        /// RS256 (RSA 2048, the default), ES256 (P-256) or ES384 (P-384).
        #[arg(long, short = 'a', default_value = "RS256")]
        algorithm: String,
        /// File for the private key (DER PKCS#8; mode 0600).
        #[arg(long)]
        output_private_key: PathBuf,
        /// File for the public key (DER X.509 SubjectPublicKeyInfo).
        #[arg(long)]
        output_public_key: PathBuf,
    },
    /// A new token for a role, signed with a secret key or a private key.
    Create(CreateArgs),
    /// Prints a token's header and claims (without checking its signature).
    Show(TokenInput),
    /// Checks a token against a key and prints its claims; exits non-zero when it is refused.
    Validate(ValidateArgs),
}

/// Flags of `token create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The role (claim `sub`).
    #[arg(long, short = 's')]
    subject: String,
    /// Secret key (file or `data:;base64,…`): HS256.
    #[arg(
        long,
        conflicts_with = "private_key",
        required_unless_present = "private_key"
    )]
    secret_key: Option<String>,
    /// Private key (file or `data:;base64,…`).
    #[arg(long)]
    private_key: Option<String>,
    /// Algorithm for `--private-key`.
    #[arg(long, short = 'a', default_value = "RS256")]
    algorithm: String,
    /// Lifetime, e.g. `1h`, `30m`, `7d`; without it the token never expires.
    #[arg(long, short = 'e', value_parser = humantime::parse_duration)]
    expiry_time: Option<std::time::Duration>,
}

/// A token given on the command line or in a file.
#[derive(Debug, Args)]
pub struct TokenInput {
    /// The token.
    #[arg(required_unless_present = "token_file")]
    token: Option<String>,
    /// A file holding the token.
    #[arg(long, short = 'f', conflicts_with = "token")]
    token_file: Option<PathBuf>,
}

impl TokenInput {
    fn read(&self) -> anyhow::Result<String> {
        match (&self.token, &self.token_file) {
            (Some(t), _) => Ok(t.trim().to_string()),
            (None, Some(f)) => Ok(std::fs::read_to_string(f)
                .with_context(|| format!("reading {}", f.display()))?
                .trim()
                .to_string()),
            (None, None) => bail!("give a token or --token-file"),
        }
    }
}

/// Flags of `token validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    #[command(flatten)]
    input: TokenInput,
    /// Secret key (file or `data:;base64,…`).
    #[arg(
        long,
        conflicts_with = "public_key",
        required_unless_present = "public_key"
    )]
    secret_key: Option<String>,
    /// Public key (file or `data:;base64,…`).
    #[arg(long)]
    public_key: Option<String>,
    /// Algorithm for `--public-key`.
    #[arg(long, short = 'a', default_value = "RS256")]
    algorithm: String,
    /// The claim holding the role.
    #[arg(long, default_value = "sub")]
    role_claim: String,
    /// Require this audience.
    #[arg(long)]
    audience: Option<String>,
}

/// Writes `bytes` to `path`, readable by its owner only when `secret`.
fn write_key(path: &PathBuf, bytes: &[u8], secret: bool) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut f = options
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    // The mode above applies only to a new file: an existing one is narrowed too.
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::PermissionsExt as _;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("restricting {}", path.display()))?;
    }
    f.write_all(bytes)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

pub fn run(cmd: TokenCommand) -> anyhow::Result<()> {
    match cmd {
        TokenCommand::CreateSecretKey { output, base64 } => {
            let key = jwt::new_secret_key();
            let bytes = if base64 || output.is_none() {
                base64::engine::general_purpose::STANDARD
                    .encode(&key)
                    .into_bytes()
            } else {
                key
            };
            match output {
                Some(path) => write_key(&path, &bytes, true)?,
                None => println!("{}", String::from_utf8_lossy(&bytes)),
            }
        }
        TokenCommand::CreateKeyPair {
            algorithm,
            output_private_key,
            output_public_key,
        } => {
            let alg = jwt::algorithm(&algorithm)?;
            let (private, public) = jwt::new_key_pair(alg)?;
            write_key(&output_private_key, &private, true)?;
            write_key(&output_public_key, &public, false)?;
        }
        TokenCommand::Create(a) => {
            let signer = match (&a.secret_key, &a.private_key) {
                (Some(s), _) => Signer::Secret(jwt::read_key(s)?),
                (None, Some(p)) => {
                    Signer::Private(jwt::read_key(p)?, jwt::algorithm(&a.algorithm)?)
                }
                (None, None) => bail!("give --secret-key or --private-key"),
            };
            println!("{}", jwt::create_token(&signer, &a.subject, a.expiry_time)?);
        }
        TokenCommand::Show(input) => {
            let (header, claims) = jwt::inspect(&input.read()?)?;
            println!("{header}");
            println!("---");
            println!("{}", serde_json::to_string_pretty(&claims)?);
        }
        TokenCommand::Validate(v) => {
            let token = v.input.read()?;
            let rules = JwtRules {
                role_claim: v.role_claim.clone(),
                audience: v.audience.clone(),
            };
            let checker = match (&v.secret_key, &v.public_key) {
                (Some(s), _) => JwtAuthenticator::with_secret_key(s, rules)?,
                (None, Some(p)) => {
                    JwtAuthenticator::with_public_key(p, jwt::algorithm(&v.algorithm)?, rules)?
                }
                (None, None) => bail!("give --secret-key or --public-key"),
            };
            let principal = checker.check(&token).map_err(|e| anyhow::anyhow!("{e}"))?;
            let (_, claims) = jwt::inspect(&token)?;
            println!("{}", serde_json::to_string_pretty(&claims)?);
            eprintln!("valid: role '{}'", principal.role);
        }
    }
    Ok(())
}
