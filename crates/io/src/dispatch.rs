//! Order-preserving dispatch (BarrierFS §3.3): hands the scheduler's commands to the
//! engine in the order planned, without waiting for one command's transfer before the
//! next (Wait-on-Dispatch), up to the queue depth.
//!
//! There is no dispatcher thread. Whoever changes the queue (a submitter, a completion, a
//! waiter that needs a flush) *pumps*: plans under the lock, dispatches outside it. One
//! thread pumps at a time, so the engine sees commands in exactly the planned order; a
//! change made meanwhile is picked up when the pumping thread plans again.
//!
//! Promises: commands reach the engine in planning order; every completion reaches the
//! scheduler once; flush waiters are woken when a flush completes. Must never hold the
//! queue lock while calling the engine (an engine may complete a command inside
//! `dispatch`, on the calling thread).

use crate::engine::Engine;
use crate::epoch::{QueueStats, Scheduler};
use crate::ticket::{IoTicket, TicketState};
use crate::{Fence, FsyncClock, WriteRequest};
use jext_device::DeviceError;
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;

pub(crate) struct Dispatcher {
    /// When the last fsync started: the scheduler keeps background writes short after.
    pub(crate) fsyncs: Arc<FsyncClock>,
    core: Mutex<Core>,
    /// A command completed: flush waiters and drainers look again.
    changed: Condvar,
    engine: Box<dyn Engine>,
    depth: usize,
    barrier_mode: bool,
}

struct Core {
    scheduler: Scheduler,
    pumping: bool,
}

impl Dispatcher {
    pub(crate) fn new(
        engine: Box<dyn Engine>,
        depth: usize,
        barrier_mode: bool,
        volatile_cache: bool,
    ) -> Dispatcher {
        assert!(depth > 0, "a queue holds at least one command");
        let fsyncs = Arc::new(FsyncClock::default());
        Dispatcher {
            fsyncs: fsyncs.clone(),
            core: Mutex::new(Core {
                scheduler: Scheduler::new(barrier_mode, volatile_cache, fsyncs),
                pumping: false,
            }),
            changed: Condvar::new(),
            engine,
            depth,
            barrier_mode,
        }
    }

    pub(crate) fn engine_name(&self) -> &'static str {
        self.engine.name()
    }

    pub(crate) fn depth(&self) -> usize {
        self.depth
    }

    pub(crate) fn barrier_mode(&self) -> bool {
        self.barrier_mode
    }

    /// Takes a batch into the scheduler (each write with its own fence, or `fence` for
    /// all when given) and starts what may start.
    pub(crate) fn issue(
        self: &Arc<Self>,
        batch: Vec<WriteRequest>,
        fence: Option<Fence>,
    ) -> IoTicket {
        let ticket = TicketState::new(batch.len());
        {
            let mut core = self.core.lock();
            for req in batch {
                let fence = fence.unwrap_or(req.fence);
                core.scheduler
                    .issue(req.offset, req.data, req.flags, fence, ticket.clone());
            }
        }
        self.pump();
        IoTicket::new(ticket, self.clone())
    }

    /// Plans and dispatches until nothing more may go, unless another thread is at it.
    fn pump(&self) {
        loop {
            let (planned, alone) = {
                let mut core = self.core.lock();
                if core.pumping {
                    return;
                }
                let slots = self.depth.saturating_sub(core.scheduler.in_flight());
                let planned = core.scheduler.plan(slots);
                if planned.is_empty() {
                    return;
                }
                core.pumping = true;
                // One command, and nothing else pending or in flight: nothing could go
                // beside it, so the engine may run it on this thread.
                let alone = planned.len() == 1
                    && core.scheduler.in_flight() == 1
                    && core.scheduler.pending_is_empty();
                (planned, alone)
            };
            for (tag, command) in planned {
                if alone {
                    self.engine.dispatch_alone(tag, command);
                } else {
                    self.engine.dispatch(tag, command);
                }
            }
            self.core.lock().pumping = false;
        }
    }

    /// The engine's report that command `tag` completed.
    pub(crate) fn complete(&self, tag: u64, result: Result<(), DeviceError>) {
        let wake = {
            let mut core = self.core.lock();
            let was_flush = core.scheduler.complete(tag, result);
            // What the waiters here wait for (a flush's outcome, an idle queue) changes
            // only then; writes tell their own tickets' waiters.
            was_flush || core.scheduler.is_idle()
        };
        if wake {
            self.changed.notify_all();
        }
        self.pump();
    }

    /// Waits until flush `number` (or a later one) completed, dispatching one if needed.
    pub(crate) fn wait_for_flush(&self, number: u64) -> Result<(), DeviceError> {
        self.core.lock().scheduler.want_flush(number);
        self.pump();
        let mut core = self.core.lock();
        loop {
            if let Some(outcome) = core.scheduler.flush_outcome(number) {
                return outcome;
            }
            self.changed.wait(&mut core);
        }
    }

    /// The number of a flush that would cover every write completed so far.
    pub(crate) fn next_flush(&self) -> u64 {
        self.core.lock().scheduler.next_flush()
    }

    /// The flush that makes every write completed so far durable (0: none needed).
    pub(crate) fn covering_flush(&self) -> u64 {
        self.core.lock().scheduler.covering_flush()
    }

    /// Waits until nothing is pending or in flight.
    pub(crate) fn drain(&self) {
        self.pump();
        let mut core = self.core.lock();
        while !core.scheduler.is_idle() {
            self.changed.wait(&mut core);
        }
    }

    pub(crate) fn take_stats(&self) -> QueueStats {
        self.core.lock().scheduler.take_stats()
    }
}
