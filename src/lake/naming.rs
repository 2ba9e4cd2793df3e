//! From Pulsar names to Iceberg identifiers, reversibly.
//!
//! A topic `persistent://<tenant>/<namespace>/<local>` (a partitioned topic's partitions all
//! share the table of the base name) becomes the table `<local'>` in the nested Iceberg
//! namespace `[<tenant'>, <namespace'>]`, where `'` is this sanitising rule, applied to the
//! UTF-8 bytes of each part:
//!
//! - `a`–`z` and `0`–`9` stay as they are;
//! - `-` becomes `_` when the next byte stays as it is or the name ends there;
//! - every other byte (including `_`, `.`, upper-case letters and a `-` before such a byte)
//!   becomes `__` followed by its two lower-case hex digits.
//!
//! So `orders` → `orders`, `my-topic` → `my_topic`, `my_topic` → `my__5ftopic`,
//! `Orders.v1` → `__4frders__2ev1`. Decoding reads `__hh` as one byte and a lone `_` as `-`,
//! which is unambiguous because a lone `_` is never followed by `_`. The output is always a
//! lower-case identifier that every SQL engine accepts unquoted, and contains no `.` (the SQL
//! catalog joins namespace levels with `.`).
//!
//! The encoding itself lives in [`crate::naming`], which also refuses a name whose encoded
//! part would pass [`crate::naming::MAX_ENCODED_PART`] bytes (one directory or object-key
//! segment of the warehouse).
//!
//! A namespace whose `lakeTableLayout` is `shared` keeps every topic in one table,
//! [`SHARED_TABLE`], whose rows carry their base topic's local name in the `topic` column.
//! That name can never be a topic's: `__` is always followed by two hex digits in an encoded
//! part, and `t` is not one.

use iceberg::{NamespaceIdent, TableIdent};

use crate::config::LakeTableLayout;
use crate::naming::TopicName;

/// The table of a namespace whose layout is `shared`.
pub const SHARED_TABLE: &str = "__topics";

/// Where a topic's rows live.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TopicTable {
    /// The Iceberg table.
    pub ident: TableIdent,
    /// In a shared table, the `topic` column of this topic's rows (its base topic's local
    /// name); `None` when the table is the topic's own.
    pub topic: Option<String>,
}

impl TopicTable {
    /// The table of `topic` (of its base topic) under `layout`.
    pub fn of(topic: &TopicName, layout: LakeTableLayout) -> TopicTable {
        match layout {
            LakeTableLayout::PerTopic => TopicTable {
                ident: table_ident(topic),
                topic: None,
            },
            LakeTableLayout::Shared => {
                let base = topic.base();
                TopicTable {
                    ident: TableIdent::new(
                        namespace_ident(&base.namespace.tenant, &base.namespace.name),
                        SHARED_TABLE.to_string(),
                    ),
                    topic: Some(base.local),
                }
            }
        }
    }

    /// Whether the table holds other topics too.
    pub fn is_shared(&self) -> bool {
        self.topic.is_some()
    }
}

/// Whether `ident` is a namespace's shared table.
pub fn is_shared_table(ident: &TableIdent) -> bool {
    ident.name() == SHARED_TABLE
}

pub use crate::naming::{decode_part, encode_part, NotEncoded};

/// The Iceberg namespace of a Pulsar namespace.
pub fn namespace_ident(tenant: &str, namespace: &str) -> NamespaceIdent {
    // Both parts are non-empty, so the identifier is valid.
    NamespaceIdent::from_vec(vec![encode_part(tenant), encode_part(namespace)])
        .unwrap_or_else(|_| NamespaceIdent::new(encode_part(tenant)))
}

/// The Iceberg table of a topic (the base topic of a partition).
pub fn table_ident(topic: &TopicName) -> TableIdent {
    let base = topic.base();
    TableIdent::new(
        namespace_ident(&base.namespace.tenant, &base.namespace.name),
        encode_part(&base.local),
    )
}

/// The topic (base name, `persistent://`) a table identifier stands for.
pub fn topic_of(ident: &TableIdent) -> Result<String, NotEncoded> {
    let levels = ident.namespace().as_ref();
    if levels.len() != 2 {
        return Err(NotEncoded(levels.join(".")));
    }
    Ok(format!(
        "persistent://{}/{}/{}",
        decode_part(&levels[0])?,
        decode_part(&levels[1])?,
        decode_part(ident.name())?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::naming::keeps;
    use proptest::prelude::*;

    #[test]
    fn documented_examples() {
        assert_eq!(encode_part("orders"), "orders");
        assert_eq!(encode_part("my-topic"), "my_topic");
        assert_eq!(encode_part("my_topic"), "my__5ftopic");
        assert_eq!(encode_part("Orders.v1"), "__4frders__2ev1");
        assert_eq!(encode_part("a--b"), "a__2d_b");
        assert_eq!(encode_part("end-"), "end_");
        assert_eq!(decode_part("my_topic").as_deref(), Ok("my-topic"));
    }

    #[test]
    fn non_canonical_spellings_are_refused() {
        for bad in ["__61", "a__2db", "x.y", "A", "__zz", "__5"] {
            assert!(decode_part(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn table_of_a_partition_is_the_table_of_its_base() -> Result<(), Box<dyn std::error::Error>> {
        let p: TopicName = "persistent://acme/eu-west/clicks-partition-3".parse()?;
        let t = table_ident(&p);
        assert_eq!(
            t.namespace().as_ref(),
            &vec!["acme".to_string(), "eu_west".into()]
        );
        assert_eq!(t.name(), "clicks");
        assert_eq!(topic_of(&t)?, "persistent://acme/eu-west/clicks");
        Ok(())
    }

    #[test]
    fn shared_tables_never_collide_with_a_topic_table() -> Result<(), Box<dyn std::error::Error>> {
        assert!(decode_part(SHARED_TABLE).is_err());
        let p: TopicName = "persistent://acme/eu-west/clicks-partition-3".parse()?;
        let t = TopicTable::of(&p, LakeTableLayout::Shared);
        assert_eq!(t.ident.name(), SHARED_TABLE);
        assert_eq!(t.topic.as_deref(), Some("clicks"));
        assert!(topic_of(&t.ident).is_err());
        let own = TopicTable::of(&p, LakeTableLayout::PerTopic);
        assert_eq!(own.ident, table_ident(&p));
        assert!(!own.is_shared());
        Ok(())
    }

    proptest! {
        #[test]
        fn round_trip(s in "[a-zA-Z0-9_.=:-]{1,24}|\\PC{1,8}") {
            let e = encode_part(&s);
            prop_assert!(e.bytes().all(|b| keeps(b) || b == b'_'), "{}", e);
            prop_assert_eq!(decode_part(&e), Ok(s));
        }
    }
}
