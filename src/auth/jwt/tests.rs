//! Tokens made the way `ledgerlake token` makes them, checked the way the broker checks them:
//! each algorithm family round-trips, and every forgery the issue names is refused.

use std::time::Duration;

use base64::Engine as _;
use jsonwebtoken::Algorithm;

use super::*;

fn b64(bytes: &[u8]) -> String {
    format!(
        "data:;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

fn rules() -> JwtRules {
    JwtRules::default()
}

/// A token with this header and claims, signed with nothing (or a bogus signature).
fn unsigned(header: &str, claims: &str, signature: &str) -> String {
    let e = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    format!("{}.{}.{}", e(header), e(claims), signature)
}

#[test]
fn secret_key_tokens_name_their_role() -> Result<(), Box<dyn std::error::Error>> {
    let secret = new_secret_key();
    assert_eq!(secret.len(), 32);
    let checker = JwtAuthenticator::with_secret_key(&b64(&secret), rules())?;
    let token = create_token(&Signer::Secret(secret.clone()), "app", None)?;
    assert_eq!(checker.check(&token)?, Principal::role("app"));
    // As clients send it on CONNECT, with or without the "token:" prefix.
    let p = checker.authenticate("token", format!("token:{token}").as_bytes())?;
    assert_eq!(p.role, "app");
    assert!(matches!(
        checker.authenticate("basic", token.as_bytes()),
        Err(AuthError::UnsupportedMethod(_))
    ));
    // Another secret's token is a forgery.
    let other = create_token(&Signer::Secret(new_secret_key()), "app", None)?;
    assert!(matches!(
        checker.check(&other),
        Err(AuthError::InvalidToken(_))
    ));
    assert!(!format!("{checker:?}").contains(&format!("{secret:?}")));
    Ok(())
}

#[test]
fn expiry_is_enforced_and_remembered() -> Result<(), Box<dyn std::error::Error>> {
    let secret = new_secret_key();
    let checker = JwtAuthenticator::with_secret_key(&b64(&secret), rules())?;
    let signer = Signer::Secret(secret);
    let live = checker.check(&create_token(
        &signer,
        "app",
        Some(Duration::from_secs(3600)),
    )?)?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let exp = live.expires_at.ok_or("exp is remembered")?;
    assert!(exp > now + 3500 && exp <= now + 3601, "{exp} vs {now}");
    assert!(!live.expired_at(now) && live.expired_at(exp));
    // Expired a few seconds ago: no leeway.
    let expired = unsigned_hs(&signer, &format!(r#"{{"sub":"app","exp":{}}}"#, now - 5))?;
    assert_eq!(checker.check(&expired), Err(AuthError::Expired));
    Ok(())
}

/// An HS256 token with arbitrary claims.
fn unsigned_hs(signer: &Signer, claims: &str) -> Result<String, Box<dyn std::error::Error>> {
    let Signer::Secret(secret) = signer else {
        return Err("needs a secret".into());
    };
    let claims: serde_json::Value = serde_json::from_str(claims)?;
    Ok(jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret),
    )?)
}

#[test]
fn key_pairs_of_each_family_round_trip() -> Result<(), Box<dyn std::error::Error>> {
    for alg in [Algorithm::RS256, Algorithm::ES256, Algorithm::ES384] {
        let (private, public) = new_key_pair(alg)?;
        let checker = JwtAuthenticator::with_public_key(&b64(&public), alg, rules())?;
        let token = create_token(&Signer::Private(private.clone(), alg), "svc", None)?;
        assert_eq!(checker.check(&token)?.role, "svc", "{alg:?}");
        // PEM files work as well as DER.
        let pem_public = as_pem(&public, "PUBLIC KEY");
        let pem_checker = JwtAuthenticator::with_public_key(&b64(&pem_public), alg, rules())?;
        assert_eq!(pem_checker.check(&token)?.role, "svc");
        // Another key pair's token is refused.
        let (other, _) = new_key_pair(alg)?;
        let forged = create_token(&Signer::Private(other, alg), "svc", None)?;
        assert!(checker.check(&forged).is_err(), "{alg:?}");
    }
    Ok(())
}

#[test]
fn forgeries_are_refused() -> Result<(), Box<dyn std::error::Error>> {
    let (private, public) = new_key_pair(Algorithm::RS256)?;
    let checker = JwtAuthenticator::with_public_key(&b64(&public), Algorithm::RS256, rules())?;
    // alg: none, with and without a signature part.
    for sig in ["", "AAAA"] {
        let none = unsigned(r#"{"alg":"none","typ":"JWT"}"#, r#"{"sub":"root"}"#, sig);
        assert!(checker.check(&none).is_err(), "alg none accepted");
    }
    // Key confusion: an HS256 token whose HMAC key is the public key's bytes.
    for key_bytes in [public.clone(), as_pem(&public, "PUBLIC KEY")] {
        let confused = create_token(&Signer::Secret(key_bytes), "root", None)?;
        assert!(matches!(
            checker.check(&confused),
            Err(AuthError::InvalidToken(_))
        ));
    }
    // The right key, another family's algorithm: an ES256 authenticator refuses RSA tokens.
    let (_, ec_public) = new_key_pair(Algorithm::ES256)?;
    let ec_checker =
        JwtAuthenticator::with_public_key(&b64(&ec_public), Algorithm::ES256, rules())?;
    let rsa_token = create_token(
        &Signer::Private(private.clone(), Algorithm::RS256),
        "a",
        None,
    )?;
    assert!(ec_checker.check(&rsa_token).is_err());
    // A tampered payload.
    let token = create_token(&Signer::Private(private, Algorithm::RS256), "app", None)?;
    let parts: Vec<&str> = token.split('.').collect();
    let evil = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(r#"{"sub":"root"}"#);
    let tampered = format!("{}.{}.{}", parts[0], evil, parts[2]);
    assert!(matches!(
        checker.check(&tampered),
        Err(AuthError::InvalidToken(_))
    ));
    // Garbage.
    assert!(checker.check("not-a-jwt").is_err());
    // A public key is not an HMAC secret.
    assert!(JwtAuthenticator::with_public_key(&b64(&public), Algorithm::HS256, rules()).is_err());
    // An RSA key declared as EC does not load.
    assert!(JwtAuthenticator::with_public_key(&b64(&public), Algorithm::ES256, rules()).is_err());
    Ok(())
}

#[test]
fn role_claim_and_audience_rules() -> Result<(), Box<dyn std::error::Error>> {
    let secret = new_secret_key();
    let signer = Signer::Secret(secret.clone());
    let custom = JwtRules {
        role_claim: "role".into(),
        audience: Some("ledgerlake".into()),
    };
    let checker = JwtAuthenticator::with_secret_key(&b64(&secret), custom)?;
    let good = unsigned_hs(&signer, r#"{"role":"ops","aud":"ledgerlake"}"#)?;
    assert_eq!(checker.check(&good)?.role, "ops");
    let wrong_aud = unsigned_hs(&signer, r#"{"role":"ops","aud":"elsewhere"}"#)?;
    assert!(matches!(
        checker.check(&wrong_aud),
        Err(AuthError::InvalidToken(_))
    ));
    let no_aud = unsigned_hs(&signer, r#"{"role":"ops"}"#)?;
    assert!(checker.check(&no_aud).is_err());
    let no_role = unsigned_hs(&signer, r#"{"sub":"ops","aud":"ledgerlake"}"#)?;
    assert!(matches!(
        checker.check(&no_role),
        Err(AuthError::InvalidToken(_))
    ));
    // Not valid yet.
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let early = unsigned_hs(
        &signer,
        &format!(r#"{{"role":"ops","aud":"ledgerlake","nbf":{}}}"#, now + 600),
    )?;
    assert!(checker.check(&early).is_err());
    Ok(())
}

#[test]
fn key_files_are_read_from_paths_and_inline() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("secret.key");
    std::fs::write(&path, b"0123456789abcdef0123456789abcdef")?;
    let plain = read_key(&path.display().to_string())?;
    let url = read_key(&format!("file://{}", path.display()))?;
    assert_eq!(plain, url);
    assert_eq!(read_key(&b64(&plain))?, plain);
    assert!(matches!(
        read_key(&dir.path().join("missing").display().to_string()),
        Err(KeyError::Read { .. })
    ));
    let empty = dir.path().join("empty");
    std::fs::write(&empty, b"")?;
    assert!(JwtAuthenticator::with_secret_key(&empty.display().to_string(), rules()).is_err());
    let (header, claims) = inspect(&create_token(&Signer::Secret(plain), "x", None)?)?;
    assert_eq!(header["alg"], "HS256");
    assert_eq!(claims["sub"], "x");
    Ok(())
}
