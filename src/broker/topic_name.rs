//! Topic names as Pulsar parses them: `x` → `persistent://public/default/x`,
//! `tenant/ns/x` → `persistent://tenant/ns/x`, full `persistent://tenant/ns/x`; a
//! `-partition-N` suffix names partition N of a partitioned topic.

use std::fmt;
use std::str::FromStr;

/// A parsed topic name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TopicName {
    /// `true` for `persistent://`, `false` for `non-persistent://`.
    pub persistent: bool,
    /// Tenant.
    pub tenant: String,
    /// Namespace (within the tenant).
    pub namespace: String,
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

/// Whether `s` is a valid tenant, namespace or local-name part.
pub(crate) fn valid_part(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '=' | ':' | '.'))
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
        if !valid_part(tenant) || !valid_part(namespace) {
            return Err(err("tenant and namespace allow [A-Za-z0-9_-=:.]"));
        }
        if local.is_empty() {
            return Err(err("empty topic name"));
        }
        Ok(TopicName {
            persistent,
            tenant: tenant.to_string(),
            namespace: namespace.to_string(),
            local: local.to_string(),
        })
    }
}

impl TopicName {
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
        write!(
            f,
            "{domain}://{}/{}/{}",
            self.tenant, self.namespace, self.local
        )
    }
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
    fn refusals() {
        for bad in [
            "",
            "a/b",
            "a/b/c/d",
            "http://a/b/c",
            "t!/n/x",
            "persistent://t/n/",
            "persistent://x",
        ] {
            assert!(bad.parse::<TopicName>().is_err(), "{bad} accepted");
        }
    }
}
