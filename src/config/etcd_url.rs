//! `etcd://host:port[,host:port…][/prefix]` URLs of `metadata.url`, parsed where the
//! configuration is validated and where the store connects.

/// Prefix used when the URL names none.
pub const DEFAULT_PREFIX: &str = "/ledgerlake";

/// An etcd URL split into endpoints and key prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdUrl {
    /// `http://host:port` of each member.
    pub endpoints: Vec<String>,
    /// Prefix of every key, without a trailing `/`.
    pub prefix: String,
}

impl EtcdUrl {
    /// Parses `etcd://host:port[,host:port…][/prefix]`.
    pub fn parse(url: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("'{url}': {why}");
        let rest = url
            .strip_prefix("etcd://")
            .ok_or_else(|| bad("expected etcd://host:port[,host:port…][/prefix]"))?;
        let (hosts, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, DEFAULT_PREFIX),
        };
        let prefix = if prefix.is_empty() {
            DEFAULT_PREFIX
        } else {
            prefix
        };
        let mut endpoints = Vec::new();
        for host in hosts.split(',') {
            let (name, port) = host
                .rsplit_once(':')
                .ok_or_else(|| bad("every member needs host:port"))?;
            if name.is_empty() || port.parse::<u16>().is_err() {
                return Err(bad(&format!("'{host}' is not host:port")));
            }
            endpoints.push(format!("http://{host}"));
        }
        Ok(EtcdUrl {
            endpoints,
            prefix: prefix.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_members_and_prefix() {
        let u = EtcdUrl::parse("etcd://127.0.0.1:2379").ok();
        assert_eq!(
            u,
            Some(EtcdUrl {
                endpoints: vec!["http://127.0.0.1:2379".into()],
                prefix: DEFAULT_PREFIX.into()
            })
        );
        let u = EtcdUrl::parse("etcd://a:1,b:2/team/ll/").ok();
        assert_eq!(
            u,
            Some(EtcdUrl {
                endpoints: vec!["http://a:1".into(), "http://b:2".into()],
                prefix: "/team/ll".into()
            })
        );
        for bad in [
            "http://a:1",
            "etcd://",
            "etcd://a",
            "etcd://a:x",
            "etcd://:1",
            "etcd://a:1,",
        ] {
            assert!(EtcdUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
