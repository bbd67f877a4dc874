//! The IO layer over real backends: the barrier-capable simulator's crash states keep
//! epochs in order (and a simulator that breaks them is caught); io_uring and the thread
//! engine leave the same bytes in an image file.

use jext_io::jext_device::{
    BlockDevice, FileDevice, LatencyModel, OverlayDevice, Selection, SimDevice, SimFault,
};
use jext_io::{EngineKind, Fence, IoConfig, IoFlags, IoQueue, WriteRequest};
use std::path::PathBuf;
use std::sync::Arc;

const BLOCK: u64 = 4096;
/// Epochs of the crash workload and the blocks each writes.
const EPOCHS: [&[u64]; 4] = [&[10, 3], &[7, 1, 12], &[5], &[2, 9]];

fn queue(dev: Arc<dyn BlockDevice>, engine: EngineKind) -> IoQueue {
    IoQueue::with_config(
        dev,
        IoConfig {
            engine,
            queue_depth: 8,
        },
    )
    .unwrap()
}

/// Writes each epoch's blocks (byte = epoch + 1), the last one a barrier write, and
/// returns the capture.
fn epochs_through(dev: Arc<SimDevice>) -> jext_io::jext_device::CrashCapture {
    dev.start_capture();
    let q = queue(dev.clone(), EngineKind::Native);
    assert!(q.barrier_mode(), "the simulator keeps barrier writes");
    let mut tickets = Vec::new();
    for (epoch, blocks) in EPOCHS.iter().enumerate() {
        let data: Arc<[u8]> = Arc::from(vec![epoch as u8 + 1; BLOCK as usize]);
        let (last, rest) = blocks.split_last().unwrap();
        let mut batch: Vec<WriteRequest> = rest
            .iter()
            .map(|b| WriteRequest::new(b * BLOCK, data.clone(), IoFlags::ORDERED))
            .collect();
        batch.push(WriteRequest::barrier(
            last * BLOCK,
            data,
            IoFlags::empty(),
            Fence::Flush,
        ));
        tickets.push(q.issue(batch));
    }
    for t in tickets {
        t.wait_transferred().unwrap();
    }
    drop(q);
    dev.take_capture().unwrap()
}

/// Every crash state the capture allows at its end; the number of them in which a later
/// epoch shows without all of an earlier one.
fn prefix_violations(capture: &jext_io::jext_device::CrashCapture) -> (usize, usize) {
    let end = capture.ops().len();
    let window = capture.window(end);
    assert!(window.len() <= 12, "small enough to enumerate");
    let (mut states, mut violations) = (0, 0);
    for mask in 0u64..(1 << window.len()) {
        let selection = Selection::from_mask(window.len(), mask);
        if !selection.respects_epochs(&window) {
            continue;
        }
        states += 1;
        let dev = capture.cursor().state(end, &selection);
        let complete: Vec<bool> = EPOCHS
            .iter()
            .enumerate()
            .map(|(e, blocks)| blocks.iter().all(|b| first_byte(&dev, *b) == e as u8 + 1))
            .collect();
        let any: Vec<bool> = EPOCHS
            .iter()
            .enumerate()
            .map(|(e, blocks)| blocks.iter().any(|b| first_byte(&dev, *b) == e as u8 + 1))
            .collect();
        let broken =
            (0..EPOCHS.len()).any(|later| any[later] && !complete[..later].iter().all(|c| *c));
        if broken {
            violations += 1;
        }
    }
    (states, violations)
}

fn first_byte(dev: &SimDevice, block: u64) -> u8 {
    let mut b = [0u8; 512];
    dev.read_at(block * BLOCK, &mut b).unwrap();
    b[0]
}

#[test]
fn crash_states_of_a_barrier_device_are_prefixes_of_the_epochs() {
    let dev = Arc::new(SimDevice::new(1 << 20).with_barrier_write());
    let capture = epochs_through(dev);
    let barriers = capture
        .ops()
        .iter()
        .filter(|op| matches!(op, jext_io::jext_device::LoggedOp::Barrier))
        .count();
    assert_eq!(barriers, EPOCHS.len(), "one epoch marker per barrier write");
    let (states, violations) = prefix_violations(&capture);
    assert!(states > EPOCHS.len(), "{states} states explored");
    assert_eq!(violations, 0);
}

#[test]
fn a_device_that_breaks_barriers_is_caught() {
    let dev = Arc::new(SimDevice::new(1 << 20).with_barrier_write());
    dev.inject(SimFault::LateBarriers);
    let (_, violations) = prefix_violations(&epochs_through(dev));
    assert!(
        violations > 0,
        "a later epoch persisted alone, and the check saw it"
    );
}

#[test]
fn a_timed_simulator_keeps_the_same_order() {
    let model = LatencyModel {
        dispatch_ns: 1_000,
        transfer_ns_per_kib: 100,
        command_ns: 2_000,
        flush_ns: 5_000,
        barrier_ns: 100,
        queue_depth: 4,
    };
    let dev = Arc::new(
        SimDevice::new(1 << 20)
            .with_barrier_write()
            .with_latency(model),
    );
    let capture = epochs_through(dev);
    assert_eq!(prefix_violations(&capture).1, 0);
}

/// `io_engine=auto`: the simulator's own queue where there is one, and no threads for an
/// overlay whose writes go to memory (each `jext fsck` of a crash state used to start 32).
#[test]
fn auto_runs_an_overlay_inline_and_the_simulator_on_its_queue() {
    let sim = Arc::new(SimDevice::new(1 << 20));
    assert_eq!(queue(sim.clone(), EngineKind::Auto).engine_name(), "native");
    let overlay: Arc<dyn BlockDevice> = Arc::new(OverlayDevice::new(sim.clone()));
    let q = queue(overlay.clone(), EngineKind::Auto);
    assert_eq!(q.engine_name(), "inline");
    let data: Arc<[u8]> = Arc::from(vec![9u8; BLOCK as usize]);
    q.write(BLOCK, data, IoFlags::empty()).unwrap();
    let mut back = [0u8; 512];
    overlay.read_at(BLOCK, &mut back).unwrap();
    assert_eq!(back, [9u8; 512], "the write landed in the overlay");
    assert_eq!(first_byte(&sim, 1), 0, "and never reached the base");
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("jext-io-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A mixed workload: orderless, ordered, barrier writes with both fences, FUA, a preflush
/// and overlapping rewrites (which must land last). Returns the image it must leave.
fn mixed_workload(q: &IoQueue, image_bytes: usize) -> Vec<u8> {
    let mut expected = vec![0u8; image_bytes];
    let mut apply = |r: &WriteRequest| {
        let at = r.offset as usize;
        expected[at..at + r.data.len()].copy_from_slice(&r.data);
    };
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut tickets = Vec::new();
    for round in 0..200u64 {
        let mut batch = Vec::new();
        for _ in 0..(next() % 6 + 1) {
            let blocks = next() % 3 + 1;
            let offset = (next() % 256) * BLOCK;
            let data: Arc<[u8]> = (0..blocks * BLOCK).map(|_| next() as u8).collect();
            let flags = match next() % 8 {
                0 => IoFlags::FUA,
                1..=3 => IoFlags::ORDERED,
                _ => IoFlags::empty(),
            };
            batch.push(WriteRequest::new(offset, data, flags));
        }
        let data: Arc<[u8]> = vec![round as u8; BLOCK as usize].into();
        let fence = if round % 2 == 0 {
            Fence::Flush
        } else {
            Fence::Caller
        };
        let extra = if round % 50 == 7 {
            IoFlags::PREFLUSH
        } else {
            IoFlags::empty()
        };
        batch.push(WriteRequest::barrier(
            (300 + round % 7) * BLOCK,
            data,
            extra,
            fence,
        ));
        batch.iter().for_each(&mut apply);
        tickets.push(q.issue(batch));
    }
    for t in tickets {
        t.wait_durable().unwrap();
    }
    expected
}

#[test]
fn io_uring_and_threads_write_the_same_bytes() {
    let dir = scratch("engines");
    let mut images = Vec::new();
    for engine in [EngineKind::Uring, EngineKind::Threads, EngineKind::Inline] {
        let path = dir.join(format!("{}.img", engine.name()));
        let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::create(&path, 2 << 20).unwrap());
        let q = match IoQueue::with_config(
            dev.clone(),
            IoConfig {
                engine,
                queue_depth: 16,
            },
        ) {
            Ok(q) => q,
            Err(e) if engine == EngineKind::Uring => {
                eprintln!("SKIPPED: io_uring is not available here ({e}); only threads checked");
                continue;
            }
            Err(e) => panic!("{e}"),
        };
        assert_eq!(q.engine_name(), engine.name());
        assert!(!q.barrier_mode(), "an image file has no barrier write");
        let expected = mixed_workload(&q, 2 << 20);
        let counted = dev.counters().snapshot();
        assert!(counted.writes > 0 && counted.flushes > 0, "{counted:?}");
        drop(q);
        let bytes = std::fs::read(&path).unwrap();
        assert!(
            bytes == expected,
            "{}: the last write to each byte did not win",
            engine.name()
        );
        images.push((engine, bytes));
    }
    let (reference_engine, reference) = images.last().unwrap();
    for (engine, bytes) in &images {
        assert!(
            bytes == reference,
            "{} and {} left different bytes",
            engine.name(),
            reference_engine.name()
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A queue of depth 16 on `dev` through io_uring, or `None` (said loudly) where the kernel
/// refuses io_uring.
fn uring_queue(dev: &Arc<dyn BlockDevice>) -> Option<IoQueue> {
    let config = IoConfig {
        engine: EngineKind::Uring,
        queue_depth: 16,
    };
    match IoQueue::with_config(dev.clone(), config) {
        Ok(q) => Some(q),
        Err(e) => {
            eprintln!("SKIPPED: io_uring is not available here ({e})");
            None
        }
    }
}

/// io_uring's flushes take two paths (`crate::uring`): one asked for by a waiting thread
/// runs on that thread; one released by a write's completion goes through the ring, so
/// that the reaper never blocks. Either way it happens exactly once, after the writes it
/// covers, and is counted once.
#[test]
fn io_uring_flushes_run_once_on_either_path() {
    let dir = scratch("uring-flush");
    let dev: Arc<dyn BlockDevice> =
        Arc::new(FileDevice::create(&dir.join("u.img"), 2 << 20).unwrap());
    let Some(q) = uring_queue(&dev) else {
        return;
    };
    let flushes = || dev.counters().snapshot().flushes;
    let before = flushes();
    q.flush().unwrap();
    assert_eq!(flushes(), before + 1, "a caller's flush runs once");
    for round in 0..20u64 {
        let before = flushes();
        // Writes in flight, then a write that needs them flushed first: its flush is
        // released by their completions, on the reaper's thread.
        let mut batch: Vec<WriteRequest> = (0..12)
            .map(|b| {
                WriteRequest::new(
                    b * BLOCK,
                    vec![round as u8; BLOCK as usize].into(),
                    IoFlags::empty(),
                )
            })
            .collect();
        batch.push(WriteRequest::new(
            20 * BLOCK,
            vec![round as u8; BLOCK as usize].into(),
            IoFlags::PREFLUSH,
        ));
        q.issue(batch).wait().unwrap();
        assert_eq!(flushes(), before + 1, "round {round}: one preflush");
    }
    drop(q);
    let bytes = std::fs::read(dir.join("u.img")).unwrap();
    assert!(bytes[..20 * BLOCK as usize + BLOCK as usize]
        .iter()
        .enumerate()
        .all(|(i, &b)| (i as u64 / BLOCK >= 12 && i as u64 / BLOCK != 20) || b == 19));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// This thread's voluntary context switches so far (it slept that often).
fn voluntary_switches() -> u64 {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("voluntary_ctxt_switches in /proc/thread-self/status")
}

/// A small write the queue holds alone runs on its caller's thread under io_uring
/// (`Engine::dispatch_alone`): the caller does not sleep until the reaper wakes it. Each
/// such write still lands and is counted once.
#[test]
fn io_uring_runs_a_lone_small_write_on_the_callers_thread() {
    let dir = scratch("uring-alone");
    let dev: Arc<dyn BlockDevice> =
        Arc::new(FileDevice::create(&dir.join("a.img"), 2 << 20).unwrap());
    let Some(q) = uring_queue(&dev) else {
        return;
    };
    let writes = || dev.counters().snapshot().writes;
    let (before, slept_before) = (writes(), voluntary_switches());
    for b in 0..50u64 {
        let data: Arc<[u8]> = vec![b as u8 + 1; BLOCK as usize].into();
        q.issue(vec![WriteRequest::new(b * BLOCK, data, IoFlags::empty())])
            .wait()
            .unwrap();
    }
    let slept = voluntary_switches() - slept_before;
    assert_eq!(writes(), before + 50, "each lone write counted once");
    // Through the ring most waits sleep until the reaper reports (30 of 50 here); a
    // buffered write to an image file on the caller's thread slept 0 times in 3 runs.
    assert!(
        slept < 10,
        "the caller slept {slept} times for 50 lone writes"
    );
    drop(q);
    let bytes = std::fs::read(dir.join("a.img")).unwrap();
    for b in 0..50usize {
        let block = &bytes[b * BLOCK as usize..(b + 1) * BLOCK as usize];
        assert!(block.iter().all(|&x| x == b as u8 + 1), "block {b}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
