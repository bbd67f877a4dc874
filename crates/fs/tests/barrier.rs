//! `fbarrier` and `fdatabarrier` (BarrierFS's ordering-only syncs) through the library: once
//! one returns, the file's transaction is dispatched, so a crash that keeps every write the
//! device had accepted recovers the file; and every crash state a device may leave (its
//! volatile cache cut at any point, the order kept) that holds a later barrier'd file holds
//! the earlier one too. On a device with barrier writes and on one without.

use jext_device::SimDevice;
use jext_fs::{mkfs, Fs, MkfsOptions, MountOptions};
use std::sync::Arc;

const A: &[u8] = b"written first, ordered by fbarrier";
const B: &[u8] = b"written second, ordered by fdatabarrier";

fn fresh(barrier_write: bool) -> Arc<SimDevice> {
    let dev = SimDevice::new(32 << 20);
    let dev = Arc::new(if barrier_write {
        dev.with_barrier_write()
    } else {
        dev
    });
    let opts = MkfsOptions {
        assume_zeroed: true,
        uuid: Some([7; 16]),
        ..MkfsOptions::default()
    };
    mkfs(dev.clone(), &opts).unwrap();
    dev
}

/// What a recovered file holds: its bytes, or None when it is missing.
fn content(fs: &Fs, path: &str) -> Option<Vec<u8>> {
    let f = fs.open_file(path).ok()?;
    let size = f.stat().unwrap().size as usize;
    Some(f.read_at(0, size).unwrap())
}

fn recovered(dev: SimDevice) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    let fs = Fs::open(Arc::new(dev), MountOptions::default()).expect("recovery mounts");
    let found = (content(&fs, "/a"), content(&fs, "/b"));
    fs.unmount().unwrap();
    found
}

fn barriers_order_what_they_cover(barrier_write: bool) {
    let dev = fresh(barrier_write);
    let fs = Fs::open(dev.clone(), MountOptions::default()).unwrap();
    let a = fs.create_file("/a", 0o644).unwrap();
    a.write_at(0, A).unwrap();
    a.fbarrier().unwrap();
    let b = fs.create_file("/b", 0o644).unwrap();
    b.write_at(0, B).unwrap();
    // A new file's name and size are metadata: fdatabarrier must order them too, as
    // fdatasync makes them durable.
    b.fdatabarrier().unwrap();
    let cached = dev.pending_writes();
    let everything = recovered(dev.crash_keeping(|_| true));
    assert_eq!(
        everything,
        (Some(A.to_vec()), Some(B.to_vec())),
        "both barriers returned, so both transactions were dispatched"
    );
    for kept in 0..=cached {
        let (a_now, b_now) = recovered(dev.crash_keeping(|i| i < kept));
        assert!(
            a_now.as_deref().is_none_or(|d| d == A || d.is_empty()),
            "{kept} cached writes kept: /a holds {a_now:?}"
        );
        if b_now.as_deref() == Some(B) {
            assert_eq!(
                a_now.as_deref(),
                Some(A),
                "{kept} kept: /b without /a before it"
            );
        }
    }
    drop((a, b));
    fs.unmount().unwrap();
}

#[test]
fn barriers_order_on_a_device_with_barrier_writes() {
    barriers_order_what_they_cover(true);
}

#[test]
fn barriers_order_on_a_device_that_orders_by_flushing() {
    barriers_order_what_they_cover(false);
}

/// A barrier on a file with nothing to order still ends an epoch: the running
/// transaction, holding other files' changes (here the creation of `/b`), is dispatched
/// before it returns.
#[test]
fn a_barrier_on_a_clean_file_still_commits_what_runs() {
    let dev = fresh(true);
    let fs = Fs::open(dev.clone(), MountOptions::default()).unwrap();
    let a = fs.create_file("/a", 0o644).unwrap();
    a.write_at(0, A).unwrap();
    a.fsync().unwrap();
    drop(fs.create_file("/b", 0o644).unwrap());
    a.fdatabarrier().unwrap();
    let (a_now, b_now) = recovered(dev.crash_keeping(|_| true));
    assert_eq!(a_now.as_deref(), Some(A));
    assert_eq!(
        b_now.as_deref(),
        Some(&[][..]),
        "/b's creation was in the running transaction when /a's barrier came"
    );
    drop(a);
    fs.unmount().unwrap();
}
