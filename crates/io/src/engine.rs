//! Engines: how commands reach a device. The dispatcher hands each command to an engine
//! and hears back through a [`Sink`] when it completed.
//!
//! - [`EngineKind::Inline`]: the calling thread runs the device's synchronous methods, one
//!   command at a time (queue depth 1). Today's behaviour, and the default of
//!   [`crate::IoQueue::new`]: no threads, so the thousands of queues a crash run opens cost
//!   nothing.
//! - [`EngineKind::Native`]: the device's own command queue (the simulator's).
//! - [`EngineKind::Uring`]: io_uring on the device's file descriptor (`crate::uring`).
//! - [`EngineKind::Threads`]: a pool of threads running the synchronous methods
//!   (`crate::threads`).
//!
//! What `Auto` picks, and why (measured with `jext bench io-order --repetitions 3`, 2 shared
//! cores, kernel 6.18, scratch on virtio ext4; medians of 3, IOPS of 4 KiB random writes,
//! QD 32; `bench/results/2026-11-23-io-order`):
//!
//! | backing | engine | P (orderless) | X (wait-on-transfer) | XnF (transfer+flush) |
//! |---|---|---:|---:|---:|
//! | image file | io_uring | 93,009 | 17,521 | 2,149 |
//! | image file | threads | 107,168 | 63,215 | 2,373 |
//! | loop, O_DIRECT | io_uring | 49,873 | 9,519 | 2,433 |
//! | loop, O_DIRECT | threads | 46,024 | 8,757 | 3,541 |
//!
//! On a buffered image file the kernel hands io_uring's writes to worker threads of its
//! own, one hop more than ours: threads win clearly (P +15%, X 3.6×). On an `O_DIRECT`
//! descriptor the ring's commands go straight to the block layer and io_uring is ahead by
//! 8–9% on P and X; flush-bound XnF swings either way between runs on this shared disk
//! (an earlier quick run had io_uring at 4,675 against 1,134). So `Auto` takes io_uring
//! only for direct descriptors; both engines stay selectable and tested. A device whose
//! writes go to memory (the overlay `jext fsck` and `jext debug` recover into) runs inline:
//! a pool of 32 threads per check made thread start-up and teardown most of the crash
//! explorer's time.
//!
//! Promises: an engine calls the sink exactly once per dispatched command, and says
//! truthfully whether the device services its commands in dispatch order (only then may
//! the IO layer rely on a barrier write). Must never complete a command it did not run.

use crate::threads::ThreadEngine;
use crate::uring::UringEngine;
use jext_device::{BlockDevice, Command, DeviceError};
use std::sync::{Arc, OnceLock, Weak};

/// Which engine a queue uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    /// The device's own queue if it has one, inline if its writes go to memory, else
    /// io_uring if the device gives an `O_DIRECT` descriptor and the kernel allows it, else
    /// threads (see the table above).
    Auto,
    Inline,
    Native,
    Uring,
    Threads,
}

impl EngineKind {
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Auto => "auto",
            EngineKind::Inline => "inline",
            EngineKind::Native => "native",
            EngineKind::Uring => "io_uring",
            EngineKind::Threads => "threads",
        }
    }
}

/// Runs commands on a device; see the module documentation.
pub(crate) trait Engine: Send + Sync {
    /// Hands `command` to the device; its completion goes to the sink under `tag`.
    fn dispatch(&self, tag: u64, command: Command);
    /// As [`Engine::dispatch`], for a command the queue holds alone (nothing else pending
    /// or in flight): an engine may then run it on the calling thread, whose submitter
    /// is about to wait for it anyway.
    fn dispatch_alone(&self, tag: u64, command: Command) {
        self.dispatch(tag, command);
    }
    /// Whether the device services commands in the order they were dispatched.
    fn keeps_dispatch_order(&self) -> bool;
    /// The most commands this engine can have in the device at once.
    fn depth(&self) -> usize;
    fn name(&self) -> &'static str;
}

/// Where an engine reports completions: the dispatcher, once it exists (an engine is
/// built before the dispatcher that owns it, and must not keep it alive).
#[derive(Clone, Default)]
pub(crate) struct Sink(Arc<OnceLock<Weak<crate::dispatch::Dispatcher>>>);

impl Sink {
    pub(crate) fn connect(&self, dispatcher: &Arc<crate::dispatch::Dispatcher>) {
        let _ = self.0.set(Arc::downgrade(dispatcher));
    }

    pub(crate) fn complete(&self, tag: u64, result: Result<(), DeviceError>) {
        // A completion after the queue is gone has nobody left to tell.
        if let Some(dispatcher) = self.0.get().and_then(Weak::upgrade) {
            dispatcher.complete(tag, result);
        }
    }
}

/// Builds the engine `kind` names for `device`, at most `depth` commands deep.
pub(crate) fn build(
    kind: EngineKind,
    device: &Arc<dyn BlockDevice>,
    depth: usize,
    sink: Sink,
) -> Result<Box<dyn Engine>, DeviceError> {
    match kind {
        EngineKind::Auto => {
            if device.command_queue().is_some() {
                return build(EngineKind::Native, device, depth, sink);
            }
            if device.writes_to_memory() {
                return build(EngineKind::Inline, device, depth, sink);
            }
            if device.raw_target().is_some_and(|t| t.buffer_align > 1) {
                if let Ok(engine) = UringEngine::start(device.clone(), depth, sink.clone()) {
                    return Ok(Box::new(engine));
                }
            }
            build(EngineKind::Threads, device, depth, sink)
        }
        EngineKind::Inline => Ok(Box::new(InlineEngine {
            device: device.clone(),
            sink,
        })),
        EngineKind::Native => {
            if device.command_queue().is_none() {
                return Err(unsupported(device, "has no command queue of its own"));
            }
            Ok(Box::new(NativeEngine {
                device: device.clone(),
                depth: device.capabilities().queue_depth.unwrap_or(depth),
                sink,
            }))
        }
        EngineKind::Uring => Ok(Box::new(UringEngine::start(device.clone(), depth, sink)?)),
        EngineKind::Threads => Ok(Box::new(ThreadEngine::start(device.clone(), depth, sink))),
    }
}

pub(crate) fn unsupported(device: &Arc<dyn BlockDevice>, why: &str) -> DeviceError {
    DeviceError::unsupported(
        jext_device::DeviceOp::Open,
        0,
        0,
        &format!("{} {why}", device.describe()),
    )
}

/// Waits for an engine thread to end, unless it is the calling thread: the last reference
/// to a queue may be dropped by a completion on an engine's own thread, which then ends by
/// itself once it returns.
pub(crate) fn join_unless_current(thread: std::thread::JoinHandle<()>) {
    if thread.thread().id() != std::thread::current().id() {
        let _ = thread.join();
    }
}

/// Runs a command on the device's synchronous methods.
pub(crate) fn run(device: &dyn BlockDevice, command: &Command) -> Result<(), DeviceError> {
    match command {
        Command::Write {
            offset,
            data,
            flags,
        } => device.write(*offset, data, *flags),
        Command::Flush => device.flush(),
    }
}

struct InlineEngine {
    device: Arc<dyn BlockDevice>,
    sink: Sink,
}

impl Engine for InlineEngine {
    fn dispatch(&self, tag: u64, command: Command) {
        self.sink.complete(tag, run(self.device.as_ref(), &command));
    }

    fn keeps_dispatch_order(&self) -> bool {
        true
    }

    fn depth(&self) -> usize {
        1
    }

    fn name(&self) -> &'static str {
        EngineKind::Inline.name()
    }
}

struct NativeEngine {
    device: Arc<dyn BlockDevice>,
    depth: usize,
    sink: Sink,
}

impl Engine for NativeEngine {
    fn dispatch(&self, tag: u64, command: Command) {
        let queue = self
            .device
            .command_queue()
            .expect("checked when the engine was built");
        let sink = self.sink.clone();
        queue.dispatch(command, Box::new(move |result| sink.complete(tag, result)));
    }

    fn keeps_dispatch_order(&self) -> bool {
        self.device
            .command_queue()
            .is_some_and(|q| q.keeps_dispatch_order())
    }

    fn depth(&self) -> usize {
        self.depth
    }

    fn name(&self) -> &'static str {
        EngineKind::Native.name()
    }
}
