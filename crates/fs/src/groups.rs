//! Group descriptors as the running file system reads and journals them.
//!
//! The primary descriptor table is the only copy jext changes (backups are written by
//! mkfs, as the kernel does); every change recomputes the descriptor's checksum.

use crate::error::{FsError, FsResult};
use crate::format::group_desc::GroupDesc;
use crate::state::FsInner;
use crate::tx::Tx;

/// The current descriptor of `group`.
pub(crate) fn read_desc(fs: &FsInner, group: u32) -> FsResult<GroupDesc> {
    if group >= fs.geo.group_count {
        return Err(FsError::Inconsistent(format!(
            "group {group} does not exist ({} groups)",
            fs.geo.group_count
        )));
    }
    let (block, offset) = fs.geo.desc_location(group);
    let size = fs.geo.desc_size as usize;
    let buf = fs.cache.get(block)?;
    let desc = buf.read(|b| GroupDesc::decode(&b[offset..offset + size], group, fs.group_csum))?;
    Ok(desc)
}

/// Journals a new descriptor for `group`.
pub(crate) fn write_desc(tx: &mut Tx, group: u32, desc: &GroupDesc) -> FsResult<()> {
    let (block, offset) = tx.fs.geo.desc_location(group);
    let size = tx.fs.geo.desc_size as usize;
    let csum = tx.fs.group_csum;
    tx.modify(block, |b| {
        desc.encode(&mut b[offset..offset + size], group, csum)
    })
}
