//! Count limits through Pulsar's paths, each `GET|POST|DELETE` with a count in the body (0 = no
//! limit; GET answers `null` when unset); a topic's setting wins over its namespace's, changes
//! apply to loaded topics before the answer, and tenant admins may set them:
//!
//! | namespace `/admin/v2/namespaces/{t}/{ns}/…` | topic `/admin/v2/persistent/{t}/{ns}/{topic}/…` | effect |
//! |---|---|---|
//! | `maxProducersPerTopic` | `maxProducers` | PRODUCER beyond it: `ProducerBusy` "Topic reached max producers limit" |
//! | `maxConsumersPerTopic` | `maxConsumers` | SUBSCRIBE beyond it: `ConsumerBusy` "Topic reached max consumers limit" |
//! | `maxConsumersPerSubscription` | `maxConsumersPerSubscription` | `ConsumerBusy` "Subscription reached max consumers limit" |
//! | `maxUnackedMessagesPerConsumer` | `maxUnackedMessagesOnConsumer` | Shared/Key_Shared dispatch to the consumer pauses, resumes at half |
//! | `maxUnackedMessagesPerSubscription` | `maxUnackedMessagesOnSubscription` | the subscription's dispatch pauses, resumes at half |
//! | `maxTopicsPerNamespace` | — | creating a topic beyond it: `NotAllowedError` / HTTP 412 |
//!
//! Connected clients stay when a limit is lowered; the unacked limits default to the broker's
//! (`broker.max_unacked_messages_per_*`).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};

use super::error::AdminError;
use super::namespaces::{update, update_topic};
use super::Routes;
use super::{namespace_path, topic_path, AdminState};
use crate::policies::NamespacePolicies;

/// One limit's field in the policies blob.
type Field = fn(&mut NamespacePolicies) -> &mut Option<u32>;

/// (namespace path segment, topic path segment, field).
const LIMITS: [(&str, Option<&str>, Field); 6] = [
    ("maxProducersPerTopic", Some("maxProducers"), |p| {
        &mut p.max_producers
    }),
    ("maxConsumersPerTopic", Some("maxConsumers"), |p| {
        &mut p.max_consumers
    }),
    (
        "maxConsumersPerSubscription",
        Some("maxConsumersPerSubscription"),
        |p| &mut p.max_consumers_per_subscription,
    ),
    (
        "maxUnackedMessagesPerConsumer",
        Some("maxUnackedMessagesOnConsumer"),
        |p| &mut p.max_unacked_per_consumer,
    ),
    (
        "maxUnackedMessagesPerSubscription",
        Some("maxUnackedMessagesOnSubscription"),
        |p| &mut p.max_unacked_per_subscription,
    ),
    ("maxTopicsPerNamespace", None, |p| &mut p.max_topics),
];

pub(super) fn routes() -> Router<AdminState> {
    let mut router = Router::new();
    for (ns_segment, topic_segment, field) in LIMITS {
        router = router.at(
            &format!("/admin/v2/namespaces/{{tenant}}/{{namespace}}/{ns_segment}"),
            get(move |s, p| get_ns(s, p, field))
                .post(move |s, p, body| set_ns(s, p, body, field))
                .delete(move |s, p| delete_ns(s, p, field)),
        );
        if let Some(segment) = topic_segment {
            router = router.at(
                &format!("/admin/v2/persistent/{{tenant}}/{{namespace}}/{{topic}}/{segment}"),
                get(move |s, p| get_topic(s, p, field))
                    .post(move |s, p, body| set_topic(s, p, body, field))
                    .delete(move |s, p| delete_topic(s, p, field)),
            );
        }
    }
    router
}

fn count(body: &str) -> Result<u32, AdminError> {
    body.trim().parse::<u32>().map_err(|_| {
        AdminError::BadRequest(format!("expected a count (0 = no limit), got '{body}'"))
    })
}

async fn get_ns(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
    field: Field,
) -> Result<Json<Option<u32>>, AdminError> {
    let ns = namespace_path(&t, &n)?;
    let mut p = s.ops()?.namespace_policies(&ns).await?;
    Ok(Json(*field(&mut p)))
}

async fn set_ns(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
    body: String,
    field: Field,
) -> Result<StatusCode, AdminError> {
    let v = count(&body)?;
    update(&s, &t, &n, |p| *field(p) = Some(v)).await
}

async fn delete_ns(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
    field: Field,
) -> Result<StatusCode, AdminError> {
    update(&s, &t, &n, |p| *field(p) = None).await
}

async fn get_topic(
    State(s): State<AdminState>,
    Path((t, n, topic)): Path<(String, String, String)>,
    field: Field,
) -> Result<Json<Option<u32>>, AdminError> {
    let name = topic_path(&t, &n, &topic)?.base();
    let mut p = s.ops()?.topic_policies(&name).await?;
    Ok(Json(*field(&mut p)))
}

async fn set_topic(
    State(s): State<AdminState>,
    Path((t, n, topic)): Path<(String, String, String)>,
    body: String,
    field: Field,
) -> Result<StatusCode, AdminError> {
    let v = count(&body)?;
    update_topic(&s, (&t, &n, &topic), |p| *field(p) = Some(v)).await
}

async fn delete_topic(
    State(s): State<AdminState>,
    Path((t, n, topic)): Path<(String, String, String)>,
    field: Field,
) -> Result<StatusCode, AdminError> {
    update_topic(&s, (&t, &n, &topic), |p| *field(p) = None).await
}
