//! The crash-state model: what a disk with a volatile write cache may hold after a crash,
//! rebuilt from a capture of every request the stack issued.
//!
//! At a crash point (just after the first `upto` logged requests), the durable image is:
//! the capture's starting image; every write issued before the last completed flush; every
//! FUA write; and any [`Selection`] of the cached writes issued after that flush (the
//! *window*), applied in issue order so that a later write to the same sectors stays on
//! top. A selection may keep a write whole, drop it, or keep some of its 512-byte sectors
//! (a torn write). On a barrier-capable device the window is split into epochs by
//! [`LoggedOp::Barrier`]: a write of a later epoch is never durable unless every write of
//! the earlier epochs is.
//!
//! This module promises to build exactly those images and nothing else; it must never
//! drop a write that a flush or FUA made durable.

use crate::sim::{SimDevice, SparseImage};
use std::fmt;
use std::sync::Arc;

const SECTOR_BYTES: usize = 512;

/// One request as the device received it, in the order it completed.
#[derive(Clone, Debug)]
pub enum LoggedOp {
    Write {
        offset: u64,
        data: Arc<[u8]>,
        fua: bool,
    },
    Flush,
    /// An epoch boundary: writes before it persist before writes after it. Issued by a
    /// barrier-enabled IO stack; a plain stack never logs one.
    Barrier,
    /// A point the workload marked (a sync call returned, say).
    Mark(String),
}

/// A logged run of requests from a known starting image: enough to rebuild the durable
/// image at any crash point of the workload.
pub struct CrashCapture {
    size_bytes: u64,
    base: SparseImage,
    ops: Vec<LoggedOp>,
}

/// A cached (non-FUA) write after the last flush before a crash point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowWrite {
    /// Index into [`CrashCapture::ops`].
    pub op_index: usize,
    pub offset: u64,
    pub len_bytes: usize,
    /// How many barriers precede it within the window.
    pub epoch: u32,
}

impl WindowWrite {
    pub fn sectors(&self) -> usize {
        self.len_bytes / SECTOR_BYTES
    }
}

/// What of one window write reached the disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kept {
    Nothing,
    Whole,
    /// Only the sectors marked true (a torn write); one flag per 512-byte sector.
    Sectors(Vec<bool>),
}

/// What of each window write reached the disk, in window order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection(pub Vec<Kept>);

impl CrashCapture {
    pub(crate) fn new(size_bytes: u64, base: SparseImage, ops: Vec<LoggedOp>) -> CrashCapture {
        CrashCapture {
            size_bytes,
            base,
            ops,
        }
    }

    pub fn ops(&self) -> &[LoggedOp] {
        &self.ops
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Indices (into [`CrashCapture::ops`]) of every completed flush.
    pub fn flush_points(&self) -> Vec<usize> {
        self.ops
            .iter()
            .enumerate()
            .filter(|(_, op)| matches!(op, LoggedOp::Flush))
            .map(|(i, _)| i)
            .collect()
    }

    /// Where the window of a crash after ops `..upto` starts: just after the last flush.
    fn window_start(&self, upto: usize) -> usize {
        self.ops[..upto]
            .iter()
            .rposition(|op| matches!(op, LoggedOp::Flush))
            .map_or(0, |i| i + 1)
    }

    /// The cached writes a crash after ops `..upto` may keep or lose.
    pub fn window(&self, upto: usize) -> Vec<WindowWrite> {
        let start = self.window_start(upto);
        let mut epoch = 0;
        let mut window = Vec::new();
        for (i, op) in self.ops[start..upto].iter().enumerate() {
            match op {
                LoggedOp::Barrier => epoch += 1,
                LoggedOp::Write {
                    offset,
                    data,
                    fua: false,
                } => window.push(WindowWrite {
                    op_index: start + i,
                    offset: *offset,
                    len_bytes: data.len(),
                    epoch,
                }),
                _ => {}
            }
        }
        window
    }

    /// How many cached writes a crash after ops `..upto` may keep or lose.
    pub fn window_len(&self, upto: usize) -> usize {
        self.window(upto).len()
    }

    /// The device after a crash just after ops `..upto`, keeping the window writes for
    /// which `keep(position in window)` is true.
    pub fn crash_state(&self, upto: usize, keep: impl Fn(usize) -> bool) -> SimDevice {
        let window = self.window(upto);
        let selection = Selection(
            (0..window.len())
                .map(|i| if keep(i) { Kept::Whole } else { Kept::Nothing })
                .collect(),
        );
        self.cursor().state(upto, &selection)
    }

    /// A cursor that builds states for crash points visited in increasing order, keeping
    /// the durable prefix image between calls instead of replaying the capture each time.
    pub fn cursor(&self) -> DurableCursor<'_> {
        DurableCursor {
            capture: self,
            image: self.base.clone(),
            applied_upto: 0,
        }
    }
}

/// Builds crash states for increasing crash points from one capture.
pub struct DurableCursor<'a> {
    capture: &'a CrashCapture,
    /// The starting image plus every write before `applied_upto`.
    image: SparseImage,
    applied_upto: usize,
}

impl DurableCursor<'_> {
    /// The device after a crash just after ops `..upto` that kept `selection` of the
    /// window. Crash points must not go backwards between calls.
    pub fn state(&mut self, upto: usize, selection: &Selection) -> SimDevice {
        let capture = self.capture;
        let start = capture.window_start(upto);
        assert!(
            start >= self.applied_upto,
            "crash points must be visited in increasing order ({upto} after {})",
            self.applied_upto
        );
        for op in &capture.ops[self.applied_upto..start] {
            if let LoggedOp::Write { offset, data, .. } = op {
                self.image.write(*offset, data);
            }
        }
        self.applied_upto = start;
        let window = capture.window(upto);
        assert_eq!(
            selection.0.len(),
            window.len(),
            "a selection names every window write"
        );
        let mut image = self.image.clone();
        let mut next_window = 0;
        for op in &capture.ops[start..upto] {
            let LoggedOp::Write { offset, data, fua } = op else {
                continue;
            };
            if *fua {
                image.write(*offset, data);
                continue;
            }
            match &selection.0[next_window] {
                Kept::Nothing => {}
                Kept::Whole => image.write(*offset, data),
                Kept::Sectors(flags) => {
                    assert_eq!(flags.len(), data.len() / SECTOR_BYTES);
                    for (s, _) in flags.iter().enumerate().filter(|(_, k)| **k) {
                        let at = s * SECTOR_BYTES;
                        image.write(*offset + at as u64, &data[at..at + SECTOR_BYTES]);
                    }
                }
            }
            next_window += 1;
        }
        SimDevice::from_image(capture.size_bytes, image)
    }
}

impl Selection {
    /// Keeps whole the window writes whose bit is set in `mask` (write 0 is the low bit),
    /// nothing of the others: one of the `2^len` subsets an exhaustive search visits.
    pub fn from_mask(len: usize, mask: u64) -> Selection {
        assert!(len <= 64, "a mask names at most 64 writes");
        Selection(
            (0..len)
                .map(|i| {
                    if mask & (1 << i) != 0 {
                        Kept::Whole
                    } else {
                        Kept::Nothing
                    }
                })
                .collect(),
        )
    }

    /// Keeps nothing of a window of `len` writes.
    pub fn nothing(len: usize) -> Selection {
        Selection(vec![Kept::Nothing; len])
    }

    /// Whether a device that honours barriers could have persisted this: once a write of
    /// some epoch is not whole, no write of a later epoch has anything kept.
    pub fn respects_epochs(&self, window: &[WindowWrite]) -> bool {
        let first_incomplete = self
            .0
            .iter()
            .zip(window)
            .filter(|(k, _)| **k != Kept::Whole)
            .map(|(_, w)| w.epoch)
            .min();
        match first_incomplete {
            None => true,
            Some(epoch) => self
                .0
                .iter()
                .zip(window)
                .all(|(k, w)| w.epoch <= epoch || *k == Kept::Nothing),
        }
    }

    /// Parses the form [`Selection`]'s `Display` writes, for a window of `window` writes.
    pub fn parse(text: &str, window: &[WindowWrite]) -> Result<Selection, String> {
        let mut kept = vec![Kept::Nothing; window.len()];
        if text == "none" {
            return Ok(Selection(kept));
        }
        for item in text.split(',') {
            let (index, mask) = match item.split_once(':') {
                Some((i, m)) => (i, Some(m)),
                None => (item, None),
            };
            let index: usize = index
                .parse()
                .map_err(|_| format!("kept write {item:?} is not a window index"))?;
            let write = window.get(index).ok_or_else(|| {
                format!(
                    "kept write {index} is outside the window of {} writes",
                    window.len()
                )
            })?;
            kept[index] = match mask {
                None => Kept::Whole,
                Some(mask) => Kept::Sectors(parse_mask(mask, write.sectors())?),
            };
        }
        Ok(Selection(kept))
    }
}

/// "none", or the kept window writes by position: `3` whole, `5:0f` torn with the sectors
/// whose bits are set in the hex mask (sector 0 is the low bit of the first digit).
impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut items = Vec::new();
        for (i, k) in self.0.iter().enumerate() {
            match k {
                Kept::Nothing => {}
                Kept::Whole => items.push(i.to_string()),
                Kept::Sectors(flags) => items.push(format!("{i}:{}", format_mask(flags))),
            }
        }
        if items.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&items.join(","))
        }
    }
}

fn format_mask(flags: &[bool]) -> String {
    flags
        .chunks(4)
        .map(|nibble| {
            let v = nibble
                .iter()
                .enumerate()
                .fold(0u32, |acc, (b, set)| acc | (u32::from(*set) << b));
            char::from_digit(v, 16).expect("a nibble is one hex digit")
        })
        .collect()
}

fn parse_mask(mask: &str, sectors: usize) -> Result<Vec<bool>, String> {
    if mask.len() != sectors.div_ceil(4) {
        return Err(format!(
            "sector mask {mask:?} has {} digits, the write has {sectors} sectors",
            mask.len()
        ));
    }
    let mut flags = Vec::with_capacity(sectors);
    for c in mask.chars() {
        let v = c
            .to_digit(16)
            .ok_or_else(|| format!("sector mask {mask:?} is not hexadecimal"))?;
        flags.extend((0..4).map(|b| v & (1 << b) != 0));
    }
    flags.truncate(sectors);
    Ok(flags)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::tests::read;
    use crate::BlockDevice;

    fn write(offset: u64, byte: u8, len: usize) -> LoggedOp {
        LoggedOp::Write {
            offset,
            data: Arc::from(vec![byte; len]),
            fua: false,
        }
    }

    #[test]
    fn capture_rebuilds_each_crash_point() {
        let dev = SimDevice::new(1 << 20);
        dev.write_at(0, &[9u8; 512], false).unwrap();
        dev.start_capture();
        dev.write_at(512, &[1u8; 512], false).unwrap();
        dev.flush().unwrap();
        dev.mark("synced");
        dev.write_at(1024, &[2u8; 512], false).unwrap();
        dev.write_at(1536, &[3u8; 512], false).unwrap();
        let cap = dev.take_capture().unwrap();
        assert_eq!(cap.flush_points(), vec![1]);
        assert_eq!(cap.window_len(cap.ops().len()), 2);
        let before_flush = cap.crash_state(1, |_| false);
        assert_eq!((read(&before_flush, 0), read(&before_flush, 512)), (9, 0));
        let end = cap.crash_state(cap.ops().len(), |i| i == 1);
        assert_eq!(
            (read(&end, 512), read(&end, 1024), read(&end, 1536)),
            (1, 0, 3)
        );
    }

    #[test]
    fn a_torn_write_keeps_only_its_chosen_sectors() {
        let cap = CrashCapture::new(1 << 20, SparseImage::default(), vec![write(0, 7, 2048)]);
        let window = cap.window(1);
        let torn = Selection::parse("0:5", &window).unwrap();
        assert_eq!(torn.0[0], Kept::Sectors(vec![true, false, true, false]));
        assert_eq!(torn.to_string(), "0:5");
        let dev = cap.cursor().state(1, &torn);
        let got: Vec<u8> = (0..4).map(|s| read(&dev, s * 512)).collect();
        assert_eq!(got, vec![7, 0, 7, 0]);
    }

    #[test]
    fn later_epochs_never_persist_without_earlier_ones() {
        let ops = vec![write(0, 1, 512), LoggedOp::Barrier, write(512, 2, 512)];
        let cap = CrashCapture::new(1 << 20, SparseImage::default(), ops);
        let window = cap.window(3);
        assert_eq!((window[0].epoch, window[1].epoch), (0, 1));
        let all = |k: [Kept; 2]| Selection(k.to_vec());
        assert!(all([Kept::Whole, Kept::Nothing]).respects_epochs(&window));
        assert!(all([Kept::Whole, Kept::Whole]).respects_epochs(&window));
        assert!(!all([Kept::Nothing, Kept::Whole]).respects_epochs(&window));
        let torn_first = all([Kept::Sectors(vec![true]), Kept::Whole]);
        assert!(!torn_first.respects_epochs(&window));
    }

    #[test]
    fn the_cursor_matches_a_replay_from_the_start() {
        let ops = vec![
            write(0, 1, 512),
            LoggedOp::Flush,
            write(512, 2, 512),
            LoggedOp::Flush,
            write(0, 3, 512),
        ];
        let cap = CrashCapture::new(1 << 20, SparseImage::default(), ops);
        let mut cursor = cap.cursor();
        for upto in 0..=cap.ops().len() {
            let keep_all = Selection(vec![Kept::Whole; cap.window_len(upto)]);
            let incremental = cursor.state(upto, &keep_all);
            let fresh = cap.cursor().state(upto, &keep_all);
            assert_eq!(
                (read(&incremental, 0), read(&incremental, 512)),
                (read(&fresh, 0), read(&fresh, 512)),
                "crash point {upto}"
            );
        }
    }

    #[test]
    fn lying_devices_show_in_the_capture() {
        use crate::SimFault;
        let dev = SimDevice::new(1 << 20);
        dev.inject(SimFault::DropFlushes);
        dev.start_capture();
        dev.write_at(0, &[1u8; 512], false).unwrap();
        dev.flush().unwrap();
        let cap = dev.take_capture().unwrap();
        assert!(
            cap.flush_points().is_empty(),
            "a dropped flush is not logged"
        );

        let dev = SimDevice::new(1 << 20);
        dev.inject(SimFault::ReorderAcrossFlushes);
        dev.start_capture();
        dev.write_at(0, &[1u8; 512], false).unwrap();
        dev.write_at(512, &[2u8; 512], false).unwrap();
        dev.flush().unwrap();
        let cap = dev.take_capture().unwrap();
        assert_eq!(cap.flush_points(), vec![1]);
        assert_eq!(
            cap.window(3)[0].offset,
            512,
            "the last write moved past the flush"
        );
        assert_eq!(read(&dev.crash(), 512), 0, "and it is not durable");
    }

    #[test]
    fn malformed_selections_are_refused_by_name() {
        let cap = CrashCapture::new(1 << 20, SparseImage::default(), vec![write(0, 1, 1024)]);
        let window = cap.window(1);
        assert!(Selection::parse("3", &window)
            .unwrap_err()
            .contains("outside"));
        assert!(Selection::parse("0:zz", &window)
            .unwrap_err()
            .contains("digits"));
        assert!(Selection::parse("x", &window).is_err());
        assert_eq!(
            Selection::parse("none", &window).unwrap(),
            Selection::nothing(1)
        );
    }
}
