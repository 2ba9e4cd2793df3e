//! The quorum's bookkeeping, one member at a time and under a concurrent writer.

use super::*;

/// A quorum whose replicas each get every entry.
fn whole(ledger: LedgerId, replicas: Vec<String>, ack_quorum: u8) -> Quorum {
    let stripes = Stripes::whole(replicas.len());
    Quorum::new(ledger, replicas, ack_quorum, stripes)
}

fn reply() -> (Receipt, oneshot::Receiver<Result<Position, AppendError>>) {
    oneshot::channel()
}

/// Registers entry `e` with a receipt nobody waits for; the members it goes to now.
fn entry(q: &Quorum, e: u64) -> Vec<MemberId> {
    q.register(e, reply().0, 0, &Bytes::new())
        .into_iter()
        .map(|(m, _)| m)
        .collect()
}

#[test]
fn an_entry_is_confirmed_once_its_ack_quorum_holds_it() {
    let q = whole(7, vec!["b".into(), "c".into()], 2);
    let (t0, mut r0) = reply();
    let (t1, mut r1) = reply();
    assert_eq!(q.register(0, t0, 0, &Bytes::new()).len(), 2);
    q.register(1, t1, 0, &Bytes::new());
    assert_eq!(q.local_durable(1), None, "one bookie of a quorum of two");
    assert!(r0.try_recv().is_err());
    assert_eq!(q.replica_durable(2, 0), Some(1));
    assert_eq!(
        r0.try_recv().ok().and_then(Result::ok),
        Some(Position::new(7, 0))
    );
    assert!(r1.try_recv().is_err(), "entry 1 is on one bookie only");
    assert_eq!(q.replica_durable(1, 1), Some(2));
    assert_eq!(
        r1.try_recv().ok().and_then(Result::ok),
        Some(Position::new(7, 1))
    );
}

#[test]
fn losing_one_of_three_keeps_a_quorum_of_two_and_losing_two_fails_the_rest() {
    let q = whole(1, vec!["b".into(), "c".into()], 2);
    let (t0, mut r0) = reply();
    q.register(0, t0, 0, &Bytes::new());
    assert_eq!(
        q.replica_failed(1, "connection reset"),
        Failure::Replace,
        "to be replaced"
    );
    assert!(!q.degraded(), "no roll while it is replaced");
    q.replacement_ended();
    assert!(q.degraded(), "not replaced: the ledger rolls");
    assert_eq!(entry(&q, 1), vec![2], "a failed replica gets nothing more");
    q.local_durable(0);
    q.replica_durable(2, 0);
    assert!(matches!(r0.try_recv(), Ok(Ok(_))));
    let (t2, mut r2) = reply();
    q.register(2, t2, 0, &Bytes::new());
    q.local_durable(2);
    assert_eq!(
        q.replica_failed(2, "timed out"),
        Failure::LeftOut,
        "too few are left to replace it"
    );
    assert!(matches!(r2.try_recv(), Ok(Err(AppendError::Quorum { .. }))));
    let (t3, mut r3) = reply();
    q.register(3, t3, 0, &Bytes::new());
    assert!(matches!(r3.try_recv(), Ok(Err(AppendError::Quorum { .. }))));
}

#[test]
fn a_broken_quorum_confirms_nothing_more() {
    let q = whole(1, vec!["b".into(), "c".into()], 3);
    let (t0, mut r0) = reply();
    q.register(0, t0, 0, &Bytes::new());
    q.replica_durable(1, 0);
    q.replica_durable(2, 0);
    q.replica_failed(1, "timed out");
    assert!(matches!(r0.try_recv(), Ok(Err(AppendError::Quorum { .. }))));
    assert_eq!(
        q.local_durable(0),
        None,
        "entry 0 failed; it is never confirmed"
    );
}

/// Once a replica failed, what it holds no longer confirms anything: the bookies a
/// replacement leaves in the record must hold every confirmed entry themselves.
#[test]
fn a_failed_replica_no_longer_counts_towards_confirmations() {
    let q = whole(1, vec!["b".into(), "c".into()], 2);
    let (t0, mut r0) = reply();
    q.register(0, t0, 0, &Bytes::new());
    q.replica_durable(2, 0);
    q.replica_failed(2, "gone");
    assert_eq!(
        q.local_durable(0),
        None,
        "c failed: the journal alone is one"
    );
    assert!(r0.try_recv().is_err());
    assert_eq!(q.replica_durable(1, 0), Some(1));
    assert!(matches!(r0.try_recv(), Ok(Ok(_))));
}

#[test]
fn a_replacement_gets_earlier_entries_first_and_later_ones_in_order(
) -> Result<(), Box<dyn std::error::Error>> {
    let q = whole(1, vec!["b".into(), "c".into()], 2);
    assert_eq!(entry(&q, 0), vec![1, 2]);
    assert_eq!(entry(&q, 1), vec![1, 2]);
    assert_eq!(q.replica_failed(2, "gone"), Failure::Replace);
    let (d, from) = q.join(2, "d".into()).ok_or("c failed")?;
    assert_eq!(
        (d, from),
        (3, 2),
        "a new member id; entries 0..2 from the journal"
    );
    assert_eq!(q.bookies(), vec!["b", "d", "c"]);
    assert_eq!(
        entry(&q, 2),
        vec![1],
        "d queues what comes while it catches up"
    );
    let queued = q.take_queued(d).ok_or("d is catching up")?;
    assert_eq!(queued.iter().map(|r| r.0).collect::<Vec<_>>(), vec![2]);
    assert_eq!(q.take_queued(d).map(|v| v.len()), Some(0), "now live");
    assert_eq!(entry(&q, 3), vec![1, 3], "later entries go to d directly");
    // The replaced bookie's late answers count for nobody; d's count.
    q.local_durable(3);
    assert_eq!(q.replica_durable(2, 3), None);
    assert_eq!(q.replica_durable(d, 3), Some(4));
    q.replacement_ended();
    assert!(!q.degraded());
    // A member that fails while catching up is not live later.
    assert_eq!(q.replica_failed(d, "gone too"), Failure::Replace);
    let (e, _) = q.join(d, "e".into()).ok_or("d failed")?;
    assert_eq!(
        q.replica_failed(e, "refused"),
        Failure::Joining,
        "its replacement deals with it"
    );
    assert!(q.take_queued(e).is_none());
    q.replacement_ended();
    assert!(
        q.degraded(),
        "e failed and is not replaced: the ledger rolls"
    );
    // A third replacement is made, no fourth.
    let (f, _) = q.join(e, "f".into()).ok_or("e failed")?;
    assert_eq!(q.take_queued(f).map(|v| v.len()), Some(0));
    assert_eq!(q.replica_failed(f, "gone"), Failure::Replace);
    let (g, _) = q.join(f, "g".into()).ok_or("f failed")?;
    assert_eq!(q.take_queued(g).map(|v| v.len()), Some(0), "g is live");
    q.replacement_ended();
    assert_eq!(
        q.replica_failed(g, "gone"),
        Failure::LeftOut,
        "{MAX_REPLACEMENTS} replacements at most"
    );
    Ok(())
}

/// One thread registers entries (as the writer does, each sent right after it is routed)
/// while another catches a new member up from the journal and then hands it its queue:
/// the new member gets every entry exactly once, in id order (its bookie refuses anything
/// else).
#[test]
fn a_joining_member_gets_every_entry_once_in_order_while_entries_keep_coming(
) -> Result<(), Box<dyn std::error::Error>> {
    const N: u64 = 100_000;
    type Sent = std::sync::Arc<Mutex<Vec<(MemberId, u64)>>>;
    fn push(sent: &Sent, to: MemberId, entry: u64) {
        sent.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((to, entry));
    }
    let q = Arc::new(whole(1, vec!["b".into(), "c".into()], 2));
    let sent: Sent = Default::default();
    // The writer goes on once the new member joined, while it catches up.
    let joined = Arc::new(std::sync::Barrier::new(2));
    let writer = {
        let (q, sent, joined) = (q.clone(), sent.clone(), joined.clone());
        std::thread::spawn(move || {
            for e in 0..N {
                if e == 100 {
                    joined.wait();
                }
                for (to, _) in q.register(e, reply().0, 0, &Bytes::new()) {
                    push(&sent, to, e);
                }
            }
        })
    };
    while q.lock().submitted < 100 {
        std::thread::yield_now();
    }
    assert_eq!(q.replica_failed(2, "gone"), Failure::Replace);
    let (d, from) = q.join(2, "d".into()).ok_or("c failed")?;
    joined.wait();
    for e in 0..from {
        push(&sent, d, e);
    }
    // Entries queue while the earlier ones are read and sent.
    while q.lock().submitted < from + 1000 {
        std::thread::yield_now();
    }
    loop {
        let queued = q.take_queued(d).ok_or("d neither failed nor left")?;
        if queued.is_empty() {
            break;
        }
        for (e, _, _) in queued {
            push(&sent, d, e);
        }
    }
    writer.join().map_err(|_| "the writer panicked")?;
    let sent = sent.lock().unwrap_or_else(|p| p.into_inner());
    let to_d: Vec<u64> = sent
        .iter()
        .filter(|(m, _)| *m == d)
        .map(|(_, e)| *e)
        .collect();
    assert!(to_d.len() as u64 == N && to_d.iter().zip(0..).all(|(e, i)| *e == i));
    Ok(())
}

/// A replacement that ends with its member still catching up gives that member up; a second
/// failure while a member catches up breaks the quorum at once when too few live members are
/// left (the one catching up confirms nothing new before it has caught up).
#[test]
fn a_replacement_given_up_fails_its_member() {
    let q = whole(1, vec!["b".into(), "c".into(), "e".into()], 2);
    assert_eq!(q.replica_failed(2, "gone"), Failure::Replace);
    let Some((d, _)) = q.join(2, "d".into()) else {
        panic!("c failed");
    };
    q.replacement_ended();
    assert!(q.take_queued(d).is_none(), "d was given up");
    assert!(q.degraded(), "and the ledger rolls");

    let q = whole(1, vec!["b".into(), "c".into()], 2);
    let (t0, mut r0) = reply();
    q.register(0, t0, 0, &Bytes::new());
    assert_eq!(q.replica_failed(2, "gone"), Failure::Replace);
    let Some((d, _)) = q.join(2, "d".into()) else {
        panic!("c failed");
    };
    assert_eq!(
        q.replica_failed(1, "gone too"),
        Failure::LeftOut,
        "one replacement at a time"
    );
    // The journal is the only live member: entry 0 fails now, not once d has caught up.
    assert!(matches!(r0.try_recv(), Ok(Err(AppendError::Quorum { .. }))));
    q.replacement_ended();
    assert!(q.take_queued(d).is_none());
}

#[tokio::test]
async fn a_failed_replica_leaves_once_the_others_hold_every_confirmed_entry() {
    let q = std::sync::Arc::new(whole(1, vec!["b".into(), "c".into()], 2));
    for e in 0..3 {
        entry(&q, e);
    }
    q.local_durable(2);
    q.replica_durable(2, 2);
    q.replica_durable(1, 0);
    q.replica_failed(2, "gone");
    // Entries 1 and 2 are confirmed by the journal and c: b must hold them first.
    let waiting = q.clone();
    let held = tokio::spawn(async move { waiting.survivors_hold_confirmed().await });
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(!held.is_finished());
    q.replica_durable(1, 2);
    assert!(held.await.unwrap_or(false));
}

#[tokio::test]
async fn settling_names_the_replicas_holding_every_confirmed_entry() {
    let q = whole(1, vec!["b".into(), "c".into()], 2);
    for e in 0..3 {
        entry(&q, e);
    }
    q.local_durable(2);
    q.replica_durable(1, 2);
    // C held every entry, then failed: it may leave the record (an ensemble change) and
    // drop its copy, so the seal does not list it.
    q.replica_durable(2, 2);
    q.replica_failed(2, "gone");
    assert_eq!(q.settled(3).await, (3, vec!["b".to_string()]));
}

#[tokio::test]
async fn a_seal_waits_a_grace_for_a_replica_only_slow_to_answer() {
    let q = std::sync::Arc::new(whole(1, vec!["b".into(), "c".into()], 2));
    for e in 0..3 {
        entry(&q, e);
    }
    q.local_durable(2);
    q.replica_durable(1, 2);
    q.replica_durable(2, 1);
    // C's answer for the last entry arrives within the grace: C is complete.
    let late = q.clone();
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        late.replica_durable(2, 2);
    });
    let (count, complete) = q
        .settled_complete(3, std::time::Duration::from_secs(10))
        .await;
    assert_eq!(
        (count, complete),
        (3, vec!["b".to_string(), "c".to_string()])
    );
    // One that never answers is left out once the grace is over.
    let q = whole(2, vec!["b".into(), "c".into()], 2);
    entry(&q, 0);
    q.local_durable(0);
    q.replica_durable(1, 0);
    let (count, complete) = q
        .settled_complete(1, std::time::Duration::from_millis(50))
        .await;
    assert_eq!((count, complete), (1, vec!["b".to_string()]));
}

#[test]
fn a_bookie_that_fails_while_joining_may_be_replaced_in_turn() -> Result<(), &'static str> {
    let q = whole(7, vec!["b".into(), "c".into()], 2);
    assert_eq!(q.replica_failed(2, "gone"), Failure::Replace);
    assert_eq!(q.replica_failed(2, "gone again"), Failure::Known);
    let (d, _) = q.join(2, "d".into()).ok_or("c failed")?;
    assert_eq!(q.replica_failed(d, "refused"), Failure::Joining);
    assert!(
        q.replace_again(),
        "the journal and b are live: another bookie may try"
    );
    let (e, _) = q.join(d, "e".into()).ok_or("d failed")?;
    assert_eq!(q.replica_failed(e, "refused"), Failure::Joining);
    assert!(q.replace_again(), "the third replacement");
    let (f, _) = q.join(e, "f".into()).ok_or("e failed")?;
    assert_eq!(q.replica_failed(f, "refused"), Failure::Joining);
    assert!(
        !q.replace_again(),
        "{MAX_REPLACEMENTS} replacements at most"
    );
    assert_eq!(
        q.bookies(),
        ["b", "f", "c", "d", "e"],
        "none of them is chosen again"
    );
    q.replacement_ended();
    assert!(q.degraded(), "f is not replaced: the ledger rolls");
    Ok(())
}

#[test]
fn nobody_is_replaced_once_too_few_are_left() -> Result<(), &'static str> {
    let q = whole(7, vec!["b".into(), "c".into()], 2);
    assert_eq!(q.replica_failed(2, "gone"), Failure::Replace);
    let (d, _) = q.join(2, "d".into()).ok_or("c failed")?;
    assert_eq!(
        q.replica_failed(1, "gone too"),
        Failure::LeftOut,
        "one replacement at a time"
    );
    assert_eq!(q.replica_failed(d, "refused"), Failure::Joining);
    assert!(
        !q.replace_again(),
        "the journal alone is left, below the ack quorum"
    );
    Ok(())
}

/// A ledger of four bookies writing each entry to three (the journal and two of the three
/// replicas, ADR 0017): members 1, 2, 3 are replica places 0, 1, 2.
fn striped(ack_quorum: u8) -> Quorum {
    let replicas = vec!["b".into(), "c".into(), "d".into()];
    Quorum::new(7, replicas, ack_quorum, Stripes::new(3, 2))
}

#[test]
fn a_striped_entry_goes_to_its_write_set_and_is_confirmed_by_it_alone() {
    let q = striped(2);
    let routed: Vec<Vec<MemberId>> = (0..4).map(|e| entry(&q, e)).collect();
    assert_eq!(routed, vec![vec![1, 2], vec![2, 3], vec![1, 3], vec![1, 2]]);
    assert_eq!(
        q.replica_durable(3, 1),
        None,
        "d holds entry 1, not entry 0"
    );
    assert_eq!(q.replica_durable(2, 1), None, "entry 0 is on c alone");
    assert_eq!(
        q.replica_durable(1, 0),
        Some(2),
        "entry 0 on b and c, entry 1 on c and d"
    );
    assert_eq!(
        q.local_durable(3),
        None,
        "entries 2 and 3 are on the journal alone"
    );
    assert_eq!(q.replica_durable(1, 3), Some(4), "b holds 0, 2 and 3");
    let (count, complete) = futures::executor::block_on(q.settled(4));
    assert_eq!((count, complete), (4, vec!["b".to_string()]));
    q.replica_durable(2, 3);
    q.replica_durable(3, 2);
    let (_, complete) = futures::executor::block_on(q.settled(4));
    assert_eq!(complete, ["b", "c", "d"], "each holds its stripe of 0..4");
}

#[test]
fn a_striped_ledger_survives_a_replica_while_every_write_set_keeps_its_ack_quorum() {
    let q = striped(2);
    assert_eq!(q.replica_failed(1, "gone"), Failure::Replace);
    q.replacement_ended();
    assert!(
        q.degraded() && q.lock().broken.is_none(),
        "each write set keeps two live bookies"
    );
    assert_eq!(
        q.places().as_deref(),
        Some(&["b".to_string(), "c".into(), "d".into()][..]),
        "the failed replica keeps its place, so the others keep their stripes"
    );
    assert_eq!(whole(7, vec!["b".into()], 2).places(), None);
    let q = striped(3);
    assert_eq!(
        q.replica_failed(1, "gone"),
        Failure::LeftOut,
        "entries 0 and 2 have two live bookies left, fewer than three"
    );
    assert!(q.lock().broken.is_some());
}

#[test]
fn a_striped_replacement_waits_for_its_write_sets_and_gets_its_stripe_only(
) -> Result<(), &'static str> {
    let q = striped(2);
    for e in 0..3 {
        entry(&q, e);
    }
    q.local_durable(2);
    q.replica_durable(1, 2);
    q.replica_durable(3, 1);
    assert_eq!(q.replica_durable(2, 1), None, "confirmed already");
    assert_eq!(q.replica_failed(1, "gone"), Failure::Replace);
    assert!(
        !q.lock().hold_below(3, 2),
        "entry 2 is on the journal alone among the members left"
    );
    q.replica_durable(3, 2);
    assert!(q.lock().hold_below(3, 2), "d now holds entry 2");
    let (e, from) = q.join(1, "e".into()).ok_or("b failed")?;
    assert_eq!(from, 3);
    assert_eq!(
        q.stripe_of(e).map(|s| s.residues().to_vec()),
        Some(vec![0, 2])
    );
    assert_eq!(entry(&q, 3), vec![2], "b's place queues entry 3");
    assert_eq!(entry(&q, 4), vec![2, 3], "entry 4 is not in its stripe");
    assert_eq!(
        q.take_queued(e)
            .map(|v| v.iter().map(|r| r.0).collect::<Vec<_>>()),
        Some(vec![3])
    );
    q.replica_durable(e, 2);
    assert!(
        futures::executor::block_on(q.holds(e, 3)),
        "it holds its stripe of 0..3: entries 0 and 2"
    );
    Ok(())
}
