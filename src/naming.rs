//! Names every layer shares (the leaf of the module graph: it imports nothing of ours).
//!
//! - [`TopicName`], as Pulsar parses topic names: `x` → `persistent://public/default/x`,
//!   `tenant/ns/x` → `persistent://tenant/ns/x`, full `persistent://tenant/ns/x`; a
//!   `-partition-N` suffix names partition N of a partitioned topic.
//! - [`NamespaceName`]: `tenant/namespace`, the unit of policies.
//! - The schema-version codec: versions travel as 8-byte big-endian ids in PRODUCER_SUCCESS
//!   and in every message's metadata, and the lake stores them as numbers.
//!
//! Invariant: a value of these types was validated when built; its `Display` form parses back
//! to the same value.

use std::fmt;
use std::str::FromStr;

/// A namespace: `tenant/namespace`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamespaceName {
    /// Tenant.
    pub tenant: String,
    /// Namespace within the tenant.
    pub name: String,
}

/// A parsed topic name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TopicName {
    /// `true` for `persistent://`, `false` for `non-persistent://`.
    pub persistent: bool,
    /// Its namespace.
    pub namespace: NamespaceName,
    /// Local name, including any `-partition-N` suffix.
    pub local: String,
}

/// Why a topic name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid topic name '{name}': {reason}")]
pub struct TopicNameError {
    /// The name given.
    pub name: String,
    /// Why.
    pub reason: &'static str,
}

const PARTITION_SUFFIX: &str = "-partition-";

/// Why a namespace name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid namespace name '{0}': expected tenant/namespace of [A-Za-z0-9_-=:.], each short \
     enough for a lake directory name"
)]
pub struct NamespaceNameError(pub String);

/// Whether `s` is a valid tenant, namespace or local-name part.
pub fn valid_part(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '=' | ':' | '.'))
        && fits_the_lake(s)
}

impl NamespaceName {
    /// The namespace `tenant/name`, checked.
    pub fn new(tenant: &str, name: &str) -> Result<Self, NamespaceNameError> {
        if valid_part(tenant) && valid_part(name) {
            Ok(NamespaceName {
                tenant: tenant.to_string(),
                name: name.to_string(),
            })
        } else {
            Err(NamespaceNameError(format!("{tenant}/{name}")))
        }
    }
}

impl FromStr for NamespaceName {
    type Err = NamespaceNameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('/') {
            Some((tenant, name)) => NamespaceName::new(tenant, name),
            None => Err(NamespaceNameError(s.to_string())),
        }
    }
}

impl fmt::Display for NamespaceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tenant, self.name)
    }
}

/// Encodes a schema version as it travels in the protocol (8 bytes, big-endian).
pub fn schema_version_bytes(version: u64) -> Vec<u8> {
    version.to_be_bytes().to_vec()
}

/// Decodes a schema version as it travels in the protocol (`None` unless 8 bytes).
pub fn schema_version_from_bytes(b: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(b.try_into().ok()?))
}

impl FromStr for TopicName {
    type Err = TopicNameError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        let err = |reason| TopicNameError {
            name: name.to_string(),
            reason,
        };
        let (persistent, rest) = if let Some(r) = name.strip_prefix("persistent://") {
            (true, r)
        } else if let Some(r) = name.strip_prefix("non-persistent://") {
            (false, r)
        } else if name.contains("://") {
            return Err(err(
                "unknown domain (use persistent:// or non-persistent://)",
            ));
        } else {
            (true, name)
        };
        let parts: Vec<&str> = rest.split('/').collect();
        let (tenant, namespace, local) = match (name.contains("://"), parts.as_slice()) {
            (false, [local]) => ("public", "default", *local),
            (_, [tenant, namespace, local]) => (*tenant, *namespace, *local),
            _ => return Err(err("expected tenant/namespace/topic")),
        };
        let Ok(namespace) = NamespaceName::new(tenant, namespace) else {
            return Err(err("tenant and namespace allow [A-Za-z0-9_-=:.]"));
        };
        if local.is_empty() {
            return Err(err("empty topic name"));
        }
        if local.chars().any(char::is_control) {
            return Err(err("control characters are not allowed in a topic name"));
        }
        if !fits_the_lake(local) {
            return Err(err(
                "the topic name is too long (its lake table name would pass 255 bytes)",
            ));
        }
        Ok(TopicName {
            persistent,
            namespace,
            local: local.to_string(),
        })
    }
}

impl TopicName {
    /// The persistent topic `local` of `namespace`, checked.
    pub fn persistent(namespace: &NamespaceName, local: &str) -> Result<Self, TopicNameError> {
        format!("persistent://{namespace}/{local}").parse()
    }

    /// Partition index if the local name ends in `-partition-N`.
    pub fn partition(&self) -> Option<u32> {
        let i = self.local.rfind(PARTITION_SUFFIX)?;
        self.local[i + PARTITION_SUFFIX.len()..].parse().ok()
    }

    /// The partitioned topic this partition belongs to (itself when not a partition).
    pub fn base(&self) -> TopicName {
        match (self.partition(), self.local.rfind(PARTITION_SUFFIX)) {
            (Some(_), Some(i)) => TopicName {
                local: self.local[..i].to_string(),
                ..self.clone()
            },
            _ => self.clone(),
        }
    }

    /// Name of partition `i` of this topic.
    pub fn partition_name(&self, i: u32) -> TopicName {
        TopicName {
            local: format!("{}{PARTITION_SUFFIX}{i}", self.local),
            ..self.clone()
        }
    }
}

impl fmt::Display for TopicName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let domain = if self.persistent {
            "persistent"
        } else {
            "non-persistent"
        };
        write!(f, "{domain}://{}/{}", self.namespace, self.local)
    }
}

/// Longest a name part may be once encoded for the lake ([`encode_part`]): a directory name
/// or object-key segment of the warehouse (255 bytes on Linux file systems).
pub const MAX_ENCODED_PART: usize = 255;

/// Whether `part`'s lake encoding fits [`MAX_ENCODED_PART`].
fn fits_the_lake(part: &str) -> bool {
    encode_part(part).len() <= MAX_ENCODED_PART
}

/// Bytes the lake encoding keeps as they are.
pub(crate) fn keeps(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// Encodes one name part for the lake (the rule is described in `lake::naming`).
pub fn encode_part(part: &str) -> String {
    let bytes = part.as_bytes();
    let mut out = String::with_capacity(bytes.len() + 8);
    for (i, &b) in bytes.iter().enumerate() {
        if keeps(b) {
            out.push(b as char);
        } else if b == b'-' && bytes.get(i + 1).is_none_or(|&n| keeps(n)) {
            out.push('_');
        } else {
            out.push_str(&format!("__{b:02x}"));
        }
    }
    out
}

/// Why an identifier is not the encoding of any name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a ledgerlake-encoded name")]
pub struct NotEncoded(pub String);

/// Decodes one part; the inverse of [`encode_part`].
pub fn decode_part(encoded: &str) -> Result<String, NotEncoded> {
    let bad = || NotEncoded(encoded.to_string());
    let b = encoded.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            c if keeps(c) => {
                out.push(c);
                i += 1;
            }
            b'_' if b.get(i + 1) == Some(&b'_') => {
                let hex = encoded.get(i + 2..i + 4).ok_or_else(bad)?;
                if hex.bytes().any(|h| h.is_ascii_uppercase()) {
                    return Err(bad());
                }
                let byte = u8::from_str_radix(hex, 16).map_err(|_| bad())?;
                // Canonical form only: bytes that have a shorter spelling are not escaped.
                let next_keeps = b.get(i + 4).is_none_or(|&n| keeps(n));
                if keeps(byte) || (byte == b'-' && next_keeps) {
                    return Err(bad());
                }
                out.push(byte);
                i += 4;
            }
            b'_' => {
                out.push(b'-');
                i += 1;
            }
            _ => return Err(bad()),
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_full_forms() -> Result<(), TopicNameError> {
        assert_eq!(
            "x".parse::<TopicName>()?.to_string(),
            "persistent://public/default/x"
        );
        assert_eq!(
            "t/n/x".parse::<TopicName>()?.to_string(),
            "persistent://t/n/x"
        );
        assert_eq!(
            "persistent://t/n/x".parse::<TopicName>()?.to_string(),
            "persistent://t/n/x"
        );
        let p: TopicName = "persistent://t/n/orders-partition-3".parse()?;
        assert_eq!(p.partition(), Some(3));
        assert_eq!(p.base().to_string(), "persistent://t/n/orders");
        assert_eq!(p.base().partition_name(3), p);
        assert_eq!("x".parse::<TopicName>()?.partition(), None);
        Ok(())
    }

    #[test]
    fn namespaces() -> Result<(), NamespaceNameError> {
        let ns: NamespaceName = "t/n".parse()?;
        assert_eq!(ns, NamespaceName::new("t", "n")?);
        assert_eq!(ns.to_string(), "t/n");
        for bad in ["t", "t/", "/n", "t/n/x", "t!/n"] {
            assert!(bad.parse::<NamespaceName>().is_err(), "{bad} accepted");
        }
        let topic =
            TopicName::persistent(&ns, "x").map_err(|e| NamespaceNameError(e.to_string()))?;
        assert_eq!(topic.to_string(), "persistent://t/n/x");
        assert_eq!(topic.namespace, ns);
        Ok(())
    }

    #[test]
    fn schema_versions_round_trip() {
        for v in [0, 1, 7, u64::MAX] {
            assert_eq!(schema_version_from_bytes(&schema_version_bytes(v)), Some(v));
        }
        assert_eq!(schema_version_from_bytes(&[1, 2, 3]), None);
    }

    proptest::proptest! {
        #[test]
        fn topic_names_print_and_parse_back(
            tenant in "[a-z0-9_=:.-]{1,12}",
            ns in "[A-Z0-9_=:.-]{1,12}",
            local in "[^/\\p{Cc}]{1,15}",
            persistent in proptest::bool::ANY,
        ) {
            let domain = if persistent { "persistent" } else { "non-persistent" };
            let full = format!("{domain}://{tenant}/{ns}/{local}");
            let parsed: TopicName = full.parse().map_err(|e| proptest::test_runner::TestCaseError::fail(format!("{e}")))?;
            proptest::prop_assert_eq!(parsed.to_string(), full);
            proptest::prop_assert_eq!(parsed.namespace.to_string(), format!("{tenant}/{ns}"));
        }
    }

    #[test]
    fn refusals() {
        for bad in [
            "",
            "a/b",
            "a/b/c/d",
            "http://a/b/c",
            "t!/n/x",
            "persistent://t/n/",
            "persistent://x",
            "t/n/a\u{0}b",
            "t/n/line\nbreak",
            "t/n/\u{85}",
        ] {
            assert!(bad.parse::<TopicName>().is_err(), "{bad} accepted");
        }
        // Names whose lake encoding would not fit one directory name.
        let long = "Lo".repeat(60);
        assert!(format!("t/n/{long}").parse::<TopicName>().is_err());
        assert!(format!("{long}/n/x").parse::<TopicName>().is_err());
        assert!(format!("t/n/{}", "z".repeat(255))
            .parse::<TopicName>()
            .is_ok());
        assert!(format!("t/n/{}", "z".repeat(256))
            .parse::<TopicName>()
            .is_err());
    }
}
