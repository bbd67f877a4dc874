//! What a device is told, and what it says it can do: the flags a write command carries,
//! the commands of an asynchronous queue, and a backend's capabilities.
//!
//! A write reaches a backend with [`WriteFlags`]: `FUA` (durable when it completes) and
//! `BARRIER` (a barrier write, BarrierFS §3.2: every write transferred before it persists
//! before any write transferred after it, and the device services it in dispatch order,
//! as a SCSI ordered-priority command). The IO layer's scheduling attributes (`ORDERED`,
//! `PREFLUSH`) never reach a device as flags: order within the host is the scheduler's job,
//! and a preflush becomes a [`Command::Flush`] dispatched before the write, as Linux's
//! flush machinery does for devices.
//!
//! Promises: a backend states its [`Capabilities`] truthfully (a device without a barrier
//! write says so, and refuses a `BARRIER` write rather than pretend to order it). Must
//! never be used to describe what the host does; only what the device does.

use crate::DeviceError;
use bitflags::bitflags;
use std::os::fd::RawFd;
use std::sync::Arc;

bitflags! {
    /// The flags of one write command as the device receives it.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct WriteFlags: u8 {
        /// Forced unit access: the bytes are durable when the write completes.
        const FUA = 1 << 0;
        /// A barrier write: it and everything transferred before it persist before
        /// anything transferred after it. Only for devices whose capabilities say so.
        const BARRIER = 1 << 1;
    }
}

/// What a backend can do, so the IO layer never assumes more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Completed writes may sit in a cache that a power loss empties: durability needs a
    /// flush or FUA. False means a write is durable when it completes.
    pub volatile_cache: bool,
    /// FUA is a property of the write command itself; false means the backend emulates it
    /// (a write and a flush of the file, say) at a flush's cost.
    pub native_fua: bool,
    /// The device takes barrier writes ([`WriteFlags::BARRIER`]) and services commands in
    /// the order they were dispatched across a barrier.
    pub barrier_write: bool,
    /// How many commands the device accepts at once (`None`: no limit of its own, as for
    /// an image file; the IO layer picks one).
    pub queue_depth: Option<usize>,
}

impl Capabilities {
    /// An image file: the host page cache is volatile, FUA is `O_DSYNC` (a write then a
    /// sync of the file), no barrier write.
    pub const IMAGE_FILE: Capabilities = Capabilities {
        volatile_cache: true,
        native_fua: false,
        barrier_write: false,
        queue_depth: None,
    };
}

/// One command of an asynchronous device queue.
#[derive(Clone, Debug)]
pub enum Command {
    Write {
        offset: u64,
        data: Arc<[u8]>,
        flags: WriteFlags,
    },
    /// Make every write that completed before this command was dispatched durable.
    Flush,
}

/// Called once when a command completes (its data transferred, or the flush done).
pub type CommandDone = Box<dyn FnOnce(Result<(), DeviceError>) + Send>;

/// A device's own asynchronous command queue (the simulator has one; real backends are
/// driven by the IO layer's io_uring or thread engines instead).
///
/// Promises: `dispatch` returns once the device has the command (it may complete it
/// before returning, and then calls `done` on the caller's thread); `done` is called
/// exactly once. A queue that says it keeps dispatch order services commands across a
/// barrier write in the order `dispatch` was called.
pub trait CommandQueue: Send + Sync {
    fn dispatch(&self, command: Command, done: CommandDone);
    /// Whether commands are serviced in dispatch order across barrier writes.
    fn keeps_dispatch_order(&self) -> bool;
}

/// A file descriptor the IO layer may hand to io_uring, with what its buffers need.
#[derive(Clone, Copy, Debug)]
pub struct RawTarget {
    pub fd: RawFd,
    /// Buffers, offsets and lengths must be aligned to this; more than 1 means the
    /// descriptor is `O_DIRECT` (writes go straight to the block layer).
    pub buffer_align: usize,
}
