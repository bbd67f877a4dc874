//! Data writes in flight: what writeback issued and has not yet seen complete, with the
//! journal handle that must stay open until it did.
//!
//! Writeback issues a file's data writes with the file's inode locked and, where the
//! caller can, waits for them after releasing it, so that other operations on the file
//! go on while its data transfers. The handle that maps newly allocated
//! blocks stays open until their data transferred: its transaction cannot commit (nor a
//! fast commit carry it) before the data reached the device, which is what data=ordered
//! promises. The pages stay pinned in the page cache meanwhile (a read that missed the
//! cache would see the device's older bytes).
//!
//! Promises: [`DataInFlight::finish`] waits for the writes, then stops the handle, and
//! only then unpins the pages; a failed write aborts the journal when
//! the handle changed metadata (the mapping of blocks whose data never arrived must not
//! commit) and leaves an overwritten page dirty otherwise. Must never be held by a thread
//! that starts another handle before finishing it: that start may wait for a commit that
//! waits for this handle.

use crate::error::{FsError, FsResult};
use crate::lock_order::held;
use crate::state::FsInner;
use jext_cache::PageWriteback;
use jext_device::DeviceError;
use jext_io::IoTicket;
use jext_journal::Handle;

/// See the module documentation.
#[derive(Default)]
#[must_use = "data in flight must be finished: its handle is still open"]
pub(crate) struct DataInFlight {
    tickets: Vec<IoTicket>,
    pages: Vec<PageWriteback>,
    /// The handle of the transaction that maps (or converts) the blocks written, if one.
    handle: Option<Handle>,
    /// The handle changed metadata: a failed write must keep its transaction from
    /// committing.
    handle_dirtied: bool,
}

impl DataInFlight {
    /// Adds the writes of `ticket`, issued for `pages` (already marked in flight in the
    /// page cache).
    pub fn add(&mut self, ticket: IoTicket, pages: Vec<PageWriteback>) {
        self.tickets.push(ticket);
        self.pages.extend(pages);
    }

    /// Keeps `handle` open until the writes completed.
    pub fn hold_handle(&mut self, handle: Handle, dirtied: bool) {
        assert!(
            self.handle.is_none(),
            "data in flight holds at most one handle"
        );
        self.handle = Some(handle);
        self.handle_dirtied = dirtied;
    }

    pub fn is_empty(&self) -> bool {
        self.tickets.is_empty() && self.handle.is_none()
    }

    /// Waits for the writes, stops the handle, then unpins the pages. The caller releases
    /// its inodes first where it can (fsync, writeback), so that other operations on them
    /// go on meanwhile; it must not lock an inode again before this returns.
    pub fn finish(mut self, fs: &FsInner) -> FsResult<()> {
        if self.is_empty() {
            return Ok(());
        }
        let failure = self.wait_and_stop(fs);
        self.unpin(fs, failure)
    }

    /// Waits for every write; on a failure under a handle that changed metadata, aborts
    /// the journal before the handle stops. Returns the first failure.
    fn wait_and_stop(&mut self, fs: &FsInner) -> Option<DeviceError> {
        let mut failure = None;
        for ticket in self.tickets.drain(..) {
            if let Err(err) = ticket.wait() {
                failure.get_or_insert(err);
            }
        }
        if let (Some(err), true) = (&failure, self.handle_dirtied) {
            fs.journal.abort(abort_reason(err));
        }
        if let Some(handle) = self.handle.take() {
            handle.stop();
            held::leave_handle();
        }
        failure
    }

    fn unpin(&mut self, fs: &FsInner, failure: Option<DeviceError>) -> FsResult<()> {
        let mut pages = fs.pages.lock();
        for page in &self.pages {
            pages.end_writeback(page, failure.is_some());
        }
        drop(pages);
        match failure {
            None => Ok(()),
            Some(err) => {
                if self.handle_dirtied {
                    fs.set_error(abort_reason(&err));
                }
                Err(FsError::Device(err))
            }
        }
    }
}

impl Drop for DataInFlight {
    fn drop(&mut self) {
        // Dropped unfinished (an error on the way): the handle stops as it drops.
        if self.handle.is_some() {
            held::leave_handle();
        }
    }
}

/// Why a failed data write stops the file system (the journal's abort and `FsState::error`).
fn abort_reason(err: &DeviceError) -> String {
    format!("a data write under a transaction failed: {err}")
}
