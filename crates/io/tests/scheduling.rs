//! The epoch scheduler and order-preserving dispatch, seen from the device: a scripted
//! device records the commands and completes them in whatever order the test picks.

mod common;

use common::{Event, Scripted, Seen};
use jext_io::jext_device::{BlockDevice, WriteFlags};
use jext_io::{EngineKind, Fence, IoConfig, IoFlags, IoQueue, IoTicket, WriteRequest};
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

const BLOCK: u64 = 4096;

fn queue(dev: &Arc<Scripted>, depth: usize) -> IoQueue {
    let config = IoConfig {
        engine: EngineKind::Native,
        queue_depth: depth,
    };
    IoQueue::with_config(dev.clone(), config).unwrap()
}

fn block(byte: u8) -> Arc<[u8]> {
    Arc::from(vec![byte; BLOCK as usize])
}

/// The first byte of block `index` in what a crash of `dev` would keep now.
fn byte_after_a_crash(dev: &Scripted, index: u64) -> u8 {
    let mut b = vec![0u8; 512];
    dev.sim.crash().read_at(index * BLOCK, &mut b).unwrap();
    b[0]
}

/// What a test issued: one write per block.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Orderless,
    Ordered,
    Barrier(Fence),
}

fn request(index: u64, kind: Kind) -> WriteRequest {
    let data = block(index as u8 + 1);
    match kind {
        Kind::Orderless => WriteRequest::new(index * BLOCK, data, IoFlags::empty()),
        Kind::Ordered => WriteRequest::new(index * BLOCK, data, IoFlags::ORDERED),
        Kind::Barrier(fence) => WriteRequest::barrier(index * BLOCK, data, IoFlags::empty(), fence),
    }
}

/// Each issued block's epoch (ordered writes only) and each epoch's fence.
struct Issued {
    epoch_of: HashMap<u64, u64>,
    fences: Vec<Fence>,
}

impl Issued {
    fn new() -> Issued {
        Issued {
            epoch_of: HashMap::new(),
            fences: Vec::new(),
        }
    }

    fn note(&mut self, index: u64, kind: Kind) {
        let epoch = self.fences.len() as u64;
        match kind {
            Kind::Orderless => {}
            Kind::Ordered => {
                self.epoch_of.insert(index, epoch);
            }
            Kind::Barrier(fence) => {
                self.epoch_of.insert(index, epoch);
                self.fences.push(fence);
            }
        }
    }
}

/// Checks the device's log against the promises of the epoch scheduler.
fn check_order(events: &[Event], issued: &Issued, barrier_mode: bool) {
    let mut dispatched_at: HashMap<u64, usize> = HashMap::new();
    let mut completed_at: HashMap<u64, usize> = HashMap::new();
    let mut id_blocks: HashMap<usize, Vec<u64>> = HashMap::new();
    // (dispatch index, completion index) of every flush.
    let mut flushes: Vec<(usize, Option<usize>)> = Vec::new();
    let mut flush_ids: HashMap<usize, usize> = HashMap::new();
    let mut last_barrier_of: HashMap<u64, (usize, bool)> = HashMap::new();
    for (i, event) in events.iter().enumerate() {
        match event {
            Event::Dispatched {
                id,
                command: Seen::Flush,
            } => {
                flush_ids.insert(*id, flushes.len());
                flushes.push((i, None));
            }
            Event::Dispatched {
                id,
                command: Seen::Write { offset, len, flags },
            } => {
                let blocks: Vec<u64> = (offset / BLOCK..(offset + len) / BLOCK).collect();
                let epochs: Vec<u64> = blocks
                    .iter()
                    .filter_map(|b| issued.epoch_of.get(b).copied())
                    .collect();
                assert!(
                    epochs.windows(2).all(|w| w[0] == w[1]),
                    "one command mixes epochs {epochs:?}"
                );
                assert!(
                    barrier_mode || !flags.contains(WriteFlags::BARRIER),
                    "a barrier write reached a device without one"
                );
                if let Some(&k) = epochs.first() {
                    last_barrier_of.insert(k, (i, flags.contains(WriteFlags::BARRIER)));
                    check_epoch_released(
                        k,
                        i,
                        issued,
                        barrier_mode,
                        &dispatched_at,
                        &completed_at,
                        &flushes,
                    );
                } else {
                    assert!(
                        !flags.contains(WriteFlags::BARRIER),
                        "an orderless command carries the barrier"
                    );
                }
                for b in &blocks {
                    dispatched_at.insert(*b, i);
                }
                id_blocks.insert(*id, blocks);
            }
            Event::Completed { id } => {
                if let Some(f) = flush_ids.get(id) {
                    flushes[*f].1 = Some(i);
                }
                for b in id_blocks.get(id).into_iter().flatten() {
                    completed_at.insert(*b, i);
                }
            }
        }
    }
    if barrier_mode {
        for (epoch, _) in issued.fences.iter().enumerate() {
            if let Some((_, barrier)) = last_barrier_of.get(&(epoch as u64)) {
                assert!(
                    barrier,
                    "the last command of epoch {epoch} carries no barrier"
                );
            }
        }
    }
}

/// At event `at`, a write of epoch `k` goes: every earlier epoch must be released.
fn check_epoch_released(
    k: u64,
    at: usize,
    issued: &Issued,
    barrier_mode: bool,
    dispatched_at: &HashMap<u64, usize>,
    completed_at: &HashMap<u64, usize>,
    flushes: &[(usize, Option<usize>)],
) {
    for (&b, &e) in &issued.epoch_of {
        if e >= k {
            continue;
        }
        assert!(
            dispatched_at.get(&b).is_some_and(|&d| d < at),
            "block {b} of epoch {e} not dispatched before epoch {k} went (event {at})"
        );
        if barrier_mode || issued.fences[e as usize] == Fence::Caller {
            continue;
        }
        let done = completed_at.get(&b).copied().unwrap_or_else(|| {
            panic!("block {b} of flush-fenced epoch {e} not transferred before epoch {k}")
        });
        assert!(
            flushes
                .iter()
                .any(|&(d, c)| d > done && c.is_some_and(|c| c < at)),
            "no flush after block {b} of epoch {e} completed before epoch {k} went"
        );
    }
}

fn kind_strategy() -> impl Strategy<Value = Kind> {
    prop_oneof![
        3 => Just(Kind::Orderless),
        4 => Just(Kind::Ordered),
        1 => Just(Kind::Barrier(Fence::Flush)),
        1 => Just(Kind::Barrier(Fence::Caller)),
    ]
}

/// A batch of kinds, then how many completions (and which) before the next batch.
fn steps() -> impl Strategy<Value = Vec<(Vec<Kind>, Vec<usize>)>> {
    prop::collection::vec(
        (
            prop::collection::vec(kind_strategy(), 1..6),
            prop::collection::vec(0usize..16, 0..5),
        ),
        1..10,
    )
}

fn run_steps(barrier: bool, depth: usize, blocks: Vec<u64>, steps: Vec<(Vec<Kind>, Vec<usize>)>) {
    let dev = Scripted::new(barrier, depth);
    let q = queue(&dev, depth);
    assert_eq!(q.barrier_mode(), barrier);
    let mut issued = Issued::new();
    let mut tickets: Vec<IoTicket> = Vec::new();
    let mut next = blocks.into_iter();
    for (kinds, completions) in steps {
        let batch: Vec<WriteRequest> = kinds
            .iter()
            .map(|&kind| {
                let index = next.next().expect("enough blocks");
                issued.note(index, kind);
                request(index, kind)
            })
            .collect();
        tickets.push(q.issue(batch));
        for c in completions {
            dev.complete(c);
        }
    }
    dev.complete_all();
    for t in &tickets {
        t.wait_transferred().unwrap();
    }
    check_order(&dev.events(), &issued, barrier);
    for &b in issued.epoch_of.keys() {
        let mut got = vec![0u8; BLOCK as usize];
        q.read(b * BLOCK, &mut got).unwrap();
        assert_eq!(got[0], b as u8 + 1);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn no_write_crosses_an_epoch(
        barrier in any::<bool>(),
        depth in 1usize..6,
        blocks in Just((0u64..64).collect::<Vec<_>>()).prop_shuffle(),
        steps in steps(),
    ) {
        run_steps(barrier, depth, blocks, steps);
    }
}

#[test]
fn writes_of_one_epoch_sort_and_merge_and_the_last_takes_the_barrier() {
    for barrier in [true, false] {
        let dev = Scripted::new(barrier, 8);
        let q = queue(&dev, 8);
        let first = q.issue(vec![
            request(2, Kind::Ordered),
            request(0, Kind::Ordered),
            request(3, Kind::Orderless),
            request(1, Kind::Barrier(Fence::Caller)),
        ]);
        let second = q.issue(vec![request(4, Kind::Barrier(Fence::Caller))]);
        dev.complete_all();
        first.wait_transferred().unwrap();
        second.wait_transferred().unwrap();
        let barrier_flag = if barrier {
            WriteFlags::BARRIER
        } else {
            WriteFlags::empty()
        };
        let writes: Vec<Seen> = dev
            .events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Dispatched { command, .. } => Some(command),
                Event::Completed { .. } => None,
            })
            .collect();
        assert_eq!(
            writes,
            vec![
                Seen::Write {
                    offset: 0,
                    len: 4 * BLOCK,
                    flags: barrier_flag
                },
                Seen::Write {
                    offset: 4 * BLOCK,
                    len: BLOCK,
                    flags: barrier_flag
                },
            ],
            "barrier mode {barrier}: one epoch merged whole, the next not merged into it"
        );
    }
}

#[test]
fn on_a_barrier_device_the_next_epoch_goes_before_the_last_one_transferred() {
    let dev = Scripted::new(true, 8);
    let q = queue(&dev, 8);
    let a = q.issue(vec![request(0, Kind::Barrier(Fence::Flush))]);
    let b = q.issue(vec![request(5, Kind::Barrier(Fence::Flush))]);
    assert!(
        a.is_dispatched() && b.is_dispatched(),
        "Wait-on-Dispatch, not on transfer"
    );
    assert_eq!(dev.held(), 2, "both in the device at once, no flush");
    dev.complete_all();

    let dev = Scripted::new(false, 8);
    let q = queue(&dev, 8);
    let a = q.issue(vec![request(0, Kind::Barrier(Fence::Flush))]);
    let b = q.issue(vec![request(5, Kind::Barrier(Fence::Flush))]);
    assert!(
        a.is_dispatched() && !b.is_dispatched(),
        "held behind the fence"
    );
    dev.complete(0);
    assert!(
        !b.is_dispatched(),
        "transferred is not enough: the flush comes first"
    );
    assert_eq!(
        dev.events().last(),
        Some(&Event::Dispatched {
            id: 1,
            command: Seen::Flush
        })
    );
    dev.complete(0);
    assert!(
        b.is_dispatched(),
        "the flush completed: the next epoch goes"
    );
    dev.complete_all();
    let c = q.issue(vec![request(9, Kind::Barrier(Fence::Caller))]);
    let d = q.issue(vec![request(10, Kind::Ordered)]);
    assert!(
        c.is_dispatched() && d.is_dispatched(),
        "a caller-kept fence holds nothing back"
    );
    dev.complete_all();
}

#[test]
fn stages_come_in_order_and_durability_costs_one_shared_flush() {
    let dev = Scripted::new(false, 1);
    let q = Arc::new(queue(&dev, 1));
    let t = q.issue(vec![
        request(0, Kind::Orderless),
        request(7, Kind::Orderless),
    ]);
    assert!(!t.is_dispatched(), "queue depth 1: the second write waits");
    dev.complete(0);
    assert!(t.is_dispatched() && !t.is_transferred());
    dev.complete(0);
    assert!(t.is_transferred());
    t.wait_transferred().unwrap();
    let fua = q.issue(vec![WriteRequest::new(BLOCK * 9, block(9), IoFlags::FUA)]);
    dev.complete(0);
    fua.wait_durable().unwrap();
    let flushes_before = dev.sim.counters().snapshot().flushes;
    assert_eq!(flushes_before, 0, "a FUA write needs no flush");

    let tickets: Vec<IoTicket> = [11, 12, 13]
        .map(|b| q.issue(vec![request(b, Kind::Orderless)]))
        .into();
    dev.complete_all();
    let waiters: Vec<_> = std::iter::once(t)
        .chain(tickets)
        .map(|t| std::thread::spawn(move || t.wait_durable()))
        .collect();
    while dev.held() == 0 {
        std::thread::yield_now();
    }
    assert!(dev.complete(0), "the flush");
    for w in waiters {
        w.join().unwrap().unwrap();
    }
    assert_eq!(
        dev.sim.counters().snapshot().flushes,
        1,
        "one flush for four waiters"
    );
    assert_eq!(dev.held(), 0);
    assert_eq!(
        byte_after_a_crash(&dev, 7),
        8,
        "durable means it survives the crash"
    );
}

/// A queue 4 deep on a scripted device, block 1 written and transferred (not durable).
fn queue_with_one_write_transferred() -> (Arc<Scripted>, Arc<IoQueue>) {
    let dev = Scripted::new(false, 4);
    let q = Arc::new(queue(&dev, 4));
    let first = q.issue(vec![request(1, Kind::Orderless)]);
    dev.complete_all();
    first.wait_transferred().unwrap();
    (dev, q)
}

fn flush_in_a_thread(
    q: &Arc<IoQueue>,
) -> std::thread::JoinHandle<Result<(), jext_io::jext_device::DeviceError>> {
    let q = q.clone();
    std::thread::spawn(move || q.flush())
}

/// One flush in flight at a time: the flushes wanted while one is in flight wait for it
/// and then share one, which covers every write completed by its dispatch.
#[test]
fn flushes_wanted_during_a_flush_share_the_next_one() {
    let (dev, q) = queue_with_one_write_transferred();
    let early = flush_in_a_thread(&q);
    while dev.held() == 0 {
        std::thread::yield_now();
    }
    let later = q.issue(vec![
        request(2, Kind::Orderless),
        request(5, Kind::Orderless),
    ]);
    while !later.is_dispatched() {
        std::thread::yield_now();
    }
    dev.complete(1);
    dev.complete(1);
    later.wait_transferred().unwrap();
    let waiters: Vec<_> = (0..3).map(|_| flush_in_a_thread(&q)).collect();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        dev.held(),
        1,
        "no second flush while the first is in flight"
    );
    assert!(dev.complete(0), "the first flush");
    early.join().unwrap().unwrap();
    while dev.held() == 0 {
        std::thread::yield_now();
    }
    assert!(dev.complete(0), "the one flush the three waiters share");
    for w in waiters {
        w.join().unwrap().unwrap();
    }
    assert_eq!(dev.sim.counters().snapshot().flushes, 2);
    assert_eq!(
        byte_after_a_crash(&dev, 5),
        6,
        "the shared flush made the later writes durable"
    );
}

/// A flush waits for the sync writes that were in flight when it was wanted, so that it
/// covers them too.
#[test]
fn a_flush_waits_for_the_sync_writes_in_flight_when_it_was_wanted() {
    let (dev, q) = queue_with_one_write_transferred();
    let in_flight = q.issue(vec![request(3, Kind::Orderless)]);
    while !in_flight.is_dispatched() {
        std::thread::yield_now();
    }
    let flusher = flush_in_a_thread(&q);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(dev.held(), 1, "only the write: the flush waits for it");
    assert!(dev.complete(0), "the write");
    while dev.held() == 0 {
        std::thread::yield_now();
    }
    assert!(dev.complete(0), "the flush");
    flusher.join().unwrap().unwrap();
    assert_eq!(dev.sim.counters().snapshot().flushes, 1);
    assert_eq!(
        byte_after_a_crash(&dev, 3),
        4,
        "the one flush covered the write that was in flight"
    );
}

/// Background writeback (blk-wbt's idea): a sync write issued behind a backlog of it goes
/// at once; while sync IO is in the device, only two background commands are; none is
/// merged past 1 MiB. Nothing is lost on the way.
#[test]
fn background_writes_yield_to_a_sync_write_and_are_metered() {
    let dev = Scripted::new(false, 32);
    let q = queue(&dev, 32);
    let background = |index: u64| WriteRequest::new(index * BLOCK, block(7), IoFlags::BACKGROUND);
    // Every other block: 40 writes that cannot merge.
    let backlog = q.issue((0..40).map(|i| background(2 * i)).collect());
    assert_eq!(
        dev.held(),
        8,
        "the device is theirs alone: 8 background commands go"
    );
    let sync = q.issue(vec![request(200, Kind::Orderless)]);
    let sync_went_at_once = dev.held() == 9;
    // Complete the oldest commands (background ones) with the sync write held: each time,
    // what the device holds besides it, until it is down to what the meter allows.
    let mut background_held = vec![dev.held() - 1];
    while background_held.last() > Some(&2) {
        assert!(dev.complete(0));
        background_held.push(dev.held() - 1);
    }
    assert!(dev.complete(0));
    background_held.push(dev.held() - 1);
    // Asserted only now: a failed assertion with commands held would hang the queue's drop.
    dev.complete_all();
    sync.wait_transferred().unwrap();
    backlog.wait_transferred().unwrap();
    assert!(
        sync_went_at_once,
        "the sync write goes at once, ahead of 32 pending ones"
    );
    assert_eq!(
        background_held,
        vec![8, 7, 6, 5, 4, 3, 2, 2],
        "with the sync write in the device, background commands drain to 2 and stay there"
    );
    // 2 MiB of contiguous background writes go in commands of at most 1 MiB.
    let contiguous = q.issue((1024..1536).map(background).collect());
    dev.complete_all();
    contiguous.wait_transferred().unwrap();
    let longest = dev
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Dispatched {
                command: Seen::Write { len, .. },
                ..
            } => Some(len),
            _ => None,
        })
        .max();
    assert_eq!(longest, Some(1 << 20), "background commands stop at 1 MiB");
}

/// Shortly after an fsync starts, background writes go one command at a time of at most
/// 128 KiB: what the fsync's writes find ahead of them, and about what its flush must make
/// durable of them. A while later the usual metering is back.
#[test]
fn background_writes_shrink_after_an_fsync_starts() {
    let background = |index: u64| WriteRequest::new(index * BLOCK, block(7), IoFlags::BACKGROUND);
    // The window is a few milliseconds: a run that a busy machine stalled past it proves
    // nothing either way, and is tried again.
    for _ in 0..20 {
        let dev = Scripted::new(false, 32);
        let q = queue(&dev, 32);
        let started = Instant::now();
        q.note_fsync();
        let contiguous = q.issue((0..512).map(background).collect());
        let held_after_fsync = dev.held();
        dev.complete_all();
        contiguous.wait_transferred().unwrap();
        if started.elapsed() >= Duration::from_millis(4) {
            continue;
        }
        assert_eq!(held_after_fsync, 1, "one background command after an fsync");
        assert_eq!(
            longest_write(&dev.events()),
            Some(128 << 10),
            "of at most 128 KiB"
        );
        std::thread::sleep(Duration::from_millis(10));
        let seen = dev.events().len();
        let later = q.issue((1024..1536).map(background).collect());
        let held_later = dev.held();
        dev.complete_all();
        later.wait_transferred().unwrap();
        assert_eq!(held_later, 2, "later, 2 MiB go as two commands");
        assert_eq!(longest_write(&dev.events()[seen..]), Some(1 << 20));
        return;
    }
    panic!("20 tries, each stalled past the fsync's window");
}

/// The longest write command dispatched among `events`.
fn longest_write(events: &[Event]) -> Option<u64> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Dispatched {
                command: Seen::Write { len, .. },
                ..
            } => Some(*len),
            _ => None,
        })
        .max()
}

#[test]
fn a_failed_write_fails_its_ticket_and_everything_ordered_after_it() {
    for barrier in [true, false] {
        let dev = Scripted::new(barrier, 8);
        dev.fail_writes_at(0);
        let q = queue(&dev, 8);
        let first = q.issue(vec![request(0, Kind::Barrier(Fence::Flush))]);
        let second = q.issue(vec![request(2, Kind::Barrier(Fence::Flush))]);
        let orderless = q.issue(vec![request(20, Kind::Orderless)]);
        dev.complete_all();
        assert!(first.wait_transferred().is_err());
        let err = second.wait_transferred().unwrap_err();
        assert!(
            err.to_string().contains("earlier ordered write failed"),
            "{err}"
        );
        orderless.wait_transferred().unwrap();
        let later = q.issue(vec![request(4, Kind::Ordered)]);
        assert!(
            later.wait_transferred().is_err(),
            "order past a failure cannot be kept"
        );
        let dispatched_second = dev.events().iter().any(|e| {
            matches!(e, Event::Dispatched { command: Seen::Write { offset, .. }, .. } if *offset == 2 * BLOCK)
        });
        assert_eq!(
            dispatched_second, barrier,
            "with a barrier write the next epoch was already in the device; without, it never left"
        );
    }
}

#[test]
fn overlapping_writes_land_in_issue_order() {
    let dev = Scripted::new(false, 8);
    let q = queue(&dev, 8);
    let older = q.issue(vec![WriteRequest::new(
        0,
        Arc::from(vec![1u8; 8192]),
        IoFlags::empty(),
    )]);
    let newer = q.issue(vec![WriteRequest::new(
        4096,
        Arc::from(vec![2u8; 4096]),
        IoFlags::empty(),
    )]);
    assert!(
        !newer.is_dispatched(),
        "waits for the older write to transfer"
    );
    dev.complete(0);
    dev.complete_all();
    older.wait_transferred().unwrap();
    newer.wait_transferred().unwrap();
    let mut b = vec![0u8; 8192];
    q.read(0, &mut b).unwrap();
    assert_eq!((b[0], b[4096]), (1, 2));
}
