//! How far a policy change reaches: which loaded topics it can concern. The operations layer
//! names the reach of each change it makes, the follower of other nodes' changes
//! (`ops/follow.rs`) reads it from the changed scope, and the broker puts the policies in
//! force on the topics the reach covers, not on every loaded topic.

use crate::naming::{NamespaceName, TopicName};

/// Which loaded topics a policy change can concern: the broker puts the policies in force on
/// those alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// Every topic (a resource group changed, or a change that names nothing this node knows).
    All,
    /// The topics of one tenant (its resource group).
    Tenant(String),
    /// The topics of one namespace.
    Namespace(NamespaceName),
    /// One topic, every partition of it (its base name).
    Topic(TopicName),
}

impl Reach {
    /// Whether a change of this reach can concern `topic`.
    pub fn covers(&self, topic: &TopicName) -> bool {
        match self {
            Reach::All => true,
            Reach::Tenant(tenant) => topic.namespace.tenant == *tenant,
            Reach::Namespace(ns) => topic.namespace == *ns,
            Reach::Topic(base) => topic.base() == *base,
        }
    }
}
