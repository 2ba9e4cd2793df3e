#!/usr/bin/env python3
"""Generates schemas/openapi.json (OpenAPI 3.0.3) from this description of the routes in
src/admin/*.rs, ledgerlake's HTTP surface. Run from the repository root after changing a route:

    python3 schemas/openapi.py

`admin::openapi_check` (cargo test) fails while the document and the router disagree."""

import json
import re
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else "schemas/openapi.json"

NS = "/admin/v2/namespaces/{tenant}/{namespace}"
TOPIC = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"
SUB = TOPIC + "/subscription/{subscription}"


def ref(name):
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema):
    if "$ref" in schema:
        return {"allOf": [schema], "nullable": True}
    return {**schema, "nullable": True}


# ---- path parameters ----------------------------------------------------------------------

PATH_PARAMS = {
    "tenant": ({"type": "string"}, "Tenant name."),
    "namespace": ({"type": "string"}, "Namespace name (local part, within the tenant)."),
    "topic": ({"type": "string"},
              "Topic local name (persistent domain); a partition `name-partition-N` where "
              "the operation allows it."),
    "cluster": ({"type": "string"}, "Cluster name."),
    "subscription": ({"type": "string"}, "Subscription name."),
    "group": ({"type": "string"}, "Resource group name."),
    "role": ({"type": "string"}, "Role (principal) name."),
    "n": ({"type": "integer", "format": "int64", "minimum": 0}, "Number of entries."),
    "seconds": ({"type": "integer", "format": "int64", "minimum": 0},
                "Age in seconds: messages older than this expire."),
    "timestamp": ({"type": "integer", "format": "int64"},
                  "Publish time in milliseconds since the epoch."),
}

# Parameters whose meaning depends on the route.
NAME_PARAM = {
    "/admin/v2/tenants/{name}": "Tenant name.",
    "/admin/v2/tenants/{name}/resourcegroup": "Tenant name.",
    "/admin/v2/tenants/{name}/resourcegroup/{group}": "Tenant name.",
    NS + "/permissions/{name}": "Role (principal) name.",
    NS + "/permissions/subscription/{name}": "Subscription name.",
    NS + "/permissions/{name}/{role}": "Subscription name.",
}
ROLE_OVERRIDE = {
    NS + "/permissions/{name}/{role}": "Role to remove from the subscription's allowed roles.",
}


def path_params(path):
    out = []
    for name in re.findall(r"\{([^}]+)\}", path):
        if name == "name":
            schema, desc = {"type": "string"}, NAME_PARAM[path]
        else:
            schema, desc = PATH_PARAMS[name]
            desc = ROLE_OVERRIDE.get(path, desc) if name == "role" else desc
            if name == "n" and path.endswith("/position/{n}"):
                desc = "Position (1-based) of the entry in the subscription's backlog."
        out.append({"name": name, "in": "path", "required": True, "description": desc,
                    "schema": dict(schema)})
    return out


# ---- query parameters ---------------------------------------------------------------------

def q_force(desc):
    return {"name": "force", "in": "query", "required": False, "description": desc,
            "schema": {"type": "boolean", "default": False}}


Q_BACKLOG_TYPE = {
    "name": "backlogQuotaType", "in": "query", "required": False,
    "description": "Which quota (Pulsar's default: destination_storage).",
    "schema": {**ref("BacklogQuotaType")},
}
Q_MESSAGE_TTL = {
    "name": "messageTTL", "in": "query", "required": False,
    "description": "TTL in seconds; when given, the body is ignored.",
    "schema": {"type": "integer", "format": "int64", "minimum": 0, "maximum": 4294967295},
}
Q_PER_PARTITION = {
    "name": "perPartition", "in": "query", "required": False,
    "description": "Include each partition's stats.",
    "schema": {"type": "boolean", "default": True},
}
Q_SUB_MESSAGE_ID = {
    "name": "messageId", "in": "query", "required": False,
    "description": "Where the subscription starts when no MessageId body is sent "
                   "(pulsarctl); default latest.",
    "schema": {"type": "string", "enum": ["earliest", "latest"], "default": "latest"},
}
Q_INITIAL_POSITION = {
    "name": "initialPosition", "in": "query", "required": False,
    "description": "Count from the first entry (earliest) or back from the last (latest).",
    "schema": {"type": "string", "enum": ["earliest", "latest"], "default": "latest"},
}
Q_MESSAGE_POSITION = {
    "name": "messagePosition", "in": "query", "required": False,
    "description": "Position (1-based) of the entry from initialPosition.",
    "schema": {"type": "integer", "format": "int64", "minimum": 0, "default": 1},
}

# ---- request bodies -----------------------------------------------------------------------


def json_body(schema, desc, required=True):
    return {"description": desc, "required": required,
            "content": {"application/json": {"schema": schema}}}


def scalar_body(schema, desc, required=True):
    """A bare scalar: sent as text, or as JSON by Pulsar's Java admin (same text)."""
    return {"description": desc, "required": required,
            "content": {"text/plain": {"schema": schema},
                        "application/json": {"schema": schema}}}


INT64 = {"type": "integer", "format": "int64"}
UINT32 = {"type": "integer", "format": "int64", "minimum": 0, "maximum": 4294967295}
COUNT = {**UINT32, "description": "A count; 0 = no limit."}

# ---- responses ----------------------------------------------------------------------------

ERRORS = {
    400: ("BadRequest", "The request is malformed (path names, body, query)."),
    401: ("Unauthorized", "Missing or invalid credentials while authentication is on."),
    403: ("Forbidden", "The principal is not allowed this operation."),
    404: ("NotFound", "The object does not exist."),
    405: ("NotAllowed", "The service does not allow this (forced deletion)."),
    409: ("Conflict", "A conflicting object exists (or the object is not empty)."),
    412: ("PreconditionFailed",
          "A rule of the request is broken, the object is in use, or the feature is disabled."),
    422: ("LimitExceeded", "A limit of the service was reached (query memory or time)."),
    500: ("InternalError", "The metadata store or a dependency failed."),
    501: ("NotImplemented", "Not available in this configuration."),
    503: ("NotReady", "The service is still recovering."),
}

GUARDED_ERRORS = [401, 403, 500, 503]


def ok_json(schema, desc="OK"):
    return {"200": {"description": desc, "content": {"application/json": {"schema": schema}}}}


NO_CONTENT = {"204": {"description": "Done."}}
OK_EMPTY = {"200": {"description": "Done (no body, as Pulsar answers)."}}

# ---- operations ---------------------------------------------------------------------------

PATHS = {}
OP_IDS = set()


def op(method, path, op_id, summary, tag, ok, errors=(), query=(), body=None, open_=False,
       description=None):
    assert op_id not in OP_IDS, op_id
    OP_IDS.add(op_id)
    item = PATHS.setdefault(path, {})
    assert method not in item, (method, path)
    params = path_params(path) + list(query)
    codes = set(errors)
    if not open_:
        codes |= set(GUARDED_ERRORS)
        if "{tenant}" in path or "{namespace}" in path or "{topic}" in path:
            codes.add(400)  # names are checked by the access guard
    if body is not None or re.search(r"\{(n|seconds|timestamp)\}", path):
        codes.add(400)
    responses = dict(ok)
    for c in sorted(codes):
        responses[str(c)] = {"$ref": f"#/components/responses/{ERRORS[c][0]}"}
    o = {"operationId": op_id, "summary": summary, "tags": [tag]}
    if description:
        o["description"] = description
    if params:
        o["parameters"] = params
    if body is not None:
        o["requestBody"] = body
    o["responses"] = responses
    if open_:
        o["security"] = [{}]
    item[method] = o


# Health and metrics (open).
op("get", "/health/live", "getHealthLive", "Liveness: the process is up.", "Health",
   ok_json(ref("HealthStatus"), "Live: `{\"status\": \"live\"}`."), open_=True)
op("get", "/health/ready", "getHealthReady",
   "Readiness: recovery has finished and the service is not shutting down.", "Health",
   {**ok_json(ref("HealthStatus"), "Ready: `{\"status\": \"ready\"}`."),
    "503": {"description": "Not ready: `{\"status\": \"not_ready\"}`.",
            "content": {"application/json": {"schema": ref("HealthStatus")}}}},
   open_=True)
op("get", "/metrics", "getMetrics",
   "Prometheus metrics (Pulsar's topic and subscription families plus ledgerlake's own).",
   "Metrics",
   {"200": {"description": "Prometheus text exposition format 0.0.4.",
            "content": {"text/plain": {"schema": {"type": "string"}}}},
    "412": {"$ref": "#/components/responses/PreconditionFailed"},
    "500": {"$ref": "#/components/responses/InternalError"},
    "503": {"$ref": "#/components/responses/NotReady"}},
   open_=True)

# Clusters (superusers).
op("get", "/admin/v2/clusters", "getClusters", "List the clusters (Pulsar: getClusters).",
   "Clusters", ok_json(ref("StringList"), "Cluster names."))
C = "/admin/v2/clusters/{cluster}"
op("get", C, "getCluster", "Get a cluster's configuration (Pulsar: getCluster).", "Clusters",
   ok_json(ref("ClusterData")), [404])
op("put", C, "createCluster", "Create a cluster (Pulsar: createCluster).", "Clusters", OK_EMPTY,
   [409, 412], body=json_body(ref("ClusterData"), "The cluster's URLs."))
op("post", C, "updateCluster", "Update a cluster's configuration (Pulsar: updateCluster).",
   "Clusters", OK_EMPTY, [404, 412], body=json_body(ref("ClusterData"), "The cluster's URLs."))
op("delete", C, "deleteCluster", "Delete a cluster (Pulsar: deleteCluster).", "Clusters",
   NO_CONTENT, [404, 409, 412])

# Tenants (superusers).
op("get", "/admin/v2/tenants", "getTenants", "List the tenants (Pulsar: getTenants).",
   "Tenants", ok_json(ref("StringList"), "Tenant names."))
T = "/admin/v2/tenants/{name}"
op("get", T, "getTenant", "Get a tenant's admin roles and allowed clusters (Pulsar: getTenantAdmin).",
   "Tenants", ok_json(ref("TenantInfo")), [400, 404])
op("put", T, "createTenant", "Create a tenant (Pulsar: createTenant).", "Tenants", NO_CONTENT,
   [409, 412], body=json_body(ref("TenantInfo"), "Admin roles and allowed clusters."))
op("post", T, "updateTenant", "Update a tenant's admin roles and allowed clusters (Pulsar: updateTenant).",
   "Tenants", NO_CONTENT, [404, 412],
   body=json_body(ref("TenantInfo"), "Admin roles and allowed clusters."))
op("delete", T, "deleteTenant", "Delete a tenant without namespaces (Pulsar: deleteTenant).",
   "Tenants", NO_CONTENT, [404, 405, 409],
   query=[q_force("Pulsar's forced deletion: refused (405).")])

# Namespaces and topic listings.
op("get", "/admin/v2/namespaces/{tenant}", "getTenantNamespaces",
   "List a tenant's namespaces (Pulsar: getTenantNamespaces).", "Namespaces",
   ok_json(ref("StringList"), "Namespaces as `tenant/namespace`."), [404])
op("get", "/admin/v2/persistent/{tenant}/{namespace}", "getTopicList",
   "List a namespace's persistent topics and partitions (Pulsar: getList).", "Topics",
   ok_json(ref("StringList"), "Full topic names."), [404])
op("get", "/admin/v2/persistent/{tenant}/{namespace}/partitioned", "getPartitionedTopicList",
   "List a namespace's partitioned topics (Pulsar: getPartitionedTopicList).", "Topics",
   ok_json(ref("StringList"), "Full topic names."), [404])
op("get", NS, "getNamespacePolicies", "Get a namespace's policies (Pulsar: getPolicies).",
   "Namespaces", ok_json(ref("NamespacePolicies")), [404])
op("put", NS, "createNamespace", "Create a namespace, optionally with policies (Pulsar: createNamespace).",
   "Namespaces", NO_CONTENT, [404, 409, 412],
   body=json_body(ref("NamespaceCreatePolicies"),
                  "Optional Pulsar `Policies`: grants, clusters, subscription auth mode, "
                  "retention and deduplication are taken from it.", required=False))
op("delete", NS, "deleteNamespace", "Delete a namespace without topics (Pulsar: deleteNamespace).",
   "Namespaces", NO_CONTENT, [404, 405, 409],
   query=[q_force("Pulsar's forced deletion: refused (405).")])

# Offload policies, partitioning, retention, deduplication.
op("get", NS + "/offloadThreshold", "getOffloadThreshold",
   "Get the namespace's offload size threshold in bytes (Pulsar: getOffloadThreshold).",
   "Namespaces", ok_json({**INT64, "description": "Bytes; 0 = when a ledger seals; negative = never by size."}),
   [404])
op("put", NS + "/offloadThreshold", "setOffloadThreshold",
   "Set the namespace's offload size threshold in bytes (Pulsar: setOffloadThreshold).",
   "Namespaces", NO_CONTENT, [404],
   body=scalar_body(INT64, "Bytes; 0 = as soon as a ledger seals; negative = never by size."))
op("get", NS + "/offloadThresholdInSeconds", "getOffloadThresholdInSeconds",
   "Get the namespace's offload age threshold in seconds (Pulsar: getOffloadThresholdInSeconds).",
   "Namespaces", ok_json({**INT64, "description": "Seconds; negative = off."}), [404])
op("put", NS + "/offloadThresholdInSeconds", "setOffloadThresholdInSeconds",
   "Set the namespace's offload age threshold in seconds (Pulsar: setOffloadThresholdInSeconds).",
   "Namespaces", NO_CONTENT, [404], body=scalar_body(INT64, "Seconds; negative = off."))
op("get", NS + "/offloadDeletionLagMs", "getOffloadDeletionLag",
   "Get how long offloaded ledgers stay in the log, in ms (Pulsar: getOffloadDeletionLag).",
   "Namespaces", ok_json({**INT64, "minimum": 0}), [404])
op("put", NS + "/offloadDeletionLagMs", "setOffloadDeletionLag",
   "Set how long offloaded ledgers stay in the log, in ms (Pulsar: setOffloadDeletionLag).",
   "Namespaces", NO_CONTENT, [404],
   body=scalar_body({**INT64, "minimum": 0}, "Milliseconds, not negative."))
op("delete", NS + "/offloadDeletionLagMs", "clearOffloadDeletionLag",
   "Remove the namespace's offload deletion lag (Pulsar: clearOffloadDeletionLag).",
   "Namespaces", NO_CONTENT, [404])
op("get", NS + "/lakePartitioning", "getLakePartitioning",
   "Get the time partitioning of the namespace's new lake tables (ledgerlake).", "Namespaces",
   ok_json(ref("LakePartitioning")), [404])
op("put", NS + "/lakePartitioning", "setLakePartitioning",
   "Set the time partitioning of lake tables created afterwards (ledgerlake).", "Namespaces",
   NO_CONTENT, [404],
   body={"description": "`day` or `hour`, bare or as a JSON string.", "required": True,
         "content": {"application/json": {"schema": ref("LakePartitioning")},
                     "text/plain": {"schema": ref("LakePartitioning")}}})
op("get", NS + "/retention", "getRetention",
   "Get the namespace's retention policy (Pulsar: getRetention).", "Namespaces",
   ok_json(ref("RetentionPolicies")), [404])
op("post", NS + "/retention", "setRetention",
   "Set the namespace's retention policy (Pulsar: setRetention).", "Namespaces", NO_CONTENT,
   [404], body=json_body(ref("RetentionPolicies"), "Limits; -1 = none."))
op("delete", NS + "/retention", "removeRetention",
   "Remove the namespace's retention policy (Pulsar: removeRetention).", "Namespaces",
   NO_CONTENT, [404])
op("get", NS + "/deduplication", "getNamespaceDeduplication",
   "Get whether deduplication is on for the namespace (Pulsar: getDeduplication).",
   "Namespaces", ok_json({"type": "boolean"}), [404])
op("post", NS + "/deduplication", "setNamespaceDeduplication",
   "Turn deduplication on or off for the namespace (Pulsar: modifyDeduplication).",
   "Namespaces", NO_CONTENT, [404], body=scalar_body({"type": "boolean"}, "`true` or `false`."))
op("delete", NS + "/deduplication", "removeNamespaceDeduplication",
   "Remove the namespace's deduplication setting (Pulsar: removeDeduplication).", "Namespaces",
   NO_CONTENT, [404])
op("get", TOPIC + "/deduplicationEnabled", "getTopicDeduplication",
   "Get whether deduplication is on for the topic (Pulsar: getDeduplication).", "Topics",
   ok_json({"type": "boolean"}), [404])
op("post", TOPIC + "/deduplicationEnabled", "setTopicDeduplication",
   "Turn deduplication on or off for the topic (Pulsar: setDeduplication).", "Topics",
   NO_CONTENT, [404], body=scalar_body({"type": "boolean"}, "`true` or `false`."))
op("delete", TOPIC + "/deduplicationEnabled", "removeTopicDeduplication",
   "Remove the topic's deduplication setting (Pulsar: removeDeduplication).", "Topics",
   NO_CONTENT, [404])

# Permissions.
ACTIONS = {"type": "array", "items": ref("AuthAction"), "uniqueItems": True}
op("get", NS + "/permissions", "getNamespacePermissions",
   "Get the namespace's grants (Pulsar: getPermissions).", "Permissions",
   ok_json(ref("Grants")), [404])
op("post", NS + "/permissions/{name}", "grantPermissionOnNamespace",
   "Grant a role actions on the namespace (Pulsar: grantPermissionOnNamespace).", "Permissions",
   NO_CONTENT, [404, 412, 501], body=json_body(ACTIONS, "Actions to grant."))
op("delete", NS + "/permissions/{name}", "revokePermissionsOnNamespace",
   "Revoke a role's grant on the namespace (Pulsar: revokePermissionsOnNamespace).",
   "Permissions", NO_CONTENT, [404, 412, 501])
op("post", NS + "/permissions/subscription/{name}", "grantPermissionOnSubscription",
   "Set the roles that may use a subscription (Pulsar: grantPermissionOnSubscription).",
   "Permissions", NO_CONTENT, [404, 412, 501],
   body=json_body({"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                  "Roles."))
op("delete", NS + "/permissions/{name}/{role}", "revokePermissionOnSubscription",
   "Remove a role from a subscription's allowed roles (Pulsar: revokePermissionOnSubscription).",
   "Permissions", NO_CONTENT, [404, 412, 501])
op("get", NS + "/subscriptionAuthMode", "getSubscriptionAuthMode",
   "Get the namespace's subscription auth mode (Pulsar: getSubscriptionAuthMode).",
   "Permissions", ok_json(ref("SubscriptionAuthMode")), [404])
op("post", NS + "/subscriptionAuthMode", "setSubscriptionAuthMode",
   "Set the namespace's subscription auth mode (Pulsar: setSubscriptionAuthMode).",
   "Permissions", NO_CONTENT, [404],
   body={"description": "`None` or `Prefix`, as a JSON string or a bare word.",
         "required": True,
         "content": {"application/json": {"schema": ref("SubscriptionAuthMode")},
                     "text/plain": {"schema": ref("SubscriptionAuthMode")}}})
op("get", TOPIC + "/permissions", "getPermissionsOnTopic",
   "Get the grants on a topic, namespace grants included (Pulsar: getPermissionsOnTopic).",
   "Permissions", ok_json(ref("Grants")), [404])
op("post", TOPIC + "/permissions/{role}", "grantPermissionsOnTopic",
   "Grant a role actions on a topic (Pulsar: grantPermissionsOnTopic).", "Permissions",
   NO_CONTENT, [404, 412, 501], body=json_body(ACTIONS, "Actions to grant."))
op("delete", TOPIC + "/permissions/{role}", "revokePermissionsOnTopic",
   "Revoke a role's grant on a topic; 412 when granted at namespace level only "
   "(Pulsar: revokePermissionsOnTopic).", "Permissions", NO_CONTENT, [404, 412, 501])

# Resource groups.
op("get", "/admin/v2/resourcegroups", "getResourceGroups",
   "List the resource groups (Pulsar: getResourceGroups).", "ResourceGroups",
   ok_json(ref("StringList"), "Group names."))
RG = "/admin/v2/resourcegroups/{group}"
op("get", RG, "getResourceGroup", "Get a resource group's quotas (Pulsar: getResourceGroup).",
   "ResourceGroups", ok_json(ref("ResourceGroup")), [404])
op("put", RG, "createOrUpdateResourceGroup",
   "Create or update a resource group (Pulsar: createOrUpdateResourceGroup).", "ResourceGroups",
   NO_CONTENT, [412], body=json_body(ref("ResourceGroup"), "Quotas; -1 = unlimited."))
op("delete", RG, "deleteResourceGroup",
   "Delete a resource group; 412 while a namespace or tenant uses it (Pulsar: deleteResourceGroup).",
   "ResourceGroups", NO_CONTENT, [404, 412])
op("get", NS + "/resourcegroup", "getNamespaceResourceGroup",
   "Get the namespace's resource group (Pulsar: getNamespaceResourceGroup).", "ResourceGroups",
   ok_json(nullable({"type": "string"}), "The group's name, or null."), [404])
op("delete", NS + "/resourcegroup", "removeNamespaceResourceGroup",
   "Detach the namespace's resource group; superusers (Pulsar: removeNamespaceResourceGroup).",
   "ResourceGroups", NO_CONTENT, [404])
op("post", NS + "/resourcegroup/{group}", "setNamespaceResourceGroup",
   "Attach a resource group to the namespace; superusers (Pulsar: setNamespaceResourceGroup).",
   "ResourceGroups", NO_CONTENT, [404, 412])
op("get", "/admin/v2/tenants/{name}/resourcegroup", "getTenantResourceGroup",
   "Get the tenant's resource group (ledgerlake).", "ResourceGroups",
   ok_json(nullable({"type": "string"}), "The group's name, or null."), [400, 404])
op("delete", "/admin/v2/tenants/{name}/resourcegroup", "removeTenantResourceGroup",
   "Detach the tenant's resource group; superusers (ledgerlake).", "ResourceGroups",
   NO_CONTENT, [400, 404])
op("post", "/admin/v2/tenants/{name}/resourcegroup/{group}", "setTenantResourceGroup",
   "Attach a resource group to every namespace of the tenant without its own; superusers "
   "(ledgerlake).", "ResourceGroups", NO_CONTENT, [400, 404, 412])

# Backlog quotas and message TTL.
for scope, base, tag, pfx in (("namespace", NS, "Namespaces", "Namespace"),
                              ("topic", TOPIC, "Topics", "Topic")):
    op("get", base + "/backlogQuotaMap", f"get{pfx}BacklogQuotaMap",
       f"Get the {scope}'s backlog quotas by type (Pulsar: getBacklogQuotaMap).", tag,
       ok_json(ref("BacklogQuotaMap")), [404])
    op("post", base + "/backlogQuota", f"set{pfx}BacklogQuota",
       f"Set a backlog quota on the {scope}; superusers (Pulsar: setBacklogQuota).", tag,
       NO_CONTENT, [404, 412], query=[Q_BACKLOG_TYPE],
       body=json_body(ref("BacklogQuota"),
                      "The quota; the limit of its type must be positive."))
    op("delete", base + "/backlogQuota", f"remove{pfx}BacklogQuota",
       f"Remove a backlog quota from the {scope}; superusers (Pulsar: removeBacklogQuota).", tag,
       NO_CONTENT, [404], query=[Q_BACKLOG_TYPE])
    ttl_name = "NamespaceMessageTTL" if scope == "namespace" else "MessageTTL"
    op("get", base + "/messageTTL", f"get{pfx}MessageTTL",
       f"Get the {scope}'s message TTL in seconds, null when unset (Pulsar: get{ttl_name}).",
       tag, ok_json(nullable(UINT32)), [404])
    op("post", base + "/messageTTL", f"set{pfx}MessageTTL",
       f"Set the {scope}'s message TTL in seconds (Pulsar: set{ttl_name}).", tag, NO_CONTENT,
       [404, 412], query=[Q_MESSAGE_TTL],
       body=scalar_body(UINT32, "Seconds (ignored when `messageTTL` is in the query).",
                        required=False))
    op("delete", base + "/messageTTL", f"remove{pfx}MessageTTL",
       f"Remove the {scope}'s message TTL (Pulsar: remove{ttl_name}).", tag, NO_CONTENT, [404])


# Count limits (limits.rs LIMITS).
def cap(s):
    return s[0].upper() + s[1:]


LIMITS = [
    ("maxProducersPerTopic", "maxProducers", "the number of producers per topic"),
    ("maxConsumersPerTopic", "maxConsumers", "the number of consumers per topic"),
    ("maxConsumersPerSubscription", "maxConsumersPerSubscription",
     "the number of consumers per subscription"),
    ("maxUnackedMessagesPerConsumer", "maxUnackedMessagesOnConsumer",
     "unacknowledged messages per consumer"),
    ("maxUnackedMessagesPerSubscription", "maxUnackedMessagesOnSubscription",
     "unacknowledged messages per subscription"),
    ("maxTopicsPerNamespace", None, "the number of topics in the namespace"),
]
for ns_seg, topic_seg, what in LIMITS:
    for scope, base, seg, tag, pfx in (("namespace", NS, ns_seg, "Limits", "Namespace"),
                                       ("topic", TOPIC, topic_seg, "Limits", "Topic")):
        if seg is None:
            continue
        op("get", f"{base}/{seg}", f"get{pfx}{cap(seg)}",
           f"Get the {scope}'s limit on {what}, null when unset (Pulsar: get{cap(seg)}).", tag,
           ok_json(nullable(COUNT)), [404])
        op("post", f"{base}/{seg}", f"set{pfx}{cap(seg)}",
           f"Set the {scope}'s limit on {what} (Pulsar: set{cap(seg)}).", tag, NO_CONTENT,
           [404], body=scalar_body(COUNT, "The count; 0 = no limit."))
        op("delete", f"{base}/{seg}", f"remove{pfx}{cap(seg)}",
           f"Remove the {scope}'s limit on {what} (Pulsar: remove{cap(seg)}).", tag, NO_CONTENT,
           [404])

# Rates (rates.rs with_rate).
RATES = [
    ("publishRate", "PublishRate", "publish rate per topic partition"),
    ("dispatchRate", "DispatchRate", "dispatch rate per topic partition"),
    ("subscriptionDispatchRate", "DispatchRate", "dispatch rate per subscription"),
    ("subscribeRate", "SubscribeRate", "subscribe rate per consumer"),
]
for seg, schema, what in RATES:
    for scope, base, pfx in (("namespace", NS, "Namespace"), ("topic", TOPIC, "Topic")):
        op("get", f"{base}/{seg}", f"get{pfx}{cap(seg)}",
           f"Get the {scope}'s {what}, null when unset (Pulsar: get{cap(seg)}).", "Rates",
           ok_json(nullable(ref(schema))), [404])
        op("post", f"{base}/{seg}", f"set{pfx}{cap(seg)}",
           f"Set the {scope}'s {what}; superusers (Pulsar: set{cap(seg)}).", "Rates",
           NO_CONTENT, [404], body=json_body(ref(schema), f"The {what}."))
        op("delete", f"{base}/{seg}", f"remove{pfx}{cap(seg)}",
           f"Remove the {scope}'s {what}; superusers (Pulsar: remove{cap(seg)}).", "Rates",
           NO_CONTENT, [404])

# Topics.
PARTITIONS_BODY = {
    "description": "The partition count: a bare integer (Java admin) or `{\"partitions\": N}` "
                   "(pulsarctl).",
    "required": True,
    "content": {
        "application/json": {"schema": {"oneOf": [{"type": "integer", "format": "int64",
                                                   "minimum": 1, "maximum": 4294967295},
                                                  ref("PartitionedTopicMetadata")]}},
        "text/plain": {"schema": {"type": "integer", "format": "int64", "minimum": 1,
                                  "maximum": 4294967295}},
    },
}
P = TOPIC + "/partitions"
op("put", P, "createPartitionedTopic",
   "Create a partitioned topic (Pulsar: createPartitionedTopic).", "Topics", NO_CONTENT,
   [409, 412], body=PARTITIONS_BODY)
op("post", P, "updatePartitionedTopic",
   "Raise a partitioned topic's partition count (Pulsar: updatePartitionedTopic).", "Topics",
   NO_CONTENT, [404, 409, 412], body=PARTITIONS_BODY)
op("get", P, "getPartitionedMetadata",
   "Get a topic's partition count, 0 when not partitioned (Pulsar: getPartitionedMetadata).",
   "Topics", ok_json(ref("PartitionedTopicMetadata")), [404])
op("delete", P, "deletePartitionedTopic",
   "Delete a partitioned topic and all its partitions (Pulsar: deletePartitionedTopic).",
   "Topics", NO_CONTENT, [404, 412],
   query=[q_force("Close connected producers and consumers first instead of answering 412.")])
op("put", TOPIC, "createNonPartitionedTopic",
   "Create a non-partitioned topic (Pulsar: createNonPartitionedTopic).", "Topics", NO_CONTENT,
   [404, 409, 412])
op("delete", TOPIC, "deleteTopic", "Delete a non-partitioned topic (Pulsar: deleteTopic).",
   "Topics", NO_CONTENT, [404, 412],
   query=[q_force("Close connected producers and consumers first instead of answering 412.")])
op("get", TOPIC + "/partitioned-stats", "getPartitionedStats",
   "Get a partitioned topic's stats, summed over partitions (Pulsar: getPartitionedStats).",
   "Topics", ok_json(ref("PartitionedTopicStats")), [404], query=[Q_PER_PARTITION])
op("get", TOPIC + "/internalStats", "getInternalStats",
   "Get a topic's internal stats: ledgers with their tier, and cursors (Pulsar: getInternalStats).",
   "Topics", ok_json(ref("PersistentTopicInternalStats")), [404])
op("put", TOPIC + "/unload", "unloadTopic",
   "Unload a topic: clients reconnect and load it anew (Pulsar: unloadTopic).", "Topics",
   NO_CONTENT, [404])
op("get", TOPIC + "/stats", "getStats",
   "Get a topic's stats: storage, ledgers, lake table, subscriptions' backlogs (Pulsar: getStats).",
   "Topics", ok_json(ref("TopicStats")), [404])
op("put", TOPIC + "/offload", "triggerOffload",
   "Offload everything written so far to the lake (Pulsar: triggerOffload).", "Offload",
   ok_json(ref("OffloadRequest"),
           "The request's ticket: done once `completedRequest` reaches it."), [404, 412])
op("get", TOPIC + "/offload", "offloadStatus",
   "Get the topic's offload status (Pulsar: offloadStatus).", "Offload",
   ok_json(ref("OffloadStatus")), [404, 412])

# Subscriptions.
op("get", TOPIC + "/subscriptions", "getSubscriptions",
   "List a topic's durable subscriptions (Pulsar: getSubscriptions).", "Subscriptions",
   ok_json(ref("StringList"), "Subscription names."), [404])
op("put", SUB, "createSubscription",
   "Create a subscription at a position (Pulsar: createSubscription).", "Subscriptions",
   NO_CONTENT, [404, 409, 412], query=[Q_SUB_MESSAGE_ID],
   body=json_body(ref("MessageId"),
                  "Where the subscription starts; none for `?messageId=` (default latest). "
                  "(-1, -1) = earliest.", required=False))
op("delete", SUB, "deleteSubscription",
   "Delete a subscription; 412 while consumers are attached unless forced (Pulsar: deleteSubscription).",
   "Subscriptions", NO_CONTENT, [404, 412],
   query=[q_force("Disconnect attached consumers instead of answering 412.")])
op("post", SUB + "/skip/{n}", "skipMessages",
   "Skip n entries of a subscription's backlog (Pulsar: skipMessages).", "Subscriptions",
   NO_CONTENT, [404, 412])
op("post", SUB + "/skip_all", "skipAllMessages",
   "Clear a subscription's backlog (Pulsar: skipAllMessages, clear-backlog).", "Subscriptions",
   NO_CONTENT, [404, 412])
op("post", SUB + "/expireMessages/{seconds}", "expireTopicMessages",
   "Expire a subscription's messages older than the given seconds (Pulsar: expireTopicMessages).",
   "Subscriptions", NO_CONTENT, [404, 412])
op("post", TOPIC + "/all_subscription/expireMessages/{seconds}",
   "expireMessagesForAllSubscriptions",
   "Expire messages older than the given seconds on every subscription "
   "(Pulsar: expireMessagesForAllSubscriptions).", "Subscriptions", NO_CONTENT, [404, 412])
op("post", SUB + "/resetcursor/{timestamp}", "resetCursor",
   "Reset a subscription to a publish time (Pulsar: resetCursor).", "Subscriptions",
   NO_CONTENT, [404, 412])
op("post", SUB + "/resetcursor", "resetCursorOnPosition",
   "Reset a subscription to a message id (Pulsar: resetCursorOnPosition).", "Subscriptions",
   NO_CONTENT, [404, 412],
   body=json_body(ref("MessageId"), "The position; (-1, -1) = earliest."))

# Messages.
ENTRY_HEADERS = {
    "X-Pulsar-Message-ID": "`ledger:entry:partition`.",
    "X-Pulsar-publish-time": "Publish time (RFC 3339).",
    "X-Pulsar-producer-name": "Producer name.",
    "X-Pulsar-sequence-id": "Sequence id.",
    "X-Pulsar-partition-key": "Partition key, when set.",
    "X-Pulsar-event-time": "Event time, when set.",
    "X-Pulsar-num-batch-message": "Messages in the batch, for a batch entry.",
    "X-Pulsar-null-value": "`true` for a null value.",
}
ENTRY_OK = {"200": {
    "description": "The entry's payload (decompressed; for a batch, its framed messages); "
                   "metadata in `X-Pulsar-*` headers, properties as `X-Pulsar-PROPERTY-{key}`.",
    "headers": {k: {"description": v, "schema": {"type": "string"}}
                for k, v in ENTRY_HEADERS.items()},
    "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
}}
op("get", SUB + "/position/{n}", "peekNthMessage",
   "Peek the n-th entry of a subscription's backlog (Pulsar: peekNthMessage).", "Messages",
   ENTRY_OK, [404])
op("get", TOPIC + "/examinemessage", "examineMessage",
   "Read the n-th entry from the first or back from the last (Pulsar: examineMessage).",
   "Messages", ENTRY_OK, [404], query=[Q_INITIAL_POSITION, Q_MESSAGE_POSITION])
op("get", TOPIC + "/lastMessageId", "getLastMessageId",
   "Get the id of a topic's last message, (-1, -1) when empty (Pulsar: getLastMessageId).",
   "Messages", ok_json(ref("MessageId")), [404])

# Broker stats.
op("get", "/admin/v2/broker-stats/topics", "getBrokerTopicStats",
   "Every loaded topic partition's rates, backlog, offload lag and hot / lag-spiral flags, "
   "by namespace and bundle (Pulsar: getTopics of broker-stats); `ledgerlake top` reads it.",
   "Topics", ok_json({"type": "object", "additionalProperties": True}), [412])

# SQL.
op("post", "/sql", "runSql",
   "Run one read-only SQL statement over the lake tables (ledgerlake).", "SQL",
   {"200": {"description": "The rows, by the `Accept` header: JSON rows (default), CSV or an "
                           "Arrow IPC stream. An error after the first rows ends the body early.",
            "content": {
                "application/json": {"schema": {"type": "array", "items": {
                    "type": "object", "additionalProperties": True}}},
                "text/csv": {"schema": {"type": "string"}},
                "application/vnd.apache.arrow.stream": {"schema": {"type": "string",
                                                                   "format": "binary"}},
            }}},
   [400, 404, 412, 422],
   body={"description": "The statement as plain text, or JSON `{\"query\": \"...\"}`.",
         "required": True,
         "content": {"text/plain": {"schema": {"type": "string"}},
                     "application/json": {"schema": ref("SqlQuery")}}},
   description="Authorization is per query, by the SQL engine (403 for a refused statement "
               "or table).")

# ---- components ---------------------------------------------------------------------------

I64M1 = {"type": "integer", "format": "int64", "default": -1}
SCHEMAS = {
    "Error": {"type": "object", "required": ["reason"],
              "properties": {"reason": {"type": "string", "description": "What went wrong."}}},
    "HealthStatus": {"type": "object", "required": ["status"],
                     "properties": {"status": {"type": "string",
                                               "enum": ["live", "ready", "not_ready"]}}},
    "StringList": {"type": "array", "items": {"type": "string"}},
    "ClusterData": {
        "type": "object", "description": "Pulsar's `ClusterData` (the fields a single service has).",
        "properties": {
            "serviceUrl": {"type": "string", "default": "", "description": "Admin/HTTP URL."},
            "serviceUrlTls": {"type": "string", "default": "", "description": "Admin/HTTP URL over TLS."},
            "brokerServiceUrl": {"type": "string", "default": "", "description": "Binary-protocol URL."},
            "brokerServiceUrlTls": {"type": "string", "default": "",
                                    "description": "Binary-protocol URL over TLS."},
        }},
    "TenantInfo": {
        "type": "object", "description": "Pulsar's `TenantInfo`.",
        "properties": {
            "adminRoles": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            "allowedClusters": {"type": "array", "items": {"type": "string"},
                                "uniqueItems": True},
        }},
    "AuthAction": {"type": "string",
                   "enum": ["produce", "consume", "functions", "sources", "sinks", "packages"]},
    "Grants": {"type": "object", "description": "role → granted actions.",
               "additionalProperties": {"type": "array", "items": {"$ref": "#/components/schemas/AuthAction"},
                                        "uniqueItems": True}},
    "AuthPolicies": {
        "type": "object", "description": "Pulsar's `AuthPolicies`.",
        "properties": {
            "namespace_auth": ref("Grants"),
            "destination_auth": {"type": "object", "additionalProperties": ref("Grants"),
                                 "description": "Full topic name → grants."},
            "subscription_auth_roles": {
                "type": "object", "description": "Subscription → the only roles that may use it.",
                "additionalProperties": {"type": "array", "items": {"type": "string"},
                                         "uniqueItems": True}},
        }},
    "SubscriptionAuthMode": {"type": "string", "enum": ["None", "Prefix"]},
    "LakePartitioning": {"type": "string", "enum": ["day", "hour"]},
    "RetentionPolicies": {
        "type": "object", "required": ["retentionTimeInMinutes", "retentionSizeInMB"],
        "description": "Pulsar's `RetentionPolicies`; -1 = no limit in that dimension.",
        "properties": {
            "retentionTimeInMinutes": {"type": "integer", "format": "int64", "minimum": -1},
            "retentionSizeInMB": {"type": "integer", "format": "int64", "minimum": -1},
        }},
    "NamespaceCreatePolicies": {
        "type": "object", "additionalProperties": True,
        "description": "The parts of Pulsar's `Policies` read when creating a namespace.",
        "properties": {
            "auth_policies": ref("AuthPolicies"),
            "replication_clusters": {"type": "array", "items": {"type": "string"},
                                     "uniqueItems": True},
            "subscription_auth_mode": ref("SubscriptionAuthMode"),
            "retention_policies": nullable(ref("RetentionPolicies")),
            "deduplicationEnabled": {"type": "boolean", "nullable": True},
        }},
    "NamespacePolicies": {
        "type": "object", "additionalProperties": True,
        "description": "Pulsar's `Policies` document of a namespace (unset values are null).",
        "properties": {
            "auth_policies": ref("AuthPolicies"),
            "replication_clusters": {"type": "array", "items": {"type": "string"}},
            "bundles": {"type": "object", "properties": {
                "boundaries": {"type": "array", "items": {"type": "string"}},
                "numBundles": {"type": "integer"}}},
            "subscription_auth_mode": ref("SubscriptionAuthMode"),
            "deleted": {"type": "boolean"},
            "deduplicationEnabled": {"type": "boolean", "nullable": True},
            "retention_policies": nullable(ref("RetentionPolicies")),
            "offload_threshold": {**INT64, "nullable": True},
            "offload_threshold_in_seconds": {**INT64, "nullable": True},
            "offload_deletion_lag_ms": {**INT64, "nullable": True},
            "publishMaxMessageRate": {"type": "object", "nullable": True,
                                      "description": "cluster → publish rate.",
                                      "additionalProperties": ref("PublishRate")},
            "resource_group_name": {"type": "string", "nullable": True},
            "backlog_quota_map": ref("BacklogQuotaMap"),
            "message_ttl_in_seconds": nullable(UINT32),
            "max_producers_per_topic": nullable(UINT32),
            "max_consumers_per_topic": nullable(UINT32),
            "max_consumers_per_subscription": nullable(UINT32),
            "max_unacked_messages_per_consumer": nullable(UINT32),
            "max_unacked_messages_per_subscription": nullable(UINT32),
            "max_topics_per_namespace": nullable(UINT32),
        }},
    "ResourceGroup": {
        "type": "object", "description": "Pulsar's `ResourceGroup`; -1 (or null) = unlimited.",
        "properties": {k: {**I64M1, "nullable": True} for k in (
            "publishRateInMsgs", "publishRateInBytes", "dispatchRateInMsgs",
            "dispatchRateInBytes")}},
    "BacklogQuotaType": {"type": "string", "enum": ["destination_storage", "message_age"],
                         "default": "destination_storage"},
    "BacklogPolicy": {"type": "string", "enum": ["producer_request_hold", "producer_exception",
                                                 "consumer_backlog_eviction"],
                      "default": "producer_request_hold"},
    "BacklogQuota": {
        "type": "object", "description": "Pulsar's `BacklogQuota`.",
        "properties": {
            "limitSize": {**I64M1, "description": "Bytes of backlog allowed (negative: none)."},
            "limit": {"type": "integer", "format": "int64", "deprecated": True,
                      "writeOnly": True, "description": "Old name of `limitSize`."},
            "limitTime": {"type": "integer", "format": "int32", "default": -1,
                          "description": "Seconds of backlog age allowed (negative: none)."},
            "policy": ref("BacklogPolicy"),
        }},
    "BacklogQuotaMap": {
        "type": "object", "description": "Backlog quotas by type.",
        "properties": {"destination_storage": ref("BacklogQuota"),
                       "message_age": ref("BacklogQuota")},
        "additionalProperties": False},
    "PublishRate": {
        "type": "object", "description": "Pulsar's `PublishRate`; -1, 0 or null = unlimited.",
        "properties": {
            "publishThrottlingRateInMsg": {**I64M1, "nullable": True},
            "publishThrottlingRateInByte": {**I64M1, "nullable": True},
        }},
    "DispatchRate": {
        "type": "object", "description": "Pulsar's `DispatchRate`; -1, 0 or null = unlimited.",
        "properties": {
            "dispatchThrottlingRateInMsg": {**I64M1, "nullable": True},
            "dispatchThrottlingRateInByte": {**I64M1, "nullable": True},
            "relativeToPublishRate": {"type": "boolean", "default": False,
                                      "description": "Not supported: true is refused (400)."},
            "ratePeriodInSecond": {"type": "integer", "format": "int64", "minimum": 1,
                                   "maximum": 4294967295, "default": 1},
        }},
    "SubscribeRate": {
        "type": "object", "description": "Pulsar's `SubscribeRate`; ≤ 0 = unlimited.",
        "properties": {
            "subscribeThrottlingRatePerConsumer": {"type": "integer", "format": "int32",
                                                   "default": -1},
            "ratePeriodInSecond": {"type": "integer", "format": "int64", "minimum": 1,
                                   "maximum": 4294967295, "default": 30},
        }},
    "MessageId": {
        "type": "object", "required": ["ledgerId", "entryId"],
        "description": "Pulsar's `MessageId`; (-1, -1) = earliest.",
        "properties": {
            "ledgerId": {"type": "integer", "format": "int64"},
            "entryId": {"type": "integer", "format": "int64"},
            "partitionIndex": {"type": "integer", "format": "int32", "default": -1},
        }},
    "PartitionedTopicMetadata": {
        "type": "object", "required": ["partitions"],
        "properties": {"partitions": {"type": "integer", "format": "int64", "minimum": 0,
                                      "maximum": 4294967295}}},
    "OffloadRequest": {"type": "object", "required": ["request"],
                       "properties": {"request": {"type": "integer", "format": "int64",
                                                  "minimum": 0}}},
    "OffloadState": {"type": "string", "enum": ["NOT_RUN", "RUNNING", "SUCCESS", "ERROR"]},
    "RetentionStats": {
        "type": "object",
        "properties": {
            "expiredLedgers": {"type": "integer", "format": "int64"},
            "removedFiles": {"type": "integer", "format": "int64"},
            "removedRows": {"type": "integer", "format": "int64"},
            "lastSnapshotId": {"type": "integer", "format": "int64", "nullable": True},
            "lastError": {"type": "string"},
        }},
    "OffloadStatus": {
        "type": "object",
        "description": "Pulsar's `OffloadProcessStatus` plus lag and progress.",
        "properties": {
            "status": ref("OffloadState"),
            "lastError": {"type": "string"},
            "firstUnoffloadedMessage": nullable(ref("MessageId")),
            "lastOffloadedMessage": nullable(ref("MessageId")),
            "offloadLagBytes": {"type": "integer", "format": "int64"},
            "offloadLagSeconds": {"type": "number", "format": "double"},
            "runs": {"type": "integer", "format": "int64"},
            "completedRequest": {"type": "integer", "format": "int64"},
            "requestPending": {"type": "boolean"},
            "progressEntries": {"type": "integer", "format": "int64"},
            "progressBytes": {"type": "integer", "format": "int64"},
            "committedLedgers": {"type": "integer", "format": "int64"},
            "committedRows": {"type": "integer", "format": "int64"},
            "badPayloads": {"type": "integer", "format": "int64"},
            "lastSnapshotId": {"type": "integer", "format": "int64", "nullable": True},
            "retention": ref("RetentionStats"),
        }},
    "TopicStats": {"type": "object", "additionalProperties": True,
                   "description": "Pulsar's `TopicStats` plus a `lake` object and replay counters."},
    "PartitionedTopicStats": {"type": "object", "additionalProperties": True,
                              "description": "Pulsar's `PartitionedTopicStats`: sums, "
                                             "`metadata.partitions` and `partitions`."},
    "PersistentTopicInternalStats": {"type": "object", "additionalProperties": True,
                                     "description": "Pulsar's `PersistentTopicInternalStats`, "
                                                    "ledgers with their tier."},
    "SqlQuery": {"type": "object", "required": ["query"],
                 "properties": {"query": {"type": "string"}}},
}

RESPONSES = {
    name: {"description": desc,
           "content": {"application/json": {"schema": ref("Error")}}}
    for _, (name, desc) in sorted(ERRORS.items())
}

doc = {
    "openapi": "3.0.3",
    "info": {
        "title": "ledgerlake HTTP API",
        "version": "1",
        "description": "Health, Prometheus metrics, Pulsar's admin API paths and read-only "
                       "SQL. Errors answer `{\"reason\": \"...\"}`. Every route but /health/* "
                       "and /metrics authenticates an optional bearer token (required while "
                       "authentication is on).",
    },
    "security": [{}, {"bearer": []}],
    "paths": dict(sorted(PATHS.items())),
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": SCHEMAS,
        "responses": RESPONSES,
    },
}

with open(OUT, "w") as f:
    json.dump(doc, f, indent=2, ensure_ascii=False)
    f.write("\n")

pairs = sorted(f"{m.upper()} {p}" for p, item in PATHS.items() for m in item)
print("\n".join(pairs), file=sys.stderr)
print(f"{len(PATHS)} paths, {len(pairs)} operations", file=sys.stderr)
