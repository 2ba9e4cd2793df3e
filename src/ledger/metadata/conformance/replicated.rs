//! Conformance checks of replicated ledgers' placement (ADR 0010) and of moving a sealed
//! ledger's copies (ADR 0011), run by `run_all` against every store.

use super::super::*;
use super::{seal, TestResult};

/// An open ledger of topic `name` written by b1 and copied to b2 and b3, acknowledged by two
/// (first segment 1).
async fn replicated_ledger(
    store: &dyn MetadataStore,
    name: &str,
) -> Result<(TopicRecord, LedgerRecord), Box<dyn std::error::Error>> {
    let t = store.get_or_create_topic(name, 0).await?;
    let replicas = ["b2".to_string(), "b3".to_string()];
    let placement = Placement {
        bookie: "b1",
        replicas: &replicas,
        ack_quorum: 2,
        write_quorum: 3,
        stripe_width: 0,
    };
    let l = store
        .create_ledger_placed(t.id, 1, placement, 2, None)
        .await?;
    Ok((t, l))
}

pub(super) async fn replicated_ledgers_keep_their_ensemble(
    store: &dyn MetadataStore,
) -> TestResult {
    let (t, l) = replicated_ledger(store, "replicated").await?;
    let replicas = vec!["b2".to_string(), "b3".to_string()];
    assert_eq!(
        (l.replicas.clone(), l.ack_quorum, l.write_quorum),
        (replicas.clone(), 2, 3)
    );
    assert_eq!(store.get_ledger(l.id).await?, Some(l.clone()));
    assert_eq!(l.bookies().collect::<Vec<_>>(), vec!["b1", "b2", "b3"]);
    assert!(l.stripes().is_whole(), "no stripe width: whole copies");
    // A striped ledger (ADR 0017) keeps its stripe width.
    let striped = store
        .create_ledger_placed(
            t.id,
            1,
            Placement {
                bookie: "b1",
                replicas: &replicas,
                ack_quorum: 2,
                write_quorum: 3,
                stripe_width: 1,
            },
            2,
            None,
        )
        .await?;
    assert_eq!(store.get_ledger(striped.id).await?, Some(striped.clone()));
    assert_eq!((striped.stripe_width, striped.stripes().width()), (1, 1));
    assert!(!striped.stripes().is_whole());
    store
        .transition_ledger(striped.id, LedgerTransition::Seal(seal(4)), 3)
        .await?;
    let change = |lost: &[&str], add: Option<&str>, writer: bool, place| CopyChange {
        lost: lost.iter().map(|b| b.to_string()).collect(),
        add: add.map(str::to_string),
        writer: writer.then(|| (add.unwrap_or("b2").to_string(), (40, 44))),
        place,
    };
    // Refused, nothing changed: the writer's place to a replica (each holds a stripe), a copy
    // naming no place, a place held by a bookie not lost, the writer's place without the new
    // copy's segments, a replica's place with them, a place the ledger does not have.
    for bad in [
        change(&["b1"], None, true, None),
        change(&["b2"], Some("b5"), false, None),
        change(&["b3"], Some("b5"), false, Some(1)),
        change(&["b1"], Some("b5"), false, Some(0)),
        change(&["b2"], Some("b5"), true, Some(1)),
        change(&["b2"], Some("b5"), false, Some(3)),
    ] {
        let r = store.move_ledger_copies(striped.id, &bad).await;
        assert!(
            matches!(r, Err(MetadataError::Conflict(_))),
            "{bad:?}: {r:?}"
        );
    }
    let sealed = store.get_ledger(striped.id).await?.ok_or("gone")?;
    assert_eq!(
        (sealed.bookie.as_str(), &sealed.replicas[..]),
        ("b1", &replicas[..])
    );
    // A lost replica's place becomes vacant (the places after it keep their stripes), and a
    // new copy of that stripe fills it.
    let vacated = store
        .move_ledger_copies(striped.id, &change(&["b2"], None, false, None))
        .await?;
    assert_eq!(vacated.replicas, [VACANT, "b3"]);
    assert_eq!(vacated.bookies().collect::<Vec<_>>(), ["b1", "b3"]);
    assert_eq!(vacated.places().collect::<Vec<_>>(), ["b1", VACANT, "b3"]);
    let filled = store
        .move_ledger_copies(striped.id, &change(&[], Some("b5"), false, Some(1)))
        .await?;
    assert_eq!(filled.replicas, ["b5", "b3"], "in b2's place");
    // So does a lost writer's (no bookie holds the ledger whole); a new whole copy takes it
    // with its own segments.
    let vacated = store
        .move_ledger_copies(striped.id, &change(&["b1"], None, false, None))
        .await?;
    assert_eq!(
        (vacated.bookie.as_str(), vacated.first_segment),
        (VACANT, 1)
    );
    let moved = store
        .move_ledger_copies(striped.id, &change(&[], Some("b4"), true, Some(0)))
        .await?;
    assert_eq!(
        (
            moved.bookie.as_str(),
            moved.first_segment,
            moved.seal.map(|s| s.last_segment),
            &moved.replicas[..],
            moved.stripe_width
        ),
        (
            "b4",
            40,
            Some(44),
            &["b5".to_string(), "b3".to_string()][..],
            1
        )
    );
    assert_eq!(store.get_ledger(striped.id).await?, Some(moved));
    // An unreplicated ledger has none and a quorum of one.
    let single = store.create_ledger(t.id, 1, "b1", 3, None).await?;
    assert_eq!(
        (
            single.replicas.len(),
            single.ack_quorum,
            single.write_quorum
        ),
        (0, 1, 1)
    );
    // A seal that places the ledger: bookie, replicas and first segment change with it, in
    // one step (a takeover names the longest copy's bookie; a writer drops a failed replica).
    let placed = |bookie: &str, n: u64| {
        LedgerTransition::SealPlaced(Box::new(PlacedSeal {
            seal: seal(n),
            bookie: bookie.to_string(),
            replicas: replicas[..1].to_vec(),
            first_segment: 7,
        }))
    };
    let sealed = store.transition_ledger(l.id, placed("b3", 4), 4).await?;
    assert_eq!(store.get_ledger(l.id).await?, Some(sealed.clone()));
    assert_eq!(
        (
            sealed.state,
            sealed.bookie.as_str(),
            sealed.first_segment,
            sealed.seal,
            sealed.replicas,
            sealed.ack_quorum
        ),
        (
            LedgerState::Sealed,
            "b3",
            7,
            Some(seal(4)),
            vec!["b2".to_string()],
            2
        )
    );
    // Sealed once: a second placed seal (a writer that lost the ledger to a takeover) changes
    // nothing.
    assert!(matches!(
        store.transition_ledger(l.id, placed("b1", 9), 5).await,
        Err(MetadataError::InvalidTransition { .. })
    ));
    assert_eq!(
        store.get_ledger(l.id).await?.map(|l| (l.bookie, l.seal)),
        Some(("b3".to_string(), Some(seal(4))))
    );
    Ok(())
}

pub(super) async fn sealed_ledgers_copies_move_by_compare_and_set(
    store: &dyn MetadataStore,
) -> TestResult {
    let (_, l) = replicated_ledger(store, "moved").await?;
    let strings = |b: &[&str]| b.iter().map(|b| b.to_string()).collect::<Vec<_>>();
    let change = |lost: &[&str], add: Option<&str>, writer: Option<&str>| CopyChange {
        lost: strings(lost),
        add: add.map(str::to_string),
        writer: writer.map(|w| (w.to_string(), (40, 44))),
        place: None,
    };
    let refused = |r: Result<LedgerRecord, MetadataError>| {
        assert!(matches!(r, Err(MetadataError::Conflict(_))), "{r:?}");
    };
    // Only a sealed ledger's copies move.
    refused(
        store
            .move_ledger_copies(l.id, &change(&["b2"], Some("b4"), None))
            .await,
    );
    store
        .transition_ledger(l.id, LedgerTransition::Seal(seal(5)), 3)
        .await?;
    // A lost replica is replaced: the writer and its first segment stay.
    let moved = store
        .move_ledger_copies(l.id, &change(&["b2"], Some("b4"), None))
        .await?;
    assert_eq!(store.get_ledger(l.id).await?, Some(moved.clone()));
    assert_eq!(
        (
            moved.bookie.as_str(),
            moved.first_segment,
            moved.replicas.clone()
        ),
        ("b1", 1, strings(&["b3", "b4"]))
    );
    assert_eq!((moved.seal, moved.wanted_copies()), (Some(seal(5)), 3));
    // Refused, nothing changed: a bookie not listed, a new copy on a listed bookie, a copy
    // more than the write quorum, a writer's place taken when the writer is not lost, or not
    // taken (or by a bookie without a copy) when it is.
    for bad in [
        change(&["b2"], Some("b5"), None),
        change(&["b9"], Some("b5"), None),
        change(&[], Some("b3"), None),
        change(&[], Some("b5"), None),
        change(&["b3"], Some("b5"), Some("b5")),
        change(&["b1"], Some("b5"), None),
        change(&["b1"], Some("b5"), Some("b9")),
        change(&["b1", "b3"], Some("b5"), Some("b1")),
        // A copy of whole copies names no place.
        CopyChange {
            place: Some(1),
            ..change(&["b3"], Some("b5"), None)
        },
    ] {
        refused(store.move_ledger_copies(l.id, &bad).await);
    }
    assert_eq!(store.get_ledger(l.id).await?, Some(moved));
    // A lost writer: the new copy takes its place, with its own segments; several bookies
    // may be dropped at once.
    let moved = store
        .move_ledger_copies(l.id, &change(&["b1", "b3"], Some("b5"), Some("b5")))
        .await?;
    assert_eq!(
        (moved.bookie.as_str(), moved.first_segment, moved.replicas),
        ("b5", 40, strings(&["b4"]))
    );
    assert_eq!(
        moved.seal,
        Some(SealInfo {
            last_segment: 44,
            ..seal(5)
        }),
        "the seal's segments are the new bookie's"
    );
    // A copy is added with none lost while the ledger is short of its write quorum.
    let grown = store
        .move_ledger_copies(l.id, &change(&[], Some("b6"), None))
        .await?;
    assert_eq!(grown.bookies().collect::<Vec<_>>(), vec!["b5", "b4", "b6"]);
    assert!(matches!(
        store
            .move_ledger_copies(l.id + 1000, &change(&[], Some("b7"), None))
            .await,
        Err(MetadataError::LedgerNotFound(_))
    ));
    // Once offloaded, no copy is added, but a lost writer's place is taken by a replica
    // (which then deletes the local copies after the lag).
    store
        .transition_ledger(
            l.id,
            LedgerTransition::Offload {
                reference: "r".into(),
            },
            4,
        )
        .await?;
    refused(
        store
            .move_ledger_copies(l.id, &change(&["b4"], Some("b7"), None))
            .await,
    );
    let dropped = store
        .move_ledger_copies(l.id, &change(&["b5"], None, Some("b6")))
        .await?;
    assert_eq!(
        (
            dropped.bookie.as_str(),
            dropped.first_segment,
            dropped.replicas
        ),
        ("b6", 40, strings(&["b4"]))
    );
    assert_eq!(dropped.state, LedgerState::Offloaded);
    // A record from before the write quorum was recorded (0) wants as many copies as it
    // lists: pinned at the first change, so dropping a lost bookie does not lower it.
    let t = store.get_or_create_topic("legacy", 0).await?;
    let replicas = ["b2".to_string(), "b3".to_string()];
    let old = store
        .create_ledger_placed(
            t.id,
            1,
            Placement {
                bookie: "b1",
                replicas: &replicas,
                ack_quorum: 2,
                write_quorum: 0,
                stripe_width: 0,
            },
            2,
            None,
        )
        .await?;
    store
        .transition_ledger(old.id, LedgerTransition::Seal(seal(5)), 3)
        .await?;
    let pinned = store
        .move_ledger_copies(old.id, &change(&["b3"], None, None))
        .await?;
    assert_eq!((pinned.write_quorum, pinned.wanted_copies()), (3, 3));
    assert_eq!(store.get_ledger(old.id).await?, Some(pinned));
    Ok(())
}

pub(super) async fn open_ledgers_change_ensemble_until_fenced(
    store: &dyn MetadataStore,
) -> TestResult {
    let (t, l) = replicated_ledger(store, "ensemble").await?;
    store.fence_writers(t.id, 3).await?;
    let change = |from: &str, to: &str| EnsembleChange {
        from: from.to_string(),
        to: to.to_string(),
    };
    // A failed replica is replaced in its place; the writer, quorums and segment stay.
    let changed = store
        .change_ensemble(l.id, &change("b2", "b4"), Some(3))
        .await?;
    assert_eq!(store.get_ledger(l.id).await?, Some(changed.clone()));
    assert_eq!(
        changed.bookies().collect::<Vec<_>>(),
        vec!["b1", "b4", "b3"]
    );
    assert_eq!(
        (
            changed.ack_quorum,
            changed.write_quorum,
            changed.first_segment
        ),
        (2, 3, 1)
    );
    // Refused, nothing changed: a bookie that is not a replica (the writer's included), a
    // bookie listed already.
    for bad in [
        change("b2", "b5"),
        change("b1", "b5"),
        change("b3", "b1"),
        change("b3", "b4"),
    ] {
        let r = store.change_ensemble(l.id, &bad, Some(3)).await;
        assert!(
            matches!(r, Err(MetadataError::Conflict(_))),
            "{bad:?}: {r:?}"
        );
    }
    // A writer of an older epoch than the topic's fence changes nothing.
    let r = store
        .change_ensemble(l.id, &change("b3", "b5"), Some(2))
        .await;
    assert!(matches!(r, Err(MetadataError::Fenced { .. })), "{r:?}");
    assert_eq!(store.get_ledger(l.id).await?, Some(changed));
    // A sealed ledger's ensemble no longer changes.
    store
        .transition_ledger(l.id, LedgerTransition::Seal(seal(2)), 3)
        .await?;
    let r = store.change_ensemble(l.id, &change("b3", "b5"), None).await;
    assert!(matches!(r, Err(MetadataError::Conflict(_))), "{r:?}");
    assert!(matches!(
        store
            .change_ensemble(l.id + 1000, &change("b3", "b5"), None)
            .await,
        Err(MetadataError::LedgerNotFound(_))
    ));
    Ok(())
}
