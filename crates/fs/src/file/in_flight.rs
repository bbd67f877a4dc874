//! Data writes in flight: what one writeback batch issued and has not yet seen complete.
//!
//! No journal handle is open while data transfers, and no transaction waits for data (as
//! ext4 with `dioread_nolock`): a batch allocates the blocks of its holes *unwritten* in a
//! short handle, issues its data writes with the inode released, and once they all
//! completed marks the blocks written (and grows the on-disk size) in a second short
//! handle. A commit or fast commit therefore carries either unwritten blocks, which read
//! as zeros, or written ones whose data already transferred (the commit's preflush makes
//! it durable). A neighbour's fsync never waits for this batch's data. The pages stay
//! pinned in the page cache meanwhile (a read that missed the cache would see the
//! device's older bytes).
//!
//! Promises: [`DataInFlight::wait`] returns only once every write completed; every page
//! comes back through [`DataInFlight::release`], dirty again when its write failed or
//! when the batch could not mark its block written. Must never be waited for with a
//! handle open, nor dropped unreleased (its pages would stay pinned).

use crate::error::{FsError, FsResult};
use crate::state::FsInner;
use jext_cache::PageWriteback;
use jext_io::{IoTicket, WriteRequest};

/// `count` pages from page `index` on, written to blocks from `phys` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    pub index: u64,
    pub phys: u64,
    pub count: u64,
}

/// See the module documentation.
#[derive(Default)]
#[must_use = "data in flight must be waited for and its pages released"]
pub(crate) struct DataInFlight {
    tickets: Vec<IoTicket>,
    pages: Vec<PageWriteback>,
    /// Runs written into unwritten blocks: marked written once the data transferred.
    pub to_mark_written: Vec<Run>,
}

impl DataInFlight {
    /// Adds `pages`, marked in flight in the page cache, whose writes go out with
    /// [`DataInFlight::issue`].
    pub fn add_pages(&mut self, pages: Vec<PageWriteback>) {
        self.pages.extend(pages);
    }

    /// Issues `requests`, the writes of the pages added.
    pub fn issue(&mut self, fs: &FsInner, requests: Vec<WriteRequest>) {
        self.tickets.push(fs.io.submit(requests));
    }

    pub fn pages(&self) -> &[PageWriteback] {
        &self.pages
    }

    /// Waits for every write; the first failure, if any.
    pub fn wait(&mut self) -> FsResult<()> {
        let mut failure = None;
        for ticket in self.tickets.drain(..) {
            if let Err(err) = ticket.wait() {
                failure.get_or_insert(err);
            }
        }
        match failure {
            None => Ok(()),
            Some(err) => Err(FsError::Device(err)),
        }
    }

    /// Unpins the pages, the ones `redirty` picks dirty again (their data is not where
    /// the block map says, or did not arrive).
    pub fn release(mut self, fs: &FsInner, redirty: impl Fn(&PageWriteback) -> bool) {
        assert!(
            self.tickets.is_empty(),
            "pages released before their writes ended"
        );
        let released = std::mem::take(&mut self.pages);
        let mut pages = fs.pages.lock();
        for page in &released {
            pages.end_writeback(page, redirty(page));
        }
    }
}

impl Drop for DataInFlight {
    fn drop(&mut self) {
        // `release` takes the pages; only an unwinding thread gets here with pages left
        // (they stay pinned: their writes' outcome is unknown).
        debug_assert!(
            self.pages.is_empty() || std::thread::panicking(),
            "data in flight dropped without releasing its pages"
        );
    }
}
