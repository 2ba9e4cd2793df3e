//! Two logs on one metadata store, the first serving its bookie on 127.0.0.1, the second
//! reading the first's ledgers through [`client::BookieClient`]: open and sealed ledgers,
//! exactly what was confirmed, and bad frames closing only their connection.

use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::cluster::membership::{tests::record, Membership, NodeRecord};
use crate::config::LedgerConfig;
use crate::coord::memory::MemoryCoordination;
use crate::coord::Coordination;
use crate::ledger::metadata::memory::MemoryMetadataStore;
use crate::ledger::{LedgerState, MetadataStore, Position, TopicLog};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn config() -> LedgerConfig {
    LedgerConfig {
        rollover_entries: 50,
        ..LedgerConfig::default()
    }
}

async fn read_all(t: &TopicLog) -> Result<Vec<Entry>, ReadError> {
    let mut out = Vec::new();
    for l in t.ledgers() {
        if l.entry_count > 0 {
            out.extend(t.read_entries(l.id, 0, l.entry_count - 1).await?);
        }
    }
    Ok(out)
}

struct Pair {
    a: Arc<Log>,
    b: Log,
    addr: SocketAddr,
    stop: CancellationToken,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

/// Log A serving its bookie, registered as a member; log B reading through the client.
async fn pair() -> Result<Pair, Box<dyn std::error::Error>> {
    pair_with(None, None).await
}

/// [`pair`], A checking credentials with `check`, B presenting `token`.
async fn pair_with(
    check: Option<PeerCheck>,
    token: Option<&str>,
) -> Result<Pair, Box<dyn std::error::Error>> {
    let meta: Arc<dyn MetadataStore> = Arc::new(MemoryMetadataStore::new());
    let dirs = (tempfile::tempdir()?, tempfile::tempdir()?);
    let a = Arc::new(Log::open(dirs.0.path(), config(), meta.clone()).await?);
    let b = Log::open(dirs.1.path(), config(), meta.clone()).await?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let stop = CancellationToken::new();
    serve(listener, a.clone(), check, None, stop.clone());
    let coord: Arc<dyn Coordination> = Arc::new(MemoryCoordination::new());
    let me = NodeRecord {
        bookie: a.bookie_id().to_string(),
        bookie_addr: Some(addr.to_string()),
        ..record("a:1")
    };
    let _ = Membership::join(coord.clone(), me, std::time::Duration::ZERO).await?;
    let reader = NodeRecord {
        bookie: b.bookie_id().to_string(),
        bookie_addr: None,
        ..record("b:1")
    };
    let membership = Arc::new(Membership::join(coord, reader, std::time::Duration::ZERO).await?);
    b.set_replica_source(Arc::new(client::BookieClient::new(
        membership,
        super::dial::Dialer::new(token.map(str::to_string), None, false),
    )));
    Ok(Pair {
        a,
        b,
        addr,
        stop,
        _dirs: dirs,
    })
}

#[tokio::test]
async fn another_node_reads_open_and_sealed_ledgers_up_to_what_was_confirmed() -> TestResult {
    let p = pair().await?;
    let name = "persistent://t/n/remote";
    let ta = p.a.topic(name).await?;
    // 50 entries per ledger: one sealed, one open with 20.
    for i in 0..70u64 {
        let body = Bytes::from(format!("message {i} ").repeat(1 + (i as usize % 7)));
        ta.append(i as i64, body).await?.durable().await?;
    }
    let tb = p.b.topic_to_read(name).await?;
    assert_eq!(tb.last_confirmed(), ta.last_confirmed());
    assert_eq!(read_all(&tb).await?, read_all(&ta).await?);
    let open = ta.ledgers()[1].id;
    assert_eq!(
        tb.read_entry(Position::new(open, 19))
            .await?
            .publish_time_ms,
        69
    );
    // The view read at 70 entries stays at 70; a new view sees the next ones.
    ta.append(70, Bytes::from_static(b"late"))
        .await?
        .durable()
        .await?;
    assert!(matches!(
        tb.read_entry(Position::new(open, 20)).await,
        Err(ReadError::NoSuchEntry { available: 20, .. })
    ));
    let tb = p.b.topic_to_read(name).await?;
    assert_eq!(read_all(&tb).await?.len(), 71);

    // Sealed on A meanwhile: read from its index.
    ta.seal_current().await?;
    let tb = p.b.topic_to_read(name).await?;
    let states: Vec<_> = tb.ledgers().iter().map(|l| l.state).collect();
    assert_eq!(states, vec![LedgerState::Sealed, LedgerState::Sealed]);
    assert_eq!(read_all(&tb).await?, read_all(&ta).await?);

    // Large reads come back in several answers of the bookie's budget, in order.
    let big = p.a.topic("persistent://t/n/big").await?;
    for i in 0..12u8 {
        big.append(0, Bytes::from(vec![i; 700 << 10]))
            .await?
            .durable()
            .await?;
    }
    let remote = p.b.topic_to_read("persistent://t/n/big").await?;
    let got = read_all(&remote).await?;
    assert_eq!(got.len(), 12);
    assert!(got.iter().enumerate().all(|(i, e)| e.payload[0] == i as u8));
    p.stop.cancel();
    p.a.shutdown().await?;
    p.b.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn a_bad_frame_closes_its_connection_only_and_unheld_ledgers_are_refused() -> TestResult {
    let p = pair().await?;
    let name = "persistent://t/n/hostile";
    let ta = p.a.topic(name).await?;
    ta.append(1, Bytes::from_static(b"one"))
        .await?
        .durable()
        .await?;

    // A frame with a wrong checksum: the bookie closes this connection.
    let mut bad = crate::protocol::bookie::encode_request(
        9,
        &BookieRequest::LastConfirmed {
            topic: name.into(),
            ledger: 1,
        },
    )
    .to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 0xFF;
    let mut raw = TcpStream::connect(p.addr).await?;
    raw.write_all(&(bad.len() as u32).to_be_bytes()).await?;
    raw.write_all(&bad).await?;
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), raw.read(&mut buf)).await??;
    assert_eq!(n, 0, "the connection is closed without an answer");
    // A request frame declared longer than a request can be (an add of the largest entry,
    // plus one byte): closed before anything is reserved for it.
    let too_long = crate::protocol::bookie::MAX_REQUEST_FRAME + p.a.max_entry_size() + 1;
    let mut raw = TcpStream::connect(p.addr).await?;
    raw.write_all(&(too_long as u32).to_be_bytes()).await?;
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), raw.read(&mut buf)).await??;
    assert_eq!(n, 0);

    // Everyone else is still served.
    let tb = p.b.topic_to_read(name).await?;
    assert_eq!(read_all(&tb).await?, read_all(&ta).await?);
    // A ledger A never held: refused, named as A's.
    assert!(matches!(
        p.a.serve_read(name, 999_999, 0, 0, 1 << 20).await,
        Err(ReadError::Remote { .. })
    ));
    // A's bookie gone: B's view cannot count A's open ledger and says so.
    p.stop.cancel();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    drop(TcpListener::bind(p.addr).await?); // the port is free: nobody serves it
    assert!(matches!(
        p.b.topic_to_read(name).await,
        Err(ReadError::Remote { .. })
    ));
    p.a.shutdown().await?;
    p.b.shutdown().await?;
    Ok(())
}

/// Sends one framed request on `raw`; the answer, or `None` when the bookie closed.
async fn raw_call(
    raw: &mut TcpStream,
    id: u64,
    req: &BookieRequest,
) -> Result<Option<BookieResponse>, Box<dyn std::error::Error>> {
    let frame = crate::protocol::bookie::encode_request(id, req);
    raw.write_all(&(frame.len() as u32).to_be_bytes()).await?;
    raw.write_all(&frame).await?;
    let mut len = [0u8; 4];
    let read = tokio::time::timeout(std::time::Duration::from_secs(5), raw.read_exact(&mut len));
    if read.await?.is_err() {
        return Ok(None);
    }
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    raw.read_exact(&mut body).await?;
    let (got, resp) = crate::protocol::bookie::decode_response(Bytes::from(body))?;
    assert_eq!(got, id);
    Ok(Some(resp))
}

async fn closed(raw: &mut TcpStream) -> Result<bool, Box<dyn std::error::Error>> {
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), raw.read(&mut buf)).await??;
    Ok(n == 0)
}

/// A pair whose A admits only `node-token` (of role `cluster-node`; `app-token` names a role
/// that is no superuser), B presenting `token`; A's topic `name` with one entry.
async fn guarded_pair(
    token: &str,
    name: &str,
) -> Result<(Pair, TopicLog), Box<dyn std::error::Error>> {
    let check: PeerCheck = Arc::new(|token: &str| match token {
        "node-token" => Ok("cluster-node".to_string()),
        "app-token" => Err("role app is not a superuser".to_string()),
        _ => Err("unknown token".to_string()),
    });
    let p = pair_with(Some(check), Some(token)).await?;
    let ta = p.a.topic(name).await?;
    ta.append(1, Bytes::from_static(b"one"))
        .await?
        .durable()
        .await?;
    Ok((p, ta))
}

#[tokio::test]
async fn an_authenticating_bookie_serves_only_nodes_presenting_a_superuser_token() -> TestResult {
    let (p, ta) = guarded_pair("node-token", "persistent://t/n/guarded").await?;
    let name = "persistent://t/n/guarded";
    // B's client says hello with its token and reads.
    let tb = p.b.topic_to_read(name).await?;
    assert_eq!(read_all(&tb).await?, read_all(&ta).await?);

    let ask = BookieRequest::LastConfirmed {
        topic: name.into(),
        ledger: ta.ledgers()[0].id,
    };
    let unauthorized = |r: &Option<BookieResponse>| {
        matches!(
            r,
            Some(BookieResponse::Error {
                code: crate::protocol::bookie::BookieErrorCode::Unauthorized,
                ..
            })
        )
    };
    // A request before credentials: refused, and the connection closed.
    let mut raw = TcpStream::connect(p.addr).await?;
    assert!(unauthorized(&raw_call(&mut raw, 1, &ask).await?));
    assert!(closed(&mut raw).await?);
    // A token of a role that is not a superuser, or no known token: the same.
    for token in ["app-token", "forged"] {
        let mut raw = TcpStream::connect(p.addr).await?;
        let hello = BookieRequest::Hello {
            token: token.into(),
        };
        assert!(unauthorized(&raw_call(&mut raw, 0, &hello).await?));
        assert!(closed(&mut raw).await?);
    }
    // Before credentials, a frame may not be larger than a request without an entry.
    let mut raw = TcpStream::connect(p.addr).await?;
    let big = (crate::protocol::bookie::MAX_REQUEST_FRAME + 1) as u32;
    raw.write_all(&big.to_be_bytes()).await?;
    assert!(closed(&mut raw).await?);
    // A superuser's token: welcomed, then served.
    let mut raw = TcpStream::connect(p.addr).await?;
    let hello = BookieRequest::Hello {
        token: "node-token".into(),
    };
    assert_eq!(
        raw_call(&mut raw, 0, &hello).await?,
        Some(BookieResponse::Welcome {
            role: "cluster-node".into()
        })
    );
    assert!(matches!(
        raw_call(&mut raw, 2, &ask).await?,
        Some(BookieResponse::LastConfirmed { count: 1, .. })
    ));
    p.stop.cancel();
    p.a.shutdown().await?;
    p.b.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn a_node_with_a_refused_token_reads_nothing() -> TestResult {
    let name = "persistent://t/n/refused";
    let (p, _ta) = guarded_pair("stale-token", name).await?;
    assert!(matches!(
        p.b.topic_to_read(name).await,
        Err(ReadError::Remote { .. })
    ));
    p.stop.cancel();
    p.a.shutdown().await?;
    p.b.shutdown().await?;
    Ok(())
}
