use super::*;

fn spare(name: &str) -> Spare {
    Spare {
        name: name.to_string(),
        host_base: 1 << 20,
        veth: Some(spare_veth_name(&Path::new("/run/netns").join(name))),
    }
}

#[tokio::test]
async fn a_hold_keeps_the_pool_idle_until_every_hold_is_let_go() {
    let pool = Arc::new(SandboxPool::new(POOL_SIZE));
    let (first, second) = (pool.hold(), pool.hold());
    assert!(pool.held());
    drop(first);
    assert!(pool.held());
    drop(second);
    assert!(!pool.held());
    // Letting go wakes a pool waiting for it (the permit is kept).
    tokio::time::timeout(Duration::from_secs(1), pool.claimed.notified())
        .await
        .expect("notified");
}

#[test]
fn the_pool_makes_up_to_its_size_counting_spares_being_made() {
    let mut book = PoolBook::new(2);
    assert_eq!(book.to_make(), 2);
    let first = book.start_making().expect("room");
    let second = book.start_making().expect("room");
    assert_ne!(first, second);
    assert_eq!(book.start_making(), None, "two being made fill it");
    assert_eq!(book.finish_making(Some(spare(&first))), None);
    assert_eq!(book.finish_making(None), None, "a failure frees its place");
    assert_eq!((book.ready(), book.making(), book.to_make()), (1, 0, 1));
}

#[test]
fn a_claim_takes_the_oldest_and_makes_room_for_one_more() {
    let mut book = PoolBook::new(2);
    for name in ["spare-1", "spare-2"] {
        book.start_making();
        book.finish_making(Some(spare(name)));
    }
    assert_eq!(book.to_make(), 0);
    let taken = book.take_ready().expect("ready");
    assert_eq!(taken.name, "spare-1");
    assert_eq!(book.to_make(), 1);
    book.reserve("pod-a", taken.clone());
    assert_eq!(book.take_reserved("pod-b"), None);
    assert_eq!(book.take_reserved("pod-a"), Some(taken));
    assert_eq!(book.take_reserved("pod-a"), None, "taken once");
}

#[test]
fn a_spare_put_back_is_the_next_taken() {
    let mut book = PoolBook::new(2);
    for name in ["spare-1", "spare-2"] {
        book.start_making();
        book.finish_making(Some(spare(name)));
    }
    let taken = book.take_ready().expect("ready");
    book.put_back(taken.clone());
    assert_eq!(book.take_ready(), Some(taken));
}

#[test]
fn an_empty_pool_gives_nothing_and_a_closed_pool_makes_nothing() {
    let mut book = PoolBook::new(0);
    assert_eq!(book.start_making(), None);
    assert_eq!(book.take_ready(), None);
    let mut book = PoolBook::new(2);
    book.start_making();
    book.finish_making(Some(spare("spare-1")));
    let being_made = book.start_making().expect("room");
    book.reserve("pod-a", book.ready.front().cloned().expect("ready"));
    book.ready.clear();
    book.start_making();
    let closed = book.close();
    assert_eq!(closed, vec![(spare("spare-1"), true)]);
    assert_eq!(book.to_make(), 0);
    assert_eq!(book.start_making(), None);
    // One still being made when the pool closed is handed back.
    let late = spare(&being_made);
    assert_eq!(book.finish_making(Some(late.clone())), Some(late));
    assert_eq!(book.ready(), 0);
}

#[test]
fn spare_veths_are_as_long_as_pods_and_distinct() {
    let a = spare_veth_name(Path::new("/var/lib/corral/netns/spare-1"));
    let b = spare_veth_name(Path::new("/tmp/other-agent/netns/spare-1"));
    assert_ne!(a, b);
    assert_eq!(
        a.len(),
        corral_net::datapath::host_interface_name("ns/p").len()
    );
    assert!(corral_net::datapath::validate_host_interface(&a).is_ok());
    assert!(!a.starts_with("crl"), "never taken for a pod's");
}

#[test]
fn reserving_prefers_the_pods_own_range_then_a_spare_then_a_new_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ranges = IdRanges::open(&dir.path().join("ranges.json")).expect("open");
    let pool = SandboxPool::new(2);
    let base = ranges.allocate(&range_key("spare-1")).expect("spare range");
    pool.book().finish_making(Some(Spare {
        name: "spare-1".into(),
        host_base: base,
        veth: None,
    }));
    // A pod holding a range keeps it; the spare stays ready.
    let own = ranges.allocate("pod-own").expect("own");
    assert_eq!(pool.reserve_range(&ranges, "pod-own"), Ok(own));
    assert_eq!(pool.ready(), 1);
    // A pod without one gets the spare's, reserved for it.
    assert_eq!(pool.reserve_range(&ranges, "pod-a"), Ok(base));
    assert_eq!(ranges.get(&range_key("spare-1")), None);
    assert_eq!(pool.ready(), 0);
    // Asked again (create-sandbox after prepare-volumes): the same.
    assert_eq!(pool.reserve_range(&ranges, "pod-a"), Ok(base));
    assert_eq!(pool.take_reserved("pod-a").map(|s| s.host_base), Some(base));
    // The pool empty: a new range.
    let fresh = pool.reserve_range(&ranges, "pod-b").expect("fresh");
    assert!(fresh != base && fresh != own);
    assert_eq!(pool.take_reserved("pod-b"), None);
}

#[test]
fn a_starting_pod_keeps_the_pool_busy_until_it_ends_or_the_limit_passes() {
    let mut book = PoolBook::new(2);
    let t0 = Instant::now();
    assert_eq!(book.busy_until(t0), None, "nothing starting");
    book.begin_start("pod-a", t0);
    let later = t0 + Duration::from_millis(500);
    book.begin_start("pod-b", later);
    // Asked again (a second step of pod-a): its start keeps its time.
    book.begin_start("pod-a", later);
    assert_eq!(book.busy_until(later), Some(t0 + START_HOLD_LIMIT));
    assert!(book.end_start("pod-a"));
    assert!(!book.end_start("pod-a"), "ended once");
    assert_eq!(book.busy_until(later), Some(later + START_HOLD_LIMIT));
    // A start that never reports its end is forgotten after the limit.
    assert_eq!(book.busy_until(later + START_HOLD_LIMIT), None);
    assert!(!book.end_start("pod-b"), "already forgotten");
}

#[tokio::test]
async fn a_new_pods_reservation_holds_the_refill_until_its_start_is_done() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ranges = IdRanges::open(&dir.path().join("ranges.json")).expect("open");
    let pool = SandboxPool::new(2);
    let own = ranges.allocate("pod-own").expect("own");
    // A pod that holds its range (an in-place update) is not a start.
    assert_eq!(pool.reserve_range(&ranges, "pod-own"), Ok(own));
    assert_eq!(pool.book().busy_until(Instant::now()), None);
    pool.reserve_range(&ranges, "pod-new").expect("range");
    assert!(pool.book().busy_until(Instant::now()).is_some());
    // Another pod's end changes nothing and wakes nobody.
    pool.start_done("pod-other");
    assert!(pool.book().busy_until(Instant::now()).is_some());
    let woken = tokio::time::timeout(Duration::from_millis(20), pool.claimed.notified()).await;
    assert!(woken.is_err(), "no wake-up for a pod that was not starting");
    pool.start_done("pod-new");
    assert_eq!(pool.book().busy_until(Instant::now()), None);
    tokio::time::timeout(Duration::from_secs(1), pool.claimed.notified())
        .await
        .expect("the pool is told");
}
