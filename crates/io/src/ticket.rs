//! Tickets: what a caller holds for a submitted batch, to wait for each of its three stages.
//!
//! A batch is *dispatched* when every write of it was handed to the device, *transferred*
//! when every write completed (the device has the bytes, perhaps only in its volatile
//! cache), *durable* when every write survives a power loss (it carried FUA, the device has
//! no volatile cache, or a flush dispatched after its transfer completed). Stages are
//! reached in that order; a failure anywhere fails every later stage with the same error.
//!
//! Promises: a ticket never reports a stage it has not reached, and never reports success
//! for a batch of which any write failed. Waiting for durability asks the IO layer for a
//! flush only when one is needed, and one flush serves every waiter that asked before it
//! was dispatched.

use crate::dispatch::Dispatcher;
use jext_device::DeviceError;
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;

/// The progress of one batch, shared between its ticket and the dispatcher.
pub(crate) struct TicketState {
    progress: Mutex<Progress>,
    /// Told when the whole batch reached a stage, never per write: every waiter waits for
    /// a whole stage, and a wakeup per write woke an fsync of an 80 KiB append twenty to
    /// forty times, each wakeup a context switch that waits for a CPU on a busy machine.
    changed: Condvar,
}

struct Progress {
    requests: usize,
    dispatched: usize,
    transferred: usize,
    error: Option<DeviceError>,
    /// The flush whose completion makes this batch durable (0: none needed).
    durable_after_flush: u64,
}

impl TicketState {
    pub(crate) fn new(requests: usize) -> Arc<TicketState> {
        Arc::new(TicketState {
            progress: Mutex::new(Progress {
                requests,
                dispatched: 0,
                transferred: 0,
                error: None,
                durable_after_flush: 0,
            }),
            changed: Condvar::new(),
        })
    }

    pub(crate) fn dispatched(&self) {
        let mut p = self.progress.lock();
        p.dispatched += 1;
        debug_assert!(p.dispatched <= p.requests);
        if p.dispatched == p.requests {
            self.changed.notify_all();
        }
    }

    /// One write completed; it is durable once flush `durable_after_flush` completes
    /// (0: it already is).
    pub(crate) fn transferred(&self, result: Result<(), DeviceError>, durable_after_flush: u64) {
        let mut p = self.progress.lock();
        p.transferred += 1;
        debug_assert!(p.transferred <= p.dispatched && p.dispatched <= p.requests);
        if let Err(e) = result {
            p.error.get_or_insert(e);
        }
        p.durable_after_flush = p.durable_after_flush.max(durable_after_flush);
        if p.transferred == p.requests {
            self.changed.notify_all();
        }
    }

    /// One write failed before it was dispatched (it is counted as dispatched and
    /// transferred, with the error).
    pub(crate) fn failed_undispatched(&self, error: DeviceError) {
        let mut p = self.progress.lock();
        p.dispatched += 1;
        p.transferred += 1;
        p.error.get_or_insert(error);
        if p.dispatched == p.requests || p.transferred == p.requests {
            self.changed.notify_all();
        }
    }

    /// Marks the batch failed even if its own writes succeed (an earlier ordered write
    /// failed, so its order cannot hold).
    pub(crate) fn poison(&self, error: DeviceError) {
        let mut p = self.progress.lock();
        p.error.get_or_insert(error);
        self.changed.notify_all();
    }

    fn wait_until(&self, reached: impl Fn(&Progress) -> bool) -> Result<u64, DeviceError> {
        let mut p = self.progress.lock();
        loop {
            if let Some(e) = &p.error {
                // A failure is final only once nothing of the batch is still in the device:
                // the caller may reuse its buffers after this returns.
                if p.transferred == p.requests {
                    return Err(e.clone());
                }
            } else if reached(&p) {
                return Ok(p.durable_after_flush);
            }
            self.changed.wait(&mut p);
        }
    }
}

/// The completion of a submitted batch; see the module documentation.
#[must_use = "a ticket must be waited on to learn whether the IO succeeded"]
pub struct IoTicket {
    state: Arc<TicketState>,
    dispatcher: Arc<Dispatcher>,
}

impl IoTicket {
    pub(crate) fn new(state: Arc<TicketState>, dispatcher: Arc<Dispatcher>) -> IoTicket {
        IoTicket { state, dispatcher }
    }

    /// Waits until every write of the batch was handed to the device.
    pub fn wait_dispatched(&self) -> Result<(), DeviceError> {
        self.state
            .wait_until(|p| p.dispatched == p.requests)
            .map(drop)
    }

    /// Waits until every write of the batch completed at the device.
    pub fn wait_transferred(&self) -> Result<(), DeviceError> {
        self.state
            .wait_until(|p| p.transferred == p.requests)
            .map(drop)
    }

    /// Waits until every write of the batch is durable, asking for a flush if one is
    /// needed and none that covers the batch was dispatched yet.
    pub fn wait_durable(&self) -> Result<(), DeviceError> {
        let flush = self.state.wait_until(|p| p.transferred == p.requests)?;
        if flush == 0 {
            return Ok(());
        }
        self.dispatcher.wait_for_flush(flush)
    }

    /// Whether every write of the batch was dispatched (or failed).
    pub fn is_dispatched(&self) -> bool {
        let p = self.state.progress.lock();
        p.dispatched == p.requests
    }

    /// Whether the batch has reached the transferred stage (successfully or not).
    pub fn is_transferred(&self) -> bool {
        let p = self.state.progress.lock();
        p.transferred == p.requests
    }

    /// Today's meaning of a ticket (the synchronous queue's): blocks until the batch was
    /// written, FUA writes durable, and reports the first failure if any.
    pub fn wait(self) -> Result<(), DeviceError> {
        self.wait_transferred()
    }
}
