//! Where a journal lives: an ordered list of runs of physical blocks.
//!
//! The classic JBD2 journal is the journal inode's blocks (usually one run). iJournaling's
//! per-core areas and a retained in-memory journal are further areas; recovery takes a list
//! of them so those can be added without changing its shape.

/// A run of `len` journal blocks starting at journal block `logical`, stored at file system
/// block `physical`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AreaRun {
    pub logical: u32,
    pub physical: u64,
    pub len: u32,
}

/// A journal's blocks on the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalArea {
    /// Bytes per block (the file system block size).
    pub block_size: u32,
    runs: Vec<AreaRun>,
    len_blocks: u32,
}

impl JournalArea {
    /// Builds an area from runs that must cover journal blocks `0..n` in order, without
    /// gaps or overlaps.
    pub fn new(block_size: u32, runs: Vec<AreaRun>) -> Result<JournalArea, String> {
        let mut next = 0u32;
        for run in &runs {
            if run.logical != next || run.len == 0 {
                return Err(format!(
                    "journal block map has a gap or overlap at journal block {next} (run {run:?})"
                ));
            }
            next = run
                .logical
                .checked_add(run.len)
                .ok_or_else(|| "journal block map overflows".to_string())?;
        }
        if next == 0 {
            return Err("journal block map is empty".to_string());
        }
        Ok(JournalArea {
            block_size,
            runs,
            len_blocks: next,
        })
    }

    /// An area that is one contiguous run.
    pub fn contiguous(block_size: u32, physical: u64, len: u32) -> JournalArea {
        JournalArea::new(
            block_size,
            vec![AreaRun {
                logical: 0,
                physical,
                len,
            }],
        )
        .expect("a single non-empty run is a valid area")
    }

    /// Number of journal blocks.
    pub fn len_blocks(&self) -> u32 {
        self.len_blocks
    }

    pub fn runs(&self) -> &[AreaRun] {
        &self.runs
    }

    /// The file system block holding journal block `logical`.
    pub fn physical(&self, logical: u32) -> u64 {
        assert!(
            logical < self.len_blocks,
            "journal block {logical} out of range"
        );
        let i = self.runs.partition_point(|r| r.logical + r.len <= logical);
        let run = &self.runs[i];
        run.physical + u64::from(logical - run.logical)
    }

    /// Byte offset on the device of journal block `logical`.
    pub fn byte_offset(&self, logical: u32) -> u64 {
        self.physical(logical) * u64::from(self.block_size)
    }

    /// How many journal blocks from `logical` on are physically contiguous (at least 1).
    pub fn contiguous_from(&self, logical: u32) -> u32 {
        let i = self.runs.partition_point(|r| r.logical + r.len <= logical);
        let run = &self.runs[i];
        run.logical + run.len - logical
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_logical_to_physical_across_runs() {
        let area = JournalArea::new(
            4096,
            vec![
                AreaRun {
                    logical: 0,
                    physical: 100,
                    len: 10,
                },
                AreaRun {
                    logical: 10,
                    physical: 500,
                    len: 5,
                },
            ],
        )
        .unwrap();
        assert_eq!(area.len_blocks(), 15);
        assert_eq!(area.physical(0), 100);
        assert_eq!(area.physical(9), 109);
        assert_eq!(area.physical(10), 500);
        assert_eq!(area.physical(14), 504);
        assert_eq!(area.contiguous_from(7), 3);
        assert_eq!(area.byte_offset(10), 500 * 4096);
    }

    #[test]
    fn rejects_gaps() {
        let runs = vec![
            AreaRun {
                logical: 0,
                physical: 1,
                len: 2,
            },
            AreaRun {
                logical: 3,
                physical: 9,
                len: 2,
            },
        ];
        assert!(JournalArea::new(1024, runs).is_err());
    }
}
