//! fsync of a file whose pages another thread is writing back. The pages are clean (their
//! writes are in flight), so fsync finds nothing dirty; it must still wait for those
//! writes, as Linux's `filemap_write_and_wait` waits on `PG_writeback`: returning before
//! them would promise durable data the device does not have.
//!
//! A device holds the file's data writes at a door; a throttled writer of another file
//! writes the file back in the background (and reaches the door); fsync runs meanwhile.
//! The door opens only after fsync had time to return: an fsync that returned while it
//! was still shut broke its promise.

mod common;

use common::{DeviceHook, HookedDevice};
use jext_fs::{mkfs, Fs, MkfsOptions, MountOptions};
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::time::Duration;

/// Bytes of the file under test.
const F_BYTES: usize = 1536 << 10;

/// The first bytes of every page of the file under test: its writes are the ones held.
const MAGIC: [u8; 8] = *b"jextDOOR";

#[derive(Clone, Copy, Default, PartialEq, Debug)]
enum Door {
    /// Writes pass.
    #[default]
    Open,
    /// The next write of the file's pages stops here.
    Armed,
    /// A write of the file's pages is waiting.
    Holding,
}

/// Holds, once armed, the first write starting with [`MAGIC`].
#[derive(Default)]
struct WriteDoor {
    door: Mutex<Door>,
    turn: Condvar,
}

impl WriteDoor {
    fn is(&self, state: Door) -> bool {
        *self.door.lock() == state
    }

    fn set(&self, to: Door) {
        *self.door.lock() = to;
        self.turn.notify_all();
    }

    /// Waits until a write is held; panics if none comes.
    fn wait_holding(&self) {
        let mut door = self.door.lock();
        while *door != Door::Holding {
            let timed_out = self.turn.wait_for(&mut door, Duration::from_secs(20));
            assert!(
                !timed_out.timed_out() || *door == Door::Holding,
                "no background writeback of the file reached the device"
            );
        }
    }
}

impl DeviceHook for WriteDoor {
    fn before_write(&self, _offset: u64, data: &[u8]) {
        let mut door = self.door.lock();
        if *door == Door::Armed && data.starts_with(&MAGIC) {
            *door = Door::Holding;
            self.turn.notify_all();
            while *door == Door::Holding {
                self.turn.wait(&mut door);
            }
        }
    }
    fn name(&self) -> &'static str {
        "a door for writes"
    }
}

/// `len` bytes of pages that each start with [`MAGIC`].
fn marked_pages(len: usize, fill: u8) -> Vec<u8> {
    let mut data = vec![fill; len];
    for page in data.chunks_mut(4096) {
        page[..MAGIC.len()].copy_from_slice(&MAGIC);
    }
    data
}

/// Writes 512 KiB to `/f` (`overwrite`: over blocks an earlier fsync mapped), lets another
/// file's throttled writer write `/f` back into the door, fsyncs `/f` meanwhile, and
/// returns whether that fsync returned with the door still shut.
fn fsync_returned_before_its_data(overwrite: bool) -> bool {
    let dev = Arc::new(HookedDevice::new(64 << 20, WriteDoor::default()));
    let mkfs_options = MkfsOptions {
        assume_zeroed: true,
        ..MkfsOptions::default()
    };
    mkfs(dev.clone(), &mkfs_options).unwrap();
    // 3 MiB of pages, throttled from 2.25 MiB of dirty data (three quarters): `/f` alone
    // stays under it, `/f` and `/g` together go over, and `/g`'s writer, once its own
    // file is out, writes `/f` back too, since 1.5 MiB is still over half the threshold.
    let options = MountOptions {
        cache_size_bytes: 4 << 20,
        ..MountOptions::default()
    };
    let fs = Fs::open(dev.clone(), options).unwrap();
    let f = fs.create_file("/f", 0o644).unwrap();
    if overwrite {
        f.write_at(0, &vec![1; F_BYTES]).unwrap();
        f.fsync().unwrap();
    }
    f.write_at(0, &marked_pages(F_BYTES, 2)).unwrap();
    dev.hook.set(Door::Armed);
    let early = std::thread::scope(|scope| {
        let throttled = scope.spawn(|| {
            let g = fs.create_file("/g", 0o644).unwrap();
            g.write_at(0, &vec![3; 1 << 20]).unwrap();
        });
        dev.hook.wait_holding();
        let syncer = scope.spawn(|| {
            f.fsync().unwrap();
            dev.hook.is(Door::Holding)
        });
        // Long enough for an fsync that does not wait to return.
        std::thread::sleep(Duration::from_millis(300));
        dev.hook.set(Door::Open);
        throttled.join().unwrap();
        syncer.join().unwrap()
    });
    assert_eq!(f.read_at(0, F_BYTES).unwrap(), marked_pages(F_BYTES, 2));
    drop(f);
    fs.unmount().unwrap();
    early
}

#[test]
fn fsync_waits_for_a_background_writeback_of_new_blocks() {
    assert!(
        !fsync_returned_before_its_data(false),
        "fsync returned while the file's data was still on its way to the device"
    );
}

#[test]
fn fsync_waits_for_a_background_writeback_in_place() {
    assert!(
        !fsync_returned_before_its_data(true),
        "fsync returned while the file's data was still on its way to the device"
    );
}
