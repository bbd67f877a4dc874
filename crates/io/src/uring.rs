//! The io_uring engine: writes go to the device's file descriptor through one ring, many
//! in flight at once; a reaper thread takes completions. FUA is the write's own
//! `RWF_DSYNC` flag (a FUA command on a block device that has one). For `O_DIRECT`
//! descriptors, buffers that are not aligned are copied into aligned ones.
//!
//! A flush is the device's own synchronous flush, run on the thread that dispatches it
//! (the journal's flush thread, or an fsync's caller), and reported from there. The kernel
//! cannot run `IORING_OP_FSYNC` without blocking, so the ring would hand it to an io-wq
//! worker and its completion to the reaper: two more thread wake-ups on every sync path,
//! about a quarter of the context switches of a data-journaled fsync on a 2-core VM. Only a
//! flush dispatched by the reaper itself (a completion released it) goes through the ring,
//! so that one flush never holds up the completions of other writes. While a flush runs
//! on its dispatching thread, that thread is the dispatcher's pump, so nothing else is
//! dispatched until it returns (as with the inline engine); concurrent fsyncs still gained
//! (dwsl at 8 threads, 4,651–5,304 -> 6,072–6,600 fsyncs/s, three runs each).
//!
//! A small write the queue holds alone (nothing else pending or in flight) runs on its
//! dispatching thread too, for the same reason: a lone fsync's commit is one such write,
//! and its caller waits for it next; through the ring it cost the reaper's wake-up and the
//! caller's.
//!
//! Promises: a buffer stays alive (held here) until the kernel reported its command; every
//! command is reported once; a short write is an error, never a silent success; dropping
//! the engine waits for every command in the ring. The device's counters count what the
//! ring did, as the backend's own methods would. It does not keep dispatch order (the
//! kernel completes commands in any order), so the IO layer never relies on a barrier write
//! through it.

use crate::engine::{join_unless_current, run, unsupported, Engine, EngineKind, Sink};
use io_uring::{opcode, types, IoUring};
use jext_device::{
    check_range, AlignedBuf, BlockDevice, Command, DeviceError, DeviceOp, RawTarget, WriteFlags,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{JoinHandle, ThreadId};

/// The largest write that runs on its caller's thread when the queue holds nothing else:
/// an fsync's commit or data (a 4 KiB append + fsync journals 8 KiB), not a stream's
/// merged writes.
const ALONE_WRITE_MAX_BYTES: usize = 64 << 10;

/// The tag of the no-op that wakes the reaper to stop.
const SHUTDOWN_TAG: u64 = u64::MAX;

pub(crate) struct UringEngine {
    shared: Arc<Shared>,
    reaper: Option<JoinHandle<()>>,
    depth: usize,
}

struct Shared {
    ring: IoUring,
    device: Arc<dyn BlockDevice>,
    target: RawTarget,
    sink: Sink,
    /// Held while a thread fills the submission queue: one writer of it at a time.
    submitting: Mutex<()>,
    /// What the kernel may still be using, by tag.
    held: Mutex<HashMap<u64, Held>>,
    shutting_down: AtomicBool,
    /// The reaper thread's id, once it runs.
    reaper: OnceLock<ThreadId>,
}

enum Held {
    Write {
        offset: u64,
        buffer: Buffer,
        fua: bool,
    },
    Flush,
    Stop,
}

enum Buffer {
    Shared(Arc<[u8]>),
    Aligned(AlignedBuf),
}

impl Buffer {
    fn bytes(&self) -> &[u8] {
        match self {
            Buffer::Shared(b) => b,
            Buffer::Aligned(b) => b.as_slice(),
        }
    }
}

impl UringEngine {
    pub(crate) fn start(
        device: Arc<dyn BlockDevice>,
        depth: usize,
        sink: Sink,
    ) -> Result<UringEngine, DeviceError> {
        let target = device
            .raw_target()
            .ok_or_else(|| unsupported(&device, "has no file descriptor for io_uring"))?;
        // One more entry than the queue depth, for the stop no-op.
        let entries = (depth + 1).next_power_of_two() as u32;
        let ring = IoUring::new(entries).map_err(|e| DeviceError::io(DeviceOp::Open, 0, 0, &e))?;
        let shared = Arc::new(Shared {
            ring,
            device,
            target,
            sink,
            submitting: Mutex::new(()),
            held: Mutex::new(HashMap::new()),
            shutting_down: AtomicBool::new(false),
            reaper: OnceLock::new(),
        });
        let reaping = shared.clone();
        let reaper = std::thread::Builder::new()
            .name("jext-uring".into())
            .spawn(move || reaping.reap())
            .map_err(|e| DeviceError::io(DeviceOp::Open, 0, 0, &e))?;
        Ok(UringEngine {
            shared,
            reaper: Some(reaper),
            depth,
        })
    }
}

impl Shared {
    /// Puts one entry in the ring and submits it. The buffer it points into must already
    /// be held under its tag.
    fn push(&self, entry: &io_uring::squeue::Entry) -> Result<(), DeviceError> {
        let _one_writer = self.submitting.lock();
        // SAFETY: only a thread holding `submitting` makes a submission queue, so no other
        // one exists now; the buffer the entry points to is held in `held` until the
        // reaper has the kernel's completion for this tag, so it outlives the command.
        let pushed = unsafe { self.ring.submission_shared().push(entry) };
        pushed.map_err(|_| {
            DeviceError::media(DeviceOp::Write, 0, 0, "io_uring submission queue full")
        })?;
        loop {
            match self.ring.submit() {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(DeviceError::io(DeviceOp::Write, 0, 0, &e)),
            }
        }
    }

    fn dispatch(&self, tag: u64, command: Command) -> Result<(), DeviceError> {
        let fd = types::Fd(self.target.fd);
        let entry = match command {
            Command::Write {
                offset,
                data,
                flags,
            } => {
                check_range(self.device.as_ref(), DeviceOp::Write, offset, data.len())?;
                if flags.contains(WriteFlags::BARRIER) {
                    return Err(DeviceError::unsupported(
                        DeviceOp::Write,
                        offset,
                        data.len(),
                        "io_uring has no barrier write",
                    ));
                }
                let buffer = self.buffer_for(data);
                let bytes = buffer.bytes();
                let fua = flags.contains(WriteFlags::FUA);
                let entry = opcode::Write::new(fd, bytes.as_ptr(), bytes.len() as u32)
                    .offset(offset)
                    .rw_flags(if fua { libc::RWF_DSYNC } else { 0 })
                    .build()
                    .user_data(tag);
                self.held.lock().insert(
                    tag,
                    Held::Write {
                        offset,
                        buffer,
                        fua,
                    },
                );
                entry
            }
            Command::Flush if !self.is_reaper() => {
                self.sink.complete(tag, self.device.flush());
                return Ok(());
            }
            Command::Flush => {
                self.held.lock().insert(tag, Held::Flush);
                opcode::Fsync::new(fd)
                    .flags(types::FsyncFlags::DATASYNC)
                    .build()
                    .user_data(tag)
            }
        };
        self.push(&entry).inspect_err(|_| {
            self.held.lock().remove(&tag);
        })
    }

    /// Whether the calling thread is this engine's reaper.
    fn is_reaper(&self) -> bool {
        self.reaper.get() == Some(&std::thread::current().id())
    }

    /// The bytes as the descriptor needs them: shared as they are, or copied to an
    /// aligned buffer for `O_DIRECT`.
    fn buffer_for(&self, data: Arc<[u8]>) -> Buffer {
        let align = self.target.buffer_align;
        if align <= 1 || (data.as_ptr() as usize).is_multiple_of(align) {
            return Buffer::Shared(data);
        }
        let mut aligned = AlignedBuf::zeroed(data.len());
        aligned.as_mut_slice().copy_from_slice(&data);
        Buffer::Aligned(aligned)
    }

    /// The reaper thread: waits for completions and reports them, until told to stop and
    /// nothing is left in the ring.
    fn reap(&self) {
        let _ = self.reaper.set(std::thread::current().id());
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => panic!("io_uring wait failed: {e}"),
            }
            // SAFETY: this thread is the only one that ever makes a completion queue.
            let done: Vec<(u64, i32)> = unsafe { self.ring.completion_shared() }
                .map(|c| (c.user_data(), c.result()))
                .collect();
            for (tag, res) in done {
                let held = self.held.lock().remove(&tag);
                match held {
                    Some(Held::Stop) | None => {}
                    Some(held) => self.sink.complete(tag, self.outcome(held, res)),
                }
            }
            if self.shutting_down.load(Ordering::Acquire) && self.held.lock().is_empty() {
                return;
            }
        }
    }

    /// What a completion means, counted as the device counts its own requests.
    fn outcome(&self, held: Held, res: i32) -> Result<(), DeviceError> {
        let counters = self.device.counters();
        match held {
            Held::Write {
                offset,
                buffer,
                fua,
            } => {
                let len = buffer.bytes().len();
                if res < 0 {
                    let e = std::io::Error::from_raw_os_error(-res);
                    return Err(DeviceError::io(DeviceOp::Write, offset, len, &e));
                }
                if res as usize != len {
                    return Err(DeviceError::media(
                        DeviceOp::Write,
                        offset,
                        len,
                        &format!("short write: {res} of {len} bytes"),
                    ));
                }
                counters.record_write(len, fua);
                Ok(())
            }
            Held::Flush => {
                if res < 0 {
                    let e = std::io::Error::from_raw_os_error(-res);
                    return Err(DeviceError::io(DeviceOp::Flush, 0, 0, &e));
                }
                counters.record_flush();
                Ok(())
            }
            Held::Stop => Ok(()),
        }
    }
}

impl Engine for UringEngine {
    fn dispatch(&self, tag: u64, command: Command) {
        if let Err(e) = self.shared.dispatch(tag, command) {
            self.shared.sink.complete(tag, Err(e));
        }
    }

    /// A small write the queue holds alone runs on the calling thread (as a flush does,
    /// module comment): its submitter waits for it next, and a completion through the
    /// ring would cost two thread wake-ups on every lone fsync's path. Larger writes still
    /// go through the ring, so a stream of them keeps the device busy while the caller
    /// plans the next.
    fn dispatch_alone(&self, tag: u64, command: Command) {
        match &command {
            Command::Write { data, .. }
                if data.len() <= ALONE_WRITE_MAX_BYTES && !self.shared.is_reaper() =>
            {
                self.shared
                    .sink
                    .complete(tag, run(self.shared.device.as_ref(), &command));
            }
            _ => self.dispatch(tag, command),
        }
    }

    fn keeps_dispatch_order(&self) -> bool {
        false
    }

    fn depth(&self) -> usize {
        self.depth
    }

    fn name(&self) -> &'static str {
        EngineKind::Uring.name()
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        self.shared.shutting_down.store(true, Ordering::Release);
        self.shared.held.lock().insert(SHUTDOWN_TAG, Held::Stop);
        let stop = opcode::Nop::new().build().user_data(SHUTDOWN_TAG);
        if self.shared.push(&stop).is_err() {
            // The reaper cannot be woken; leave it rather than free what the kernel uses.
            return;
        }
        if let Some(reaper) = self.reaper.take() {
            join_unless_current(reaper);
        }
    }
}
