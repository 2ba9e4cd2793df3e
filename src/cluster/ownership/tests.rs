use std::time::Duration;

use super::*;
use crate::cluster::membership::tests::record;
use crate::coord::etcd::EtcdCoordination;
use crate::coord::memory::MemoryCoordination;
use crate::coord::test_etcd::TestEtcd;

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn node(coord: Arc<dyn Coordination>, id: &str) -> Result<Arc<Ownership>, OwnershipError> {
    let membership = Membership::join(coord.clone(), record(id), Duration::ZERO).await?;
    Ok(Ownership::new(coord, Arc::new(membership)))
}

/// Three nodes on one in-process store.
async fn three() -> Result<(Vec<Arc<Ownership>>, Vec<Arc<dyn Coordination>>), OwnershipError> {
    let first = MemoryCoordination::new();
    let coords: Vec<Arc<dyn Coordination>> = vec![
        Arc::new(first.new_session()),
        Arc::new(first.new_session()),
        Arc::new(first),
    ];
    let mut nodes = Vec::new();
    for (i, c) in coords.iter().enumerate() {
        nodes.push(node(c.clone(), &format!("n{i}:80")).await?);
    }
    Ok((nodes, coords))
}

#[tokio::test]
async fn every_node_places_an_unowned_topic_on_the_same_node_which_claims_it() -> TestResult {
    let (nodes, _coords) = three().await?;
    let topic = "persistent://t/n/a";
    let mut chosen = Vec::new();
    for n in &nodes {
        match n.place(topic, None, false).await? {
            Placement::Local { .. } => chosen.push(n.me().id.clone()),
            Placement::Remote { node, owned } => {
                assert!(!owned || chosen.contains(&node.id));
                chosen.push(node.id);
            }
        }
    }
    chosen.dedup();
    assert_eq!(chosen.len(), 1, "all nodes agree: {chosen:?}");
    // A lookup claims nothing; the chosen node claims the topic when it loads it.
    assert_eq!(nodes[0].owner(topic).await?, None);
    let owner = nodes
        .iter()
        .find(|n| n.me().id == chosen[0])
        .ok_or("no such node")?;
    let epoch = owner.acquire(topic, None).await?;
    for n in &nodes {
        assert_eq!(n.owner(topic).await?.map(|r| r.id), Some(chosen[0].clone()));
    }
    assert_eq!(
        owner.place(topic, None, false).await?,
        Placement::Local { epoch: Some(epoch) }
    );
    Ok(())
}

#[tokio::test]
async fn partitions_spread_over_the_nodes() -> TestResult {
    let (nodes, _coords) = three().await?;
    let mut per_node = HashMap::<String, usize>::new();
    for p in 0..30 {
        let topic = format!("persistent://t/n/orders-partition-{p}");
        let id = match nodes[0].place(&topic, None, false).await? {
            Placement::Local { .. } => nodes[0].me().id.clone(),
            Placement::Remote { node, .. } => node.id,
        };
        *per_node.entry(id).or_default() += 1;
    }
    assert_eq!(per_node.len(), 3, "{per_node:?}");
    assert!(per_node.values().all(|n| *n >= 4), "{per_node:?}");
    Ok(())
}

#[tokio::test]
async fn one_claim_wins_and_each_new_owner_has_a_higher_epoch() -> TestResult {
    let (nodes, _coords) = three().await?;
    let topic = "persistent://t/n/b";
    let claims = futures::future::join_all(nodes.iter().map(|n| n.acquire(topic, None))).await;
    let won: Vec<u64> = claims
        .iter()
        .filter_map(|c| c.as_ref().ok().copied())
        .collect();
    assert_eq!(won.len(), 1, "{claims:?}");
    for c in &claims {
        if let Err(e) = c {
            assert!(matches!(e, OwnershipError::OwnedElsewhere { .. }), "{e}");
        }
    }
    let winner = nodes
        .iter()
        .position(|n| n.epoch(topic).is_some())
        .ok_or("no owner")?;
    nodes[winner].release(topic).await?;
    assert_eq!(nodes[winner].epoch(topic), None);
    let next = (winner + 1) % nodes.len();
    let epoch = nodes[next].acquire(topic, None).await?;
    assert!(epoch > won[0], "epochs increase: {} then {epoch}", won[0]);
    // A claim again by the owner is a no-op with the same epoch; an authoritative lookup on
    // another node points at the owner.
    assert_eq!(nodes[next].acquire(topic, None).await?, epoch);
    match nodes[winner].place(topic, None, true).await? {
        Placement::Remote { node, owned: true } => assert_eq!(node.id, nodes[next].me().id),
        other => return Err(format!("{other:?}").into()),
    }
    Ok(())
}

#[tokio::test]
async fn a_topic_goes_to_the_node_holding_its_unoffloaded_ledgers() -> TestResult {
    let (nodes, coords) = three().await?;
    let topic = "persistent://t/n/c";
    let holder = nodes[2].me().bookie.clone();
    for n in &nodes[..2] {
        match n.place(topic, Some(&holder), false).await? {
            Placement::Remote { node, owned: false } => assert_eq!(node.bookie, holder),
            other => return Err(format!("{other:?}").into()),
        }
        assert!(matches!(
            n.acquire(topic, Some(&holder)).await,
            Err(OwnershipError::HeldElsewhere { .. })
        ));
    }
    assert_eq!(
        nodes[2].place(topic, Some(&holder), false).await?,
        Placement::Local { epoch: None }
    );
    // The holder's node leaves: nobody may serve the topic.
    coords[2].close().await?;
    assert!(matches!(
        nodes[0].place(topic, Some(&holder), false).await,
        Err(OwnershipError::HolderDown { .. })
    ));
    Ok(())
}

#[tokio::test]
async fn a_closed_session_owns_nothing_and_claims_nothing() -> TestResult {
    let (nodes, coords) = three().await?;
    nodes[0].acquire("persistent://t/n/d", None).await?;
    coords[0].close().await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !nodes[0].owned().is_empty() {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(matches!(
        nodes[0].acquire("persistent://t/n/e", None).await,
        Err(OwnershipError::SessionEnded(_))
    ));
    // The others can take over at once.
    nodes[1].acquire("persistent://t/n/d", None).await?;
    Ok(())
}

/// A node cut off from etcd stops owning before its claim can expire; another node then
/// claims with a higher epoch.
#[tokio::test]
async fn an_unrenewed_etcd_session_drops_ownership_before_another_node_can_claim() -> TestResult {
    let etcd = TestEtcd::start()?;
    let client =
        etcd_client::Client::connect([format!("http://{}", etcd.client_addr)], None).await?;
    let ttl = Duration::from_secs(3);
    let a_coord = Arc::new(EtcdCoordination::start(client.clone(), "/own", ttl).await?);
    let b_coord = Arc::new(EtcdCoordination::start(client.clone(), "/own", ttl).await?);
    let a = node(a_coord.clone(), "a:1").await?;
    let b = node(b_coord, "b:2").await?;
    let topic = "persistent://t/n/x";
    let first = a.acquire(topic, None).await?;
    assert!(matches!(
        b.acquire(topic, None).await,
        Err(OwnershipError::OwnedElsewhere { .. })
    ));
    a_coord.stop_renewing();
    let stopped = tokio::time::Instant::now();
    while a.epoch(topic).is_some() {
        assert!(stopped.elapsed() < ttl, "ownership outlived the session");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        b.owner(topic).await?.is_some(),
        "a stopped owning before its claim expired"
    );
    let second = loop {
        match b.acquire(topic, None).await {
            Ok(epoch) => break epoch,
            Err(OwnershipError::OwnedElsewhere { .. }) => {
                assert!(stopped.elapsed() < ttl + Duration::from_secs(3));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    assert!(second > first);
    assert!(matches!(
        a.acquire(topic, None).await,
        Err(OwnershipError::SessionEnded(_))
    ));
    Ok(())
}

#[tokio::test]
async fn a_planned_move_steers_the_next_placement_once() -> TestResult {
    let (nodes, coords) = three().await?;
    let topic = "persistent://t/n/moved";
    let owner = nodes[0].clone();
    owner.acquire(topic, None).await?;
    let target = nodes[2].me().clone();
    assert!(owner.live_node("nobody:1").await?.is_none());
    owner.hand_over(topic, &target).await?;
    owner.release(topic).await?;
    // Every node sends the topic to the named node, whatever the hash says.
    for n in &nodes {
        match n.place(topic, None, false).await? {
            Placement::Local { epoch: None } => assert_eq!(n.me().id, target.id),
            Placement::Remote { node, owned: false } => assert_eq!(node.id, target.id),
            other => panic!("unexpected placement {other:?}"),
        }
    }
    // Only the named node claims it: the old owner (a client reconnected to it during the
    // move) is refused.
    assert!(matches!(
        owner.acquire(topic, None).await,
        Err(OwnershipError::HandedOver { .. })
    ));
    // An open ledger on another bookie still wins over the transfer record.
    let holder = nodes[1].me().bookie.clone();
    match nodes[0].place(topic, Some(&holder), false).await? {
        Placement::Remote { node, .. } => assert_eq!(node.id, nodes[1].me().id),
        other => panic!("unexpected placement {other:?}"),
    }
    // The claim consumes the record.
    nodes[2].acquire(topic, None).await?;
    assert_eq!(coords[0].get(&transfer_key(topic)).await?, None);
    nodes[2].release(topic).await?;
    // A record naming a node that left steers nothing.
    owner.acquire(topic, None).await?;
    owner.hand_over(topic, &target).await?;
    owner.release(topic).await?;
    coords[2].close().await?;
    let live: Vec<String> = nodes[0]
        .membership
        .nodes()
        .await?
        .into_iter()
        .map(|n| n.id)
        .collect();
    assert!(!live.contains(&target.id));
    if let Placement::Remote { node, .. } = nodes[0].place(topic, None, false).await? {
        assert_ne!(node.id, target.id);
    }
    Ok(())
}

#[tokio::test]
async fn a_stopping_node_is_placed_nothing_and_claims_nothing() -> TestResult {
    let (nodes, _coords) = three().await?;
    nodes[1].drain().await?;
    let stopping = nodes[1].me().id.clone();
    for i in 0..40 {
        let topic = format!("persistent://t/n/drain-{i}");
        for n in &nodes {
            match n.place(&topic, None, i % 2 == 0).await? {
                Placement::Local { .. } => assert_ne!(n.me().id, stopping, "{topic}"),
                Placement::Remote { node, .. } => assert_ne!(node.id, stopping, "{topic}"),
            }
        }
        assert!(matches!(
            nodes[1].acquire(&topic, None).await,
            Err(OwnershipError::Draining)
        ));
    }
    assert!(nodes[0].live_node(&stopping).await?.is_none());
    Ok(())
}
