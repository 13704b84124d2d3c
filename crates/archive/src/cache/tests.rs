use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;

fn key(g: u64, b: u32) -> CacheKey {
    CacheKey {
        generation: g,
        block: BlockKey { unit: 0, block: b },
    }
}

#[test]
fn hit_after_miss_and_generation_separates_versions() {
    let c: BlockCache<String> = BlockCache::new(1 << 20);
    let a = c.get_or_load(key(1, 0), || Ok(vec![1; 10])).unwrap();
    let b = c
        .get_or_load(key(1, 0), || panic!("must be cached"))
        .unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    // Same block of another archive version: a different entry.
    let v2 = c.get_or_load(key(2, 0), || Ok(vec![2; 10])).unwrap();
    assert_eq!(v2[0], 2);
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.blocks, s.bytes), (1, 2, 2, 20));
}

#[test]
fn relief_gives_back_every_cached_block_but_those_still_held() {
    use ckptfs_format::memory::Relieve;
    let c: BlockCache<String> = BlockCache::new(300);
    let held = c.get_or_load(key(1, 0), || Ok(vec![1; 100])).unwrap();
    c.get_or_load(key(1, 1), || Ok(vec![2; 100])).unwrap();
    // Larger than half the budget: the side slot.
    c.get_or_load(key(1, 2), || Ok(vec![3; 200])).unwrap();
    assert_eq!(c.relieve(), 400);
    assert_eq!((c.stats().bytes, c.stats().blocks), (0, 0));
    for b in 0..3 {
        assert!(c.peek(&key(1, b)).is_none());
    }
    // A reader's block stays valid; the next load decodes again.
    assert_eq!(held[0], 1);
    let again = c.get_or_load(key(1, 0), || Ok(vec![1; 100])).unwrap();
    assert_eq!(c.stats().misses, 4);
    assert_eq!(*again, *held);
}

#[test]
fn evicts_least_recently_used_to_stay_within_budget() {
    let c: BlockCache<String> = BlockCache::new(300);
    for b in 0..3 {
        c.get_or_load(key(1, b), || Ok(vec![0; 100])).unwrap();
    }
    // Touch block 0 so block 1 is the oldest.
    c.get_or_load(key(1, 0), || unreachable!()).unwrap();
    c.get_or_load(key(1, 3), || Ok(vec![0; 100])).unwrap();
    assert!(c.peek(&key(1, 0)).is_some());
    assert!(c.peek(&key(1, 1)).is_none());
    assert_eq!(c.stats().bytes, 300);
}

#[test]
fn wholly_served_blocks_are_evicted_first_and_kept_to_their_cap() {
    // Budget 64 MiB: the served LRU holds at most 4 MiB.
    let c: BlockCache<String> = BlockCache::new(64 << 20);
    assert_eq!(c.served_cap(), 4 << 20);
    let mib = |v: u8| -> Result<Vec<u8>, String> { Ok(vec![v; 1 << 20]) };
    for b in 0..10 {
        c.get_or_load(key(1, b), || mib(b as u8)).unwrap();
    }
    // Block 0 read in two halves, block 1 only half: 0 is served.
    c.served(&key(1, 0), 1 << 19);
    c.served(&key(1, 0), 1 << 19);
    c.served(&key(1, 1), 1 << 19);
    // Filling the budget evicts block 0 before the older block 1 or
    // any block not yet read.
    for b in 10..64 {
        c.get_or_load(key(1, b), || mib(b as u8)).unwrap();
    }
    assert!(c.peek(&key(1, 0)).is_some(), "within budget: kept");
    c.get_or_load(key(1, 64), || mib(64)).unwrap();
    assert!(c.peek(&key(1, 0)).is_none(), "the served block went first");
    assert!(c.peek(&key(1, 1)).is_some() && c.peek(&key(1, 2)).is_some());
    // Serving more than the cap keeps only the most recent 4 MiB of
    // served blocks, and never touches unread ones.
    for b in 10..20 {
        c.served(&key(1, b), 1 << 20);
    }
    let kept: Vec<u32> = (10..20).filter(|&b| c.peek(&key(1, b)).is_some()).collect();
    assert_eq!(kept, vec![16, 17, 18, 19]);
    assert!((20..65).all(|b| c.peek(&key(1, b)).is_some()));
    assert_eq!(c.stats().bytes, (9 + 4 + 45) << 20);
    // A served block is still a hit until it is evicted.
    let b = c.get_or_load(key(1, 19), || panic!("cached")).unwrap();
    assert_eq!(b[0], 19);
}

#[test]
fn served_and_evicted_blocks_are_not_prefetched_until_the_kernel_asks_again() {
    let c: BlockCache<String> = BlockCache::new(64 << 20);
    let mib = |v: u8| -> Result<Vec<u8>, String> { Ok(vec![v; 1 << 20]) };
    // Ten blocks read whole: the served LRU keeps the last 4 MiB.
    for b in 0..10 {
        c.get_or_load(key(1, b), || mib(b as u8)).unwrap();
        c.served(&key(1, b), 1 << 20);
    }
    assert!(c.peek(&key(1, 0)).is_none(), "evicted");
    // The kernel holds them: prefetch does not decode them again.
    assert!(c.contains_or_loading(&key(1, 0)));
    assert!(c.load_if_absent(key(1, 0), || unreachable!()).is_none());
    assert!(!c.contains_or_loading(&key(1, 10)), "never read");
    // A read that needs one anyway decodes it, and prefetch may again.
    assert_eq!(c.get_or_load(key(1, 1), || mib(1)).unwrap()[0], 1);
    assert!(!c.contains_or_loading(&key(1, 0)));
}

#[test]
fn a_block_over_half_the_budget_is_decoded_once_and_kept_alone() {
    let c: BlockCache<String> = BlockCache::new(300);
    for b in 0..2 {
        c.get_or_load(key(1, b), || Ok(vec![0; 100])).unwrap();
    }
    // Larger than the whole budget: kept in the side slot, and the
    // LRU's blocks stay.
    let big = c.get_or_load(key(1, 9), || Ok(vec![0; 1000])).unwrap();
    assert_eq!(big.len(), 1000);
    for _ in 0..3 {
        let again = c.get_or_load(key(1, 9), || unreachable!()).unwrap();
        assert!(Arc::ptr_eq(&big, &again));
    }
    assert!(c.contains_or_loading(&key(1, 9)));
    assert!(c.peek(&key(1, 0)).is_some() && c.peek(&key(1, 1)).is_some());
    assert_eq!(c.stats().bytes, 200);
    // Only the most recent large block is kept.
    c.get_or_load(key(1, 10), || Ok(vec![0; 200])).unwrap();
    assert!(c.peek(&key(1, 9)).is_none());
    assert!(c.peek(&key(1, 10)).is_some());
    assert_eq!(c.stats().bytes, 200);
}

#[test]
fn errors_reach_the_caller_and_are_not_cached() {
    let c: BlockCache<String> = BlockCache::new(1 << 20);
    let e = c
        .get_or_load(key(1, 0), || Err("checksum".to_string()))
        .unwrap_err();
    assert!(matches!(e, FetchError::Load(m) if *m == "checksum"));
    let ok = c.get_or_load(key(1, 0), || Ok(vec![7])).unwrap();
    assert_eq!(*ok, vec![7]);
}

#[test]
fn load_if_absent_never_waits_for_another_loader() {
    let c: Arc<BlockCache<String>> = Arc::new(BlockCache::new(1 << 20));
    let c2 = c.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let owner = std::thread::spawn(move || {
        c2.get_or_load(key(1, 0), || {
            tx.send(()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(200));
            Ok(vec![1])
        })
    });
    rx.recv().unwrap();
    // In flight elsewhere: returns at once instead of blocking.
    assert!(c.load_if_absent(key(1, 0), || unreachable!()).is_none());
    owner.join().unwrap().unwrap();
    assert!(c.load_if_absent(key(1, 0), || unreachable!()).is_none());
    assert!(matches!(
        c.load_if_absent(key(1, 1), || Ok(vec![2])),
        Some(Ok(()))
    ));
    assert!(c.peek(&key(1, 1)).is_some());
}

/// A decoder's output: every byte written, a pattern of the block.
fn decode_into_taken(b: u32, len: usize) -> Result<Vec<u8>, String> {
    let mut v = buffers::take(len as u64, "t").map_err(|e| e.to_string())?;
    for (i, x) in v.iter_mut().enumerate() {
        *x = (i as u32).wrapping_mul(31).wrapping_add(b) as u8;
    }
    Ok(v)
}

fn is_block(v: &[u8], b: u32) -> bool {
    v.iter()
        .enumerate()
        .all(|(i, &x)| x == (i as u32).wrapping_mul(31).wrapping_add(b) as u8)
}

#[test]
fn decodes_after_eviction_reuse_the_evicted_buffers_within_the_budget() {
    const MIB: usize = 1 << 20;
    let budget = 64 << 20;
    let c: BlockCache<String> = BlockCache::new(budget);
    let within = |c: &BlockCache<String>| {
        let s = c.stats();
        assert!(s.bytes + s.pooled <= budget, "{s:?}");
    };
    // A reader holds block 7 throughout: its buffer is never reused.
    let mut held = None;
    // A cold load: each block decoded, then read whole (served).
    for b in 0..200 {
        let blk = c
            .get_or_load(key(1, b), || decode_into_taken(b, MIB))
            .unwrap();
        assert!(is_block(&blk, b), "block {b}");
        c.served(&key(1, b), MIB as u64);
        if b == 7 {
            held = Some(blk);
        }
        within(&c);
    }
    let p = c.pool_stats();
    // The served LRU keeps 4 MiB; after it filled, every decode took
    // the buffer of the block it evicted.
    assert!(p.fresh <= 6 && p.reused >= 194, "{p:?}");
    assert!(
        is_block(held.as_ref().unwrap(), 7),
        "a held block is never reused"
    );
    // Blocks decoded ahead and not read fill the budget: evicted
    // blocks' buffers are then freed, not kept, and cached plus kept
    // bytes stay within the budget.
    for b in 1000..1100 {
        c.get_or_load(key(1, b), || decode_into_taken(b, MIB))
            .unwrap();
        within(&c);
    }
    for b in 1090..1100 {
        assert!(is_block(&c.peek(&key(1, b)).unwrap(), b), "block {b}");
    }
    // Relief frees the kept buffers too.
    use ckptfs_format::memory::Relieve;
    c.relieve();
    assert_eq!((c.stats().bytes, c.stats().pooled), (0, 0));
}

#[test]
fn get_or_load_nowait_loads_its_own_copy_while_another_loads() {
    let c: Arc<BlockCache<String>> = Arc::new(BlockCache::new(1 << 20));
    let c2 = c.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let owner = std::thread::spawn(move || {
        c2.get_or_load(key(1, 0), || {
            tx.send(()).unwrap();
            go_rx.recv().unwrap();
            Ok(vec![1; 10])
        })
    });
    rx.recv().unwrap();
    // The owner is parked until we return: waiting would hang.
    let own = c.get_or_load_nowait(key(1, 0), || Ok(vec![1; 10])).unwrap();
    assert_eq!(*own, vec![1; 10]);
    go_tx.send(()).unwrap();
    let cached = owner.join().unwrap().unwrap();
    // The owner's block is the one cached; later calls hit it.
    let again = c
        .get_or_load_nowait(key(1, 0), || panic!("cached"))
        .unwrap();
    assert!(Arc::ptr_eq(&cached, &again));
    assert_eq!(c.stats().blocks, 1);
}

#[test]
fn concurrent_misses_load_once() {
    let c: Arc<BlockCache<String>> = Arc::new(BlockCache::new(1 << 20));
    let loads = Arc::new(AtomicUsize::new(0));
    let n = 8;
    let barrier = Arc::new(Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let (c, loads, barrier) = (c.clone(), loads.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                c.get_or_load(key(1, 0), || {
                    loads.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    Ok(vec![5; 1000])
                })
                .unwrap()
            })
        })
        .collect();
    let blocks: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(loads.load(Ordering::SeqCst), 1);
    assert!(blocks.iter().all(|b| Arc::ptr_eq(b, &blocks[0])));
}

#[test]
fn concurrent_waiters_all_get_the_error() {
    let c: Arc<BlockCache<String>> = Arc::new(BlockCache::new(1 << 20));
    let loads = Arc::new(AtomicUsize::new(0));
    let n = 6;
    let barrier = Arc::new(Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let (c, loads, barrier) = (c.clone(), loads.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                c.get_or_load(key(3, 1), || {
                    loads.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    Err::<Vec<u8>, _>("bad block".to_string())
                })
            })
        })
        .collect();
    for t in threads {
        assert!(matches!(t.join().unwrap(), Err(FetchError::Load(_))));
    }
    // All callers overlapped the single slow load (a straggler that
    // arrived after it finished would load again; allow that).
    assert!(loads.load(Ordering::SeqCst) >= 1);
    assert!(c.peek(&key(3, 1)).is_none());
}

#[test]
fn a_panicking_loader_releases_its_waiters() {
    let c: Arc<BlockCache<String>> = Arc::new(BlockCache::new(1 << 20));
    let c2 = c.clone();
    let loader = std::thread::spawn(move || {
        let _ = c2.get_or_load(key(1, 0), || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            panic!("decoder bug")
        });
    });
    std::thread::sleep(std::time::Duration::from_millis(10));
    let r = c.get_or_load(key(1, 0), || Ok(vec![1]));
    assert!(loader.join().is_err());
    // Either we waited on the panicking flight, or it had finished and
    // we loaded ourselves; never a hang.
    assert!(matches!(r, Err(FetchError::Panicked) | Ok(_)));
    assert_eq!(*c.get_or_load(key(1, 0), || Ok(vec![1])).unwrap(), vec![1]);
}
