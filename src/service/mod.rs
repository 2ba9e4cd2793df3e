//! The running service: wires the metadata store, the log and the HTTP surface together, and
//! shuts them down in order (stop serving → drain → flush and fsync the log → close the store).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::tls::TlsIncoming;
use tokio_util::sync::CancellationToken;

use crate::admin::{self, Health};
use crate::broker::Broker;
use crate::cluster::membership::{Membership, NodeRecord};
use crate::cluster::ownership::Ownership;
use crate::config::Config;
use crate::coord::etcd::EtcdCoordination;
use crate::coord::memory::MemoryCoordination;
use crate::coord::Coordination;
use crate::lake::Lake;
use crate::ledger::metadata::etcd::EtcdMetadataStore;
use crate::ledger::metadata::{name_range_end, MetadataError};
use crate::ledger::{Log, MetadataStore};
use crate::offload::log_retention::LogRetention;
use crate::offload::OffloadEngine;
use crate::policies::PolicyStore;
use crate::replay::Replay;
use crate::tenancy::authorizer::TenancyAuthorizer;
use crate::tenancy::{ClusterData, Tenancy};

mod peers;
mod runtime;
use runtime::{own_runtime, OwnRuntime};

/// Why the service failed to start or stop cleanly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The data directory could not be created.
    #[error("cannot create data directory {}: {source}", path.display())]
    DataDir {
        /// Directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A listener could not bind.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// Which surface.
        what: &'static str,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// An authentication key could not be read.
    #[error("tls: {0}")]
    Tls(#[from] crate::tls::TlsError),
    /// An error of the authentication configuration.
    #[error("authentication: {0}")]
    Auth(#[from] crate::auth::jwt::KeyError),
    /// The metadata store failed to open.
    #[error("metadata store: {0}")]
    Metadata(#[from] crate::ledger::metadata::MetadataError),
    /// The tenancy records could not be set up.
    #[error("tenancy: {0}")]
    Tenancy(#[from] crate::tenancy::TenancyError),
    /// The log failed to open (recovery).
    #[error("log recovery failed: {0}")]
    Log(#[from] crate::ledger::OpenError),
    /// Flushing the log at shutdown failed.
    #[error("log shutdown: {0}")]
    Shutdown(#[from] crate::ledger::AppendError),
    /// The HTTP server failed.
    #[error("http server: {0}")]
    Http(std::io::Error),
    /// The lake (catalog or warehouse) could not be opened.
    #[error("lake: {0}")]
    Lake(#[from] crate::lake::LakeError),
    /// The coordination store (etcd) could not be used.
    #[error("coordination: {0}")]
    Coordination(#[from] crate::coord::CoordError),
    /// The node could not join its cluster.
    #[error("cluster membership: {0}")]
    Membership(#[from] crate::cluster::membership::MembershipError),
    /// Another process runs on the data directory.
    #[error(transparent)]
    DirLock(#[from] crate::dir_lock::DirLockError),
    /// The token this node presents to its peers could not be read.
    #[error("broker.authentication.node_token: cannot read {}: {source}", path.display())]
    NodeToken {
        /// The token file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A runtime of its own (lake, replay, SQL) could not start.
    #[error("starting a runtime: {0}")]
    Runtime(std::io::Error),
}

/// A started service.
#[derive(Debug)]
pub struct Service {
    /// The log.
    pub log: Arc<Log>,
    /// Address the HTTP surface listens on.
    pub http_addr: SocketAddr,
    /// Address the Pulsar listener is bound to.
    pub pulsar_addr: SocketAddr,
    /// Address the `pulsar+ssl://` listener is bound to (`None`: off).
    pub pulsar_tls_addr: Option<SocketAddr>,
    /// Address the HTTPS listener is bound to (`None`: off).
    pub https_addr: Option<SocketAddr>,
    /// The HTTPS server. Invariant: `Some` exactly when `https_addr` is.
    https: Option<tokio::task::JoinHandle<()>>,
    broker: Arc<Broker>,
    health: Arc<Health>,
    stop: CancellationToken,
    /// Stops the bookie listener, after the broker handed its topics over.
    bookie_stop: CancellationToken,
    http: tokio::task::JoinHandle<()>,
    meta: Arc<dyn MetadataStore>,
    /// This node's registration. Invariant: registered from readiness until `shutdown`.
    membership: Arc<Membership>,
    /// The offload engine (`None` when the lake is disabled).
    pub offload: Option<OffloadEngine>,
    /// Retention applied to the log alone. Invariant: `Some` exactly when `offload` is `None`.
    log_retention: Option<LogRetention>,
    /// Invariant: `Some` exactly when `offload` is; dropped only by `shutdown`.
    lake_runtime: Option<OwnRuntime>,
    /// Lake reads of replay. Invariant: `Some` exactly when `offload` is.
    replay_runtime: Option<OwnRuntime>,
    /// Address the PostgreSQL-protocol listener is bound to (`None`: SQL disabled).
    pub pg_addr: Option<SocketAddr>,
    /// Queries (`.0`) and PostgreSQL connections (`.1`: sessions, planning, deadlines and
    /// cancels, never starved by a query's work). Invariant: `Some` exactly when SQL is enabled.
    sql_runtime: Option<(OwnRuntime, OwnRuntime)>,
    /// Invariant: held until the service is dropped, after shutdown closed everything in the
    /// data directory.
    _dir_lock: crate::dir_lock::DirLock,
}

impl Service {
    /// Starts the service: HTTP first (liveness answers during recovery), then recovery of the
    /// log, then readiness.
    pub async fn start(config: &Config) -> Result<Service, ServiceError> {
        std::fs::create_dir_all(&config.data_dir).map_err(|source| ServiceError::DataDir {
            path: config.data_dir.clone(),
            source,
        })?;
        let dir_lock = crate::dir_lock::lock(&config.data_dir)?;
        let dialer = peers::dialer(config)?;
        let health = Health::new();
        let stop = CancellationToken::new();
        let http_listener = bind(config.server.http_addr, "http").await?;
        let http_addr = http_listener.local_addr().map_err(ServiceError::Http)?;
        let ops_cell = Arc::new(tokio::sync::OnceCell::new());
        let (meta, coord) = open_metadata(config).await?;
        let store: Arc<dyn MetadataStore> = meta.clone();
        let tenancy = Arc::new(Tenancy::new(store.clone(), &config.broker.cluster_name));
        let access = access_for(config, &tenancy)?;
        let app = admin::router(
            admin::AdminState {
                health: health.clone(),
                ops: ops_cell.clone(),
                access: access.clone(),
            },
            config.server.max_request_body.as_u64() as usize,
        );
        let tls = acceptors(config)?;
        let (http, https, https_addr) = serve_http(config, app, http_listener, &tls, &stop).await?;
        tracing::info!(%http_addr, "http listening (health, admin)");

        let log =
            Arc::new(Log::open(&config.ledger_dir(), config.ledger.clone(), store.clone()).await?);
        let policies = Arc::new(PolicyStore::new(
            store.clone(),
            config.lake.policy_defaults.clone(),
        ));
        let (offload, lake_runtime, log_retention) =
            start_lake_side(config, &log, &policies).await?;

        let pulsar = bind_pulsar(config, &tls, &stop).await?;
        // The bookie outlives the broker at shutdown: new owners read the ledgers handed over.
        let bookie_stop = CancellationToken::new();
        let bookie_tls = tls.as_ref().map(|t| t.bookie.clone());
        let bookie_addr = peers::start_bookie(
            config,
            (&log, &access),
            &pulsar.advertised,
            bookie_tls,
            bookie_stop.clone(),
        )
        .await?;
        let (pulsar_addr, pulsar_tls_addr) = (pulsar.addr, pulsar.tls_addr);
        let (replay, replay_runtime) = start_replay(config, offload.as_ref())?;
        let local = local_cluster(http_addr, https_addr, &pulsar);
        bootstrap_tenancy(&tenancy, &store, &local).await?;
        let authorization = access.required();
        let (sql, sql_runtime, pg_addr) = if config.sql.enabled {
            let (engine, rt, addr) = start_sql(
                config,
                log.clone(),
                (offload.clone(), replay.clone()),
                access.clone(),
                (stop.clone(), tls.map(|t| t.pg)),
            )?;
            (Some(engine), Some(rt), Some(addr))
        } else {
            (None, None, None)
        };
        let me = NodeRecord {
            id: node_id(&pulsar.advertised, http_addr),
            broker_service_url: local.broker_service_url.clone(),
            broker_service_url_tls: (!local.broker_service_url_tls.is_empty())
                .then(|| local.broker_service_url_tls.clone()),
            web_service_url: local.service_url.clone(),
            web_service_url_tls: (!local.service_url_tls.is_empty())
                .then(|| local.service_url_tls.clone()),
            pg_addr: pg_addr.map(|a| a.to_string()),
            started_at_ms: crate::ledger::now_ms(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            bookie: log.bookie_id().to_string(),
            bookie_listeners: match bookie_addr {
                Some(_) => config.server.bookie_advertised_listeners.clone(),
                None => Default::default(),
            },
            bookie_tls: bookie_addr.is_some() && config.server.bookie_tls,
            bookie_addr,
            draining: false,
        };
        let membership = Membership::join(coord.clone(), me, config.metadata.session_ttl * 2)
            .await?
            .reach_bookies_by(config.server.bookie_listener_name.clone());
        let membership = Arc::new(membership);
        // Placement, ensemble choice, bookie addresses and the failure detector read the
        // registrations from a watch-fed copy rather than listing the store on each call.
        membership.follow(stop.clone());
        log.set_replica_source(Arc::new(crate::bookie::client::BookieClient::new(
            membership.clone(),
            dialer,
        )));
        let autorecovery = config.server.bookie_addr.map(|_| {
            let a = crate::bookie::autorecovery::AutoRecovery::new(
                log.clone(),
                membership.clone(),
                config.autorecovery.clone(),
            );
            a.start(stop.clone());
            a
        });
        if let Some(d) = crate::cluster::failure::PeerFailureDetector::new(
            membership.clone(),
            config.metadata.peer_probe_interval,
        ) {
            d.start(stop.clone());
        }
        let ownership = Ownership::new(coord, membership.clone());
        let broker = Broker::new(
            config.broker.clone(),
            log.clone(),
            (policies.clone(), tenancy.clone()),
            replay.clone(),
            access,
            ownership.clone(),
            &config.metrics,
        );
        let _ = ops_cell.set(crate::ops::Operations::new(
            log.clone(),
            broker.clone(),
            offload.clone(),
            (policies, tenancy, authorization),
            sql,
            (membership.clone(), autorecovery),
        ));
        if let Some(ops) = ops_cell.get() {
            // In a cluster, what another node changes (policies, tenants, grants) reaches
            // this node's caches and its loaded topics.
            ops.follow_policy_changes(stop.clone());
        }
        if let Some(found) = broker.take_inactive_topics() {
            let cell = ops_cell.clone();
            tokio::spawn(async move {
                if let Some(ops) = cell.get() {
                    ops.delete_inactive_topics(found).await;
                }
            });
        }
        broker.serve(pulsar.listener);
        tracing::info!(%pulsar_addr, "pulsar listening");
        if let Some((incoming, addr)) = pulsar.tls {
            broker.serve_tls(incoming);
            tracing::info!(pulsar_tls_addr = %addr, "pulsar+ssl listening");
        }
        health.set_ready(true);
        tracing::info!(data_dir = %config.data_dir.display(), "ready");
        // Recovery and start-up listed every ledger (and after a crash rebuilt and sealed many):
        // that memory is free now, but malloc keeps it for reuse unless handed back.
        tokio::spawn(crate::memory::release());
        Ok(Service {
            log,
            http_addr,
            pulsar_addr,
            pulsar_tls_addr,
            https_addr,
            https,
            broker,
            health,
            stop,
            bookie_stop,
            http,
            meta,
            membership,
            offload,
            log_retention,
            lake_runtime,
            replay_runtime,
            pg_addr,
            sql_runtime,
            _dir_lock: dir_lock,
        })
    }

    /// Resolves once this node's coordination session is no longer live (lost: the node
    /// already stopped serving its topics and should stop).
    pub async fn session_ended(&self) -> crate::coord::SessionState {
        let mut session = self.membership.session();
        let ended = session
            .wait_for(|s| *s != crate::coord::SessionState::Live)
            .await
            .map(|state| *state);
        ended.unwrap_or(crate::coord::SessionState::Closed)
    }

    /// Graceful stop: not ready → stop HTTP and the broker (connections close) → flush and
    /// fsync the log → close the store.
    pub async fn shutdown(self) -> Result<(), ServiceError> {
        self.health.set_ready(false);
        self.stop.cancel();
        self.broker.shutdown().await;
        if let Err(e) = self.http.await {
            tracing::warn!(error = %e, "http task failed");
        }
        if let Some(https) = self.https {
            if let Err(e) = https.await {
                tracing::warn!(error = %e, "https task failed");
            }
        }
        drop(self.sql_runtime);
        drop(self.replay_runtime);
        if let Some(engine) = &self.offload {
            engine.shutdown().await;
        }
        if let Some(task) = self.log_retention {
            task.shutdown().await;
        }
        drop(self.lake_runtime);
        self.bookie_stop.cancel();
        self.log.shutdown().await?;
        if let Err(e) = self.membership.leave().await {
            tracing::warn!(error = %e, "leaving the cluster failed; the registration expires with its lease");
        }
        self.meta.close().await;
        tracing::info!("shutdown complete: log flushed and fsynced");
        Ok(())
    }
}

/// One authenticator and authorizer for every surface; permissions apply while
/// authentication is on.
fn access_for(
    config: &Config,
    tenancy: &Arc<Tenancy>,
) -> Result<crate::auth::Access, ServiceError> {
    let access = crate::auth::Access::from_config(&config.broker.authentication)?;
    if !access.required() {
        return Ok(access);
    }
    Ok(access.with_authorizer(Arc::new(TenancyAuthorizer::new(
        tenancy.clone(),
        config.broker.authentication.superuser_roles.clone(),
    ))))
}

/// This node's cluster record at its addresses (the URLs other nodes follow: redirects to the
/// owner, a namespace unload's fan-out).
fn local_cluster(
    http_addr: SocketAddr,
    https_addr: Option<SocketAddr>,
    pulsar: &PulsarListeners,
) -> ClusterData {
    let advertised = &pulsar.advertised;
    ClusterData {
        service_url: listener_url("http", http_addr, advertised),
        service_url_tls: https_addr.map_or(String::new(), |a| listener_url("https", a, advertised)),
        broker_service_url: format!("pulsar://{}", pulsar.advertised),
        broker_service_url_tls: pulsar
            .advertised_tls
            .as_ref()
            .map_or(String::new(), |a| format!("pulsar+ssl://{a}")),
    }
}

/// The local cluster at today's addresses, the default namespace, and a namespace for every
/// stored topic.
async fn bootstrap_tenancy(
    tenancy: &Tenancy,
    store: &Arc<dyn MetadataStore>,
    local: &ClusterData,
) -> Result<(), ServiceError> {
    let in_use = namespaces_in_use(&**store).await?;
    tenancy.bootstrap(local, in_use).await?;
    Ok(())
}

/// The namespaces that hold a stored topic: one probe of the names' index per namespace,
/// skipping from one namespace's names to the next (never a listing of every topic, which at
/// a million topics held ~600 MB after start-up).
async fn namespaces_in_use(
    store: &dyn MetadataStore,
) -> Result<BTreeSet<crate::naming::NamespaceName>, MetadataError> {
    let mut out = BTreeSet::new();
    for domain in ["persistent://", "non-persistent://"] {
        let mut from = domain.to_string();
        while let Some(t) = store.first_topic_from(&from).await? {
            if !t.name.starts_with(domain) {
                break;
            }
            let Ok(name) = t.name.parse::<crate::naming::TopicName>() else {
                from = format!("{}\u{1}", t.name); // the next name after it (NUL is refused)
                continue;
            };
            let next = name_range_end(&format!("{domain}{}/", name.namespace));
            out.insert(name.namespace);
            match next {
                Some(next) => from = next,
                None => break,
            }
        }
    }
    Ok(out)
}

/// Serves the admin router on the HTTP listener and, when configured, on HTTPS.
async fn serve_http(
    config: &Config,
    app: axum::Router,
    http_listener: TcpListener,
    tls: &Option<Acceptors>,
    stop: &CancellationToken,
) -> Result<(JoinHandle<()>, Option<JoinHandle<()>>, Option<SocketAddr>), ServiceError> {
    let header_read_timeout = config.server.http_header_read_timeout;
    let (https, https_addr) = match (tls, config.server.https_addr) {
        (Some(tls), Some(addr)) => {
            let incoming =
                TlsIncoming::start(bind(addr, "https").await?, tls.https.clone(), stop.clone())
                    .map_err(ServiceError::Http)?;
            let bound = axum::serve::Listener::local_addr(&incoming).map_err(ServiceError::Http)?;
            let server = tokio::spawn(admin::listen::serve(
                incoming,
                app.clone().layer(axum::Extension(admin::OverTls)),
                stop.clone(),
                header_read_timeout,
            ));
            tracing::info!(https_addr = %bound, "https listening (health, admin)");
            (Some(server), Some(bound))
        }
        _ => (None, None),
    };
    let http = tokio::spawn(admin::listen::serve(
        http_listener,
        app,
        stop.clone(),
        header_read_timeout,
    ));
    Ok((http, https, https_addr))
}

/// The offload engine and its runtime with the lake on, or retention of the log alone with it
/// off (retention applies either way).
async fn start_lake_side(
    config: &Config,
    log: &Arc<Log>,
    policies: &Arc<PolicyStore>,
) -> Result<
    (
        Option<OffloadEngine>,
        Option<OwnRuntime>,
        Option<LogRetention>,
    ),
    ServiceError,
> {
    if config.lake.enabled {
        let (engine, rt) = start_offload(config, log.clone(), policies.clone()).await?;
        Ok((Some(engine), Some(rt), None))
    } else {
        let retention = LogRetention::start(
            log.clone(),
            policies.clone(),
            config.broker.retention_check_interval,
        );
        Ok((None, None, Some(retention)))
    }
}

/// Lake reads of replay on a runtime of their own (`None` without a lake).
fn start_replay(
    config: &Config,
    offload: Option<&OffloadEngine>,
) -> Result<(Option<Replay>, Option<OwnRuntime>), ServiceError> {
    let Some(engine) = offload else {
        return Ok((None, None));
    };
    let rt = own_runtime("ll-replay", config.replay.threads, 0)?;
    let replay = Replay::new(
        engine.lake_handle(),
        rt.handle().clone(),
        config.replay.clone(),
    );
    Ok((Some(replay), Some(rt)))
}

/// The Pulsar listeners, bound (served once the broker exists), and the addresses clients
/// are given.
struct PulsarListeners {
    listener: TcpListener,
    addr: SocketAddr,
    /// `host:port` put in `pulsar://` URLs.
    advertised: String,
    /// Invariant: `Some` exactly when `tls_addr` is.
    tls: Option<(TlsIncoming, SocketAddr)>,
    tls_addr: Option<SocketAddr>,
    /// The advertised host with the TLS listener's port.
    advertised_tls: Option<String>,
}

async fn bind_pulsar(
    config: &Config,
    tls: &Option<Acceptors>,
    stop: &CancellationToken,
) -> Result<PulsarListeners, ServiceError> {
    let listener = bind(config.server.pulsar_addr, "pulsar").await?;
    let addr = listener.local_addr().map_err(ServiceError::Http)?;
    let advertised = if config.broker.advertised_address.is_empty() {
        addr.to_string()
    } else {
        config.broker.advertised_address.clone()
    };
    let tls = match (tls, config.server.pulsar_tls_addr) {
        (Some(tls), Some(at)) => {
            let incoming = TlsIncoming::start(
                bind(at, "pulsar+ssl").await?,
                tls.pulsar.clone(),
                stop.clone(),
            )
            .map_err(ServiceError::Http)?;
            let bound = axum::serve::Listener::local_addr(&incoming).map_err(ServiceError::Http)?;
            Some((incoming, bound))
        }
        _ => None,
    };
    let tls_addr = tls.as_ref().map(|(_, a)| *a);
    let advertised_tls = tls_addr.map(|a| {
        let host =
            crate::config::split_host_port(&advertised).map_or(advertised.as_str(), |(h, _)| h);
        format!("{host}:{}", a.port())
    });
    Ok(PulsarListeners {
        listener,
        addr,
        advertised,
        tls,
        tls_addr,
        advertised_tls,
    })
}

/// The metadata store `metadata.url` names and the coordination store beside it: etcd for
/// both (one client, the coordination root `<prefix>/cluster`), or the embedded store with
/// in-process coordination on a single node.
async fn open_metadata(
    config: &Config,
) -> Result<(Arc<dyn MetadataStore>, Arc<dyn Coordination>), ServiceError> {
    let url = &config.metadata.url;
    if url.starts_with("etcd://") {
        let store = EtcdMetadataStore::connect(url).await?;
        let root = format!("{}/cluster", store.prefix());
        let coord =
            EtcdCoordination::start(store.client().clone(), &root, config.metadata.session_ttl)
                .await?;
        Ok((Arc::new(store), Arc::new(coord)))
    } else {
        let store =
            crate::ledger::metadata::open(url, &config.data_dir.join("metadata.db")).await?;
        Ok((store, Arc::new(MemoryCoordination::new())))
    }
}

/// `scheme://host:port` of a listener bound to `addr`; bound to every interface (`0.0.0.0`,
/// `::`), which nobody else can dial, the broker's advertised host with `addr`'s port.
fn listener_url(scheme: &str, addr: SocketAddr, advertised: &str) -> String {
    if addr.ip().is_unspecified() {
        format!("{scheme}://{}", node_id(advertised, addr))
    } else {
        format!("{scheme}://{addr}")
    }
}

/// A node's id: the advertised host with the HTTP port, as Pulsar names brokers.
fn node_id(advertised: &str, http_addr: SocketAddr) -> String {
    let host = crate::config::split_host_port(advertised).map_or(advertised, |(host, _)| host);
    format!("{host}:{}", http_addr.port())
}

/// TLS acceptors of the listeners, one configuration each (ALPN differs).
struct Acceptors {
    pulsar: TlsAcceptor,
    https: TlsAcceptor,
    pg: TlsAcceptor,
    bookie: TlsAcceptor,
}

/// The acceptors from `server.tls_cert_file` / `tls_key_file` (`None`: not configured).
fn acceptors(config: &Config) -> Result<Option<Acceptors>, ServiceError> {
    let (Some(cert), Some(key)) = (&config.server.tls_cert_file, &config.server.tls_key_file)
    else {
        return Ok(None);
    };
    let make = |alpn: &[&[u8]]| -> Result<TlsAcceptor, ServiceError> {
        Ok(TlsAcceptor::from(crate::tls::server_config(
            cert, key, alpn,
        )?))
    };
    Ok(Some(Acceptors {
        pulsar: make(&[])?,
        https: make(&[b"http/1.1"])?,
        // `sslnegotiation=direct` clients (PostgreSQL 17) require this ALPN name.
        pg: make(&[b"postgresql"])?,
        bookie: make(&[crate::bookie::dial::ALPN])?,
    }))
}

/// A listener on `addr`.
async fn bind(addr: SocketAddr, what: &'static str) -> Result<TcpListener, ServiceError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServiceError::Bind { addr, what, source })
}

/// Starts the SQL runtimes, the engine and the PostgreSQL-protocol listener. Queries run on
/// threads of their own at a lower priority (a heavy query cannot slow producers); connections
/// run on another runtime, so that a cancel, a deadline or a new client is served at once even
/// while queries keep every query thread busy.
fn start_sql(
    config: &Config,
    log: Arc<Log>,
    (offload, replay): (Option<OffloadEngine>, Option<crate::replay::Replay>),
    access: crate::auth::Access,
    (stop, tls): (CancellationToken, Option<TlsAcceptor>),
) -> Result<(crate::sql::SqlEngine, (OwnRuntime, OwnRuntime), SocketAddr), ServiceError> {
    let rt = own_runtime("ll-sql", config.sql.threads, config.sql.thread_niceness)?;
    let sessions = own_runtime("ll-sql-io", config.sql.threads, 0)?;
    let engine = crate::sql::SqlEngine::new(
        log,
        offload.map(|e| e.lake_handle()),
        replay,
        (rt.handle().clone(), sessions.handle().clone()),
        config.sql.clone(),
        access,
    );
    let addr = config.server.pg_addr;
    let std_listener = std::net::TcpListener::bind(addr).map_err(|source| ServiceError::Bind {
        addr,
        what: "postgres",
        source,
    })?;
    std_listener
        .set_nonblocking(true)
        .map_err(ServiceError::Http)?;
    let bound = std_listener.local_addr().map_err(ServiceError::Http)?;
    let serve_engine = engine.clone();
    sessions.spawn(async move {
        match TcpListener::from_std(std_listener) {
            Ok(listener) => crate::sql::postgres::serve(serve_engine, listener, stop, tls).await,
            Err(e) => tracing::error!(error = %e, "postgres listener failed"),
        }
    });
    tracing::info!(pg_addr = %bound, "postgres (SQL) listening");
    Ok((engine, (rt, sessions), bound))
}

/// Starts the lake runtime (its own threads: Parquet encoding and catalog I/O never run on the
/// broker's workers), connects to the lake and starts the offload engine on it.
async fn start_offload(
    config: &Config,
    log: Arc<Log>,
    policies: Arc<PolicyStore>,
) -> Result<(OffloadEngine, OwnRuntime), ServiceError> {
    let rt = own_runtime("ll-lake", 2, 0)?;
    let cfg = config.clone();
    let lake = match rt.spawn(async move { Lake::open(&cfg).await }).await {
        Ok(Ok(lake)) => Arc::new(lake),
        Ok(Err(e)) => return Err(e.into()),
        Err(_) => return Err(crate::lake::LakeError::Stopped.into()),
    };
    tracing::info!(
        catalog = lake.catalog_name(),
        warehouse = lake.warehouse(),
        "lake connected"
    );
    let engine = OffloadEngine::start(
        lake,
        log,
        policies,
        config.lake.clone(),
        config.broker.retention_check_interval,
        rt.handle().clone(),
    );
    Ok((engine, rt))
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() -> std::io::Result<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}

#[cfg(test)]
mod tests {
    use super::{listener_url, namespaces_in_use};

    #[test]
    fn a_listener_bound_to_every_interface_is_reached_at_the_advertised_host() {
        let pod = "ledgerlake-1.ledgerlake-headless.default.svc:6650";
        let any = "0.0.0.0:8080".parse().expect("an address");
        assert_eq!(
            listener_url("http", any, pod),
            "http://ledgerlake-1.ledgerlake-headless.default.svc:8080"
        );
        let any6 = "[::]:8443".parse().expect("an address");
        assert_eq!(
            listener_url("https", any6, pod),
            "https://ledgerlake-1.ledgerlake-headless.default.svc:8443"
        );
        let one = "127.0.0.1:8081".parse().expect("an address");
        assert_eq!(listener_url("http", one, pod), "http://127.0.0.1:8081");
    }

    use crate::ledger::metadata::memory::MemoryMetadataStore;
    use crate::ledger::MetadataStore;

    #[tokio::test]
    async fn the_namespaces_in_use_are_found_one_probe_each(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let store = MemoryMetadataStore::default();
        for name in [
            "persistent://a/x/t1",
            "persistent://a/x/t2",
            "persistent://a/x0/t",
            "persistent://b/y/t-partition-3",
            "persistent://bad",
            "persistent://c/z/t",
            "non-persistent://d/w/t",
        ] {
            store.get_or_create_topic(name, 1).await?;
        }
        let found: Vec<String> = namespaces_in_use(&store)
            .await?
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(found, ["a/x", "a/x0", "b/y", "c/z", "d/w"]);
        Ok(())
    }
}
