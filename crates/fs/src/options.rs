//! Mount options, named and parsed as ext4 users know them (`data=ordered,commit=5`).
//!
//! Parsing refuses an unknown or malformed option with a message naming it; it never
//! ignores one, because a silently ignored `data=journal` is a durability bug.

use crate::error::{FsError, FsResult};
use jext_io::EngineKind;
use jext_journal::{CommitMode, RecordMode};
use std::fmt;
use std::ops::RangeInclusive;
use std::str::FromStr;

/// What the journal carries besides metadata (ext4 `data=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DataMode {
    /// New data blocks reach the disk before the commit that makes them reachable.
    #[default]
    Ordered,
    /// Data is written whenever; after a crash a file may show old data in new blocks.
    Writeback,
    /// Data goes through the journal like metadata.
    Journal,
}

impl FromStr for DataMode {
    type Err = FsError;
    fn from_str(s: &str) -> FsResult<DataMode> {
        match s {
            "ordered" => Ok(DataMode::Ordered),
            "writeback" => Ok(DataMode::Writeback),
            "journal" => Ok(DataMode::Journal),
            other => Err(FsError::Invalid(format!(
                "data={other}: expected data=ordered, data=writeback, data=journal or data=adaptive"
            ))),
        }
    }
}

impl fmt::Display for DataMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DataMode::Ordered => "ordered",
            DataMode::Writeback => "writeback",
            DataMode::Journal => "journal",
        })
    }
}

/// `data=adaptive`'s spelling (see [`MountOptions::adaptive_journal`]).
pub const ADAPTIVE: &str = "adaptive";

/// Where an fsync's i-transaction goes (`ijournal=`): iJournaling's file-level commits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IJournal {
    /// `ijournal=single`: ext4 fast commits in the journal's one fast-commit area, which
    /// Linux replays.
    #[default]
    Single,
    /// `ijournal=percore`: the paper's per-core areas — the fast-commit region split into
    /// up to 8 rings of jext-private i-transactions with sub-transaction ids, so that
    /// concurrent fsyncs share no lock or log head. Linux refuses the journal while the
    /// log is not empty (a private incompat bit).
    PerCore,
}

/// How an fsync of an ordered file makes small appends durable (`small_syncs=`,
/// `crate::sync_journaling`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SmallSyncs {
    /// `small_syncs=journal`: the appended data goes in the commit's one write, made
    /// durable by its one flush; the file journals its data until the checkpoint passed it.
    #[default]
    Journal,
    /// `small_syncs=in_place`: the data is written home and flushed, then a fast commit
    /// (or a full one) vouches for it, as ext4 does.
    InPlace,
}

impl SmallSyncs {
    pub fn name(self) -> &'static str {
        match self {
            SmallSyncs::Journal => "journal",
            SmallSyncs::InPlace => "in_place",
        }
    }
}

/// When a read moves a file's access time (the mount's `noatime`, `relatime`, `strictatime`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AtimeUpdates {
    /// `noatime`: never.
    Never,
    /// `relatime` (Linux's default): when the access time is not newer than the modify or
    /// change time, or is a day old.
    #[default]
    Relative,
    /// `strictatime`: at every read.
    Always,
}

/// What to do when the file system meets an error on disk (ext4 `errors=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ErrorBehavior {
    /// Stop writing: later changes fail with EROFS.
    #[default]
    RemountReadOnly,
    /// Report the error and go on.
    Continue,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountOptions {
    pub data_mode: DataMode,
    /// `data=adaptive`: ordered (`data_mode` says so), and each regular file whose
    /// behaviour is a rollback journal's gets the `j` flag (`crate::adaptive_journal`).
    /// Not a fourth [`DataMode`]: in every respect but that per-file choice it is ordered.
    pub adaptive_journal: bool,
    /// ext4 `commit=`: the running transaction commits once it is this old.
    pub commit_interval_ms: u64,
    pub read_only: bool,
    pub errors: ErrorBehavior,
    /// Memory for cached blocks and pages together; by default
    /// [`default_cache_size_bytes`].
    pub cache_size_bytes: usize,
    /// ext4 `barrier` / `nobarrier`.
    pub barrier: bool,
    /// ext4 `acl` (the default) / `noacl`: POSIX ACLs are kept, inherited and in step with
    /// the mode; with `noacl` their xattr names are refused (EOPNOTSUPP).
    pub acl: bool,
    /// `noatime` / `relatime` (default) / `strictatime`.
    pub atime: AtimeUpdates,
    /// `nodiratime`: reading a directory never moves its access time.
    pub no_dir_atime: bool,
    /// `journal_commit=single_io` (the default) or `classic`: a commit is one write and
    /// one flush, or the logged blocks, a flush and an FUA commit block (JBD2's way).
    pub journal_commit: CommitMode,
    /// `journal_records=bytes` (the default) or `blocks`: a logged block that changed in a
    /// few bytes goes to the log as those bytes (jext-private), or always whole.
    pub journal_records: RecordMode,
    /// `ijournal=single` (default) / `ijournal=percore`.
    pub ijournal: IJournal,
    /// `small_syncs=journal` (default) / `small_syncs=in_place`.
    pub small_syncs: SmallSyncs,
    /// `io_engine=auto` (default) / `inline` / `threads` / `io_uring`: how writes reach
    /// the device. `auto` takes the device's own queue (the simulator's), else io_uring
    /// on an `O_DIRECT` block device, else a thread pool, each 32 commands deep; `inline`
    /// writes on the calling thread, one at a time.
    pub io_engine: EngineKind,
    /// Whether a change after someone read an inode's times is stamped with the exact time
    /// (Linux's multigrain timestamps; `crate::inodes::stamp`). Not a `-o` option: the
    /// mount turns it off under FUSE's writeback cache, where the kernel stamps regular
    /// files' times itself from its coarse clock, and an exact stamp of jext's (a socket
    /// made a moment before a `link`) would then look later than the kernel's (the
    /// link's ctime): fstests generic/423.
    pub fine_timestamps: bool,
}

/// The default cache bound: an eighth of the memory jext may use (RAM, or a cgroup's
/// limit), at least 64 MiB and at most 32 GiB. The kernel lets dirty data reach 10% of RAM
/// before it writes any back; a fixed 256 MiB bound started at 19 MiB, so a busy writer's
/// data went out within seconds, under the fsyncs of every other file (`WritebackPolicy`
/// takes its thresholds from memory, capped by this bound).
pub fn default_cache_size_bytes() -> usize {
    const MIN_BYTES: u64 = 64 << 20;
    const MAX_BYTES: u64 = 32 << 30;
    let eighth = jext_cache::usable_memory_bytes() / 8;
    usize::try_from(eighth.clamp(MIN_BYTES, MAX_BYTES)).unwrap_or(MIN_BYTES as usize)
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            data_mode: DataMode::Ordered,
            adaptive_journal: false,
            commit_interval_ms: 5000,
            read_only: false,
            errors: ErrorBehavior::RemountReadOnly,
            cache_size_bytes: default_cache_size_bytes(),
            barrier: true,
            acl: true,
            atime: AtimeUpdates::Relative,
            no_dir_atime: false,
            journal_commit: CommitMode::default(),
            journal_records: RecordMode::default(),
            ijournal: IJournal::Single,
            small_syncs: SmallSyncs::Journal,
            io_engine: EngineKind::Auto,
            fine_timestamps: true,
        }
    }
}

impl MountOptions {
    /// Parses a comma-separated option string on top of the defaults.
    pub fn parse(options: &str) -> FsResult<MountOptions> {
        let mut parsed = MountOptions::default();
        for option in options.split(',').map(str::trim).filter(|o| !o.is_empty()) {
            parsed.apply(option)?;
        }
        Ok(parsed)
    }

    /// Applies one `name` or `name=value` option.
    pub fn apply(&mut self, option: &str) -> FsResult<()> {
        let (name, value) = match option.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (option, None),
        };
        let need_value = || {
            value.ok_or_else(|| {
                FsError::Invalid(format!("option {name} needs a value ({name}=...)"))
            })
        };
        let no_value = || match value {
            Some(v) => Err(FsError::Invalid(format!(
                "option {name} takes no value (got {name}={v})"
            ))),
            None => Ok(()),
        };
        match name {
            "data" => {
                let value = need_value()?;
                self.adaptive_journal = value == ADAPTIVE;
                self.data_mode = match self.adaptive_journal {
                    true => DataMode::Ordered,
                    false => value.parse()?,
                };
            }
            "commit" => {
                let secs: u64 = need_value()?.parse().map_err(|_| {
                    FsError::Invalid(format!(
                        "commit={}: expected whole seconds",
                        value.unwrap_or("")
                    ))
                })?;
                // ext4 treats commit=0 as the default.
                self.commit_interval_ms = if secs == 0 { 5000 } else { secs * 1000 };
            }
            "ro" => {
                no_value()?;
                self.read_only = true;
            }
            "rw" => {
                no_value()?;
                self.read_only = false;
            }
            "errors" => {
                self.errors = choice(
                    name,
                    need_value()?,
                    &[
                        ("remount-ro", ErrorBehavior::RemountReadOnly),
                        ("continue", ErrorBehavior::Continue),
                    ],
                )?
            }
            "barrier" => {
                self.barrier = match value {
                    None | Some("1") => true,
                    Some("0") => false,
                    Some(other) => {
                        return Err(FsError::Invalid(format!(
                            "barrier={other}: expected 0 or 1"
                        )))
                    }
                }
            }
            "nobarrier" => {
                no_value()?;
                self.barrier = false;
            }
            "acl" | "noacl" => {
                no_value()?;
                self.acl = name == "acl";
            }
            "noatime" => {
                no_value()?;
                self.atime = AtimeUpdates::Never;
            }
            "relatime" | "atime" | "norelatime" => {
                // Linux makes plain `atime` relative unless `strictatime` is given.
                no_value()?;
                self.atime = AtimeUpdates::Relative;
            }
            "strictatime" => {
                no_value()?;
                self.atime = AtimeUpdates::Always;
            }
            "nodiratime" | "diratime" => {
                no_value()?;
                self.no_dir_atime = name == "nodiratime";
            }
            "ijournal" => {
                self.ijournal = choice(
                    name,
                    need_value()?,
                    &[("single", IJournal::Single), ("percore", IJournal::PerCore)],
                )?
            }
            "cache_size" => self.cache_size_bytes = parse_size(name, need_value()?)?,
            "io_engine" => {
                let engines = [
                    EngineKind::Auto,
                    EngineKind::Inline,
                    EngineKind::Threads,
                    EngineKind::Uring,
                ]
                .map(|kind| (kind.name(), kind));
                self.io_engine = choice(name, need_value()?, &engines)?
            }
            "journal_commit" => {
                let modes = [CommitMode::SingleIo, CommitMode::Classic].map(|m| (m.name(), m));
                self.journal_commit = choice(name, need_value()?, &modes)?
            }
            "journal_records" => {
                let modes = [RecordMode::Bytes, RecordMode::Blocks].map(|m| (m.name(), m));
                self.journal_records = choice(name, need_value()?, &modes)?
            }
            "small_syncs" => {
                let modes = [SmallSyncs::Journal, SmallSyncs::InPlace].map(|m| (m.name(), m));
                self.small_syncs = choice(name, need_value()?, &modes)?
            }
            other => return Err(FsError::Invalid(format!("unknown mount option {other:?}"))),
        }
        Ok(())
    }
}

/// The choice `value` names among `choices` for option `name`; refused with every
/// choice spelled out ("ijournal=shared: expected ijournal=single or ijournal=percore").
fn choice<T: Copy>(name: &str, value: &str, choices: &[(&str, T)]) -> FsResult<T> {
    if let Some(&(_, chosen)) = choices.iter().find(|(text, _)| *text == value) {
        return Ok(chosen);
    }
    let spelled: Vec<String> = choices.iter().map(|(t, _)| format!("{name}={t}")).collect();
    let expected = match spelled.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    };
    Err(FsError::Invalid(format!(
        "{name}={value}: expected {expected}"
    )))
}

/// Parses a `cache_size=` style size (see [`parse_size_in`]) into bytes, from 1 byte up.
pub fn parse_size(name: &str, text: &str) -> FsResult<usize> {
    let max = u64::try_from(usize::MAX).unwrap_or(u64::MAX);
    let bytes = parse_size_in(name, text, 1..=max)?;
    usize::try_from(bytes).map_err(|_| out_of_range(name, text, &(1..=max)))
}

/// Parses a size: a whole number of bytes, optionally followed by one of the binary units
/// K, M, G, T, P (powers of 1024, any case), each also spelled KiB, MiB, GiB, TiB, PiB,
/// or a plain `B` for bytes: `65536`, `512K`, `256MiB`, `1T`, `4096B`. `GB` and the like
/// are refused rather than guessed at (decimal or binary?). A value outside `range` is
/// refused with a message giving the range.
pub fn parse_size_in(name: &str, text: &str, range: RangeInclusive<u64>) -> FsResult<u64> {
    let bad = || {
        FsError::Invalid(format!(
            "{name}={text}: expected a whole number of bytes with an optional unit K, M, G, T \
             or P (binary, also written KiB ... PiB), like 256M or 1TiB; valid: {}",
            describe_range(&range)
        ))
    };
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err(bad());
    }
    let shift = unit_shift(unit).ok_or_else(bad)?;
    let n: u64 = digits
        .parse()
        .map_err(|_| out_of_range(name, text, &range))?;
    let bytes = n
        .checked_shl(shift)
        .filter(|v| v >> shift == n)
        .ok_or_else(|| out_of_range(name, text, &range))?;
    if !range.contains(&bytes) {
        return Err(out_of_range(name, text, &range));
    }
    Ok(bytes)
}

/// The power of two a unit suffix stands for; `None` for anything that is not a unit.
fn unit_shift(unit: &str) -> Option<u32> {
    let lower = unit.to_ascii_lowercase();
    let (letter, rest) = match lower.as_bytes() {
        [] => return Some(0),
        [b'b'] => return Some(0),
        [letter, rest @ ..] => (*letter, rest),
    };
    if !matches!(rest, b"" | b"ib") {
        return None;
    }
    match letter {
        b'k' => Some(10),
        b'm' => Some(20),
        b'g' => Some(30),
        b't' => Some(40),
        b'p' => Some(50),
        _ => None,
    }
}

fn out_of_range(name: &str, text: &str, range: &RangeInclusive<u64>) -> FsError {
    FsError::Invalid(format!(
        "{name}={text}: out of range; valid: {}",
        describe_range(range)
    ))
}

fn describe_range(range: &RangeInclusive<u64>) -> String {
    format!(
        "{} to {}",
        human_bytes(*range.start()),
        human_bytes(*range.end())
    )
}

/// `2097152` as `2 MiB`; a size that is not a whole number of a unit keeps its bytes
/// beside the nearest unit (`1.5 KiB (1536 bytes)`), so a range is never misstated.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let step = (0..UNITS.len())
        .rev()
        .find(|&i| bytes >> (10 * i) > 0)
        .unwrap_or(0);
    if step == 0 {
        return format!("{bytes} bytes");
    }
    let whole = bytes >> (10 * step);
    if whole << (10 * step) == bytes {
        format!("{whole} {}", UNITS[step])
    } else {
        let approx = bytes as f64 / (1u64 << (10 * step)) as f64;
        format!("{approx:.2} {} ({bytes} bytes)", UNITS[step])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ext4_options() {
        let o = MountOptions::parse(
            "data=journal,commit=30,ro,errors=continue,nobarrier,cache_size=64M,ijournal=percore",
        )
        .unwrap();
        assert_eq!(o.ijournal, IJournal::PerCore);
        assert_eq!(MountOptions::default().ijournal, IJournal::Single);
        assert_eq!(o.data_mode, DataMode::Journal);
        assert_eq!(o.commit_interval_ms, 30_000);
        assert!(o.read_only && !o.barrier);
        assert_eq!(o.errors, ErrorBehavior::Continue);
        assert_eq!(o.cache_size_bytes, 64 << 20);
        assert_eq!(MountOptions::parse("").unwrap(), MountOptions::default());
        let adaptive = MountOptions::parse("data=adaptive").unwrap();
        assert!(adaptive.adaptive_journal && !o.adaptive_journal);
        assert_eq!(adaptive.data_mode, DataMode::Ordered);
        let last_wins = MountOptions::parse("data=adaptive,data=journal").unwrap();
        assert!(!last_wins.adaptive_journal);
        assert_eq!(last_wins.data_mode, DataMode::Journal);
        for mode in [CommitMode::Classic, CommitMode::SingleIo] {
            let text = format!("journal_commit={}", mode.name());
            assert_eq!(MountOptions::parse(&text).unwrap().journal_commit, mode);
        }
        for mode in [RecordMode::Bytes, RecordMode::Blocks] {
            let text = format!("journal_records={}", mode.name());
            assert_eq!(MountOptions::parse(&text).unwrap().journal_records, mode);
        }
        for mode in [SmallSyncs::Journal, SmallSyncs::InPlace] {
            let text = format!("small_syncs={}", mode.name());
            assert_eq!(MountOptions::parse(&text).unwrap().small_syncs, mode);
        }
        for kind in [EngineKind::Inline, EngineKind::Threads, EngineKind::Uring] {
            let text = format!("io_engine={}", kind.name());
            assert_eq!(MountOptions::parse(&text).unwrap().io_engine, kind);
        }
    }

    #[test]
    fn refuses_unknown_and_malformed_options_by_name() {
        for (text, needle) in [
            ("data=fast", "data=fast"),
            ("commit=soon", "commit=soon"),
            ("bogus", "\"bogus\""),
            ("ro=1", "ro takes no value"),
            ("data", "data needs a value"),
            ("cache_size=lots", "cache_size=lots"),
            ("journal_commit=fast", "journal_commit=fast"),
            ("journal_records=bits", "journal_records=bits"),
            ("ijournal=shared", "ijournal=shared"),
            ("io_engine=aio", "io_engine=aio"),
            ("small_syncs=never", "small_syncs=never"),
        ] {
            let err = MountOptions::parse(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn sizes_take_every_binary_unit_with_and_without_ib() {
        let all = 0..=u64::MAX;
        for (text, want) in [
            ("65536", 65_536u64),
            ("4096B", 4096),
            ("4096b", 4096),
            ("512K", 512 << 10),
            ("512k", 512 << 10),
            ("512KiB", 512 << 10),
            ("256M", 256 << 20),
            ("256MiB", 256 << 20),
            ("256mib", 256 << 20),
            ("1G", 1 << 30),
            ("1GiB", 1 << 30),
            ("1T", 1 << 40),
            ("1TiB", 1 << 40),
            ("3t", 3 << 40),
            ("1P", 1 << 50),
            ("2PiB", 2 << 50),
            ("0", 0),
        ] {
            assert_eq!(
                parse_size_in("--size", text, all.clone()).unwrap(),
                want,
                "{text}"
            );
        }
    }

    #[test]
    fn sizes_refuse_garbage_and_say_the_range() {
        let range = (2u64 << 20)..=(1u64 << 40);
        for text in [
            "", "G", "1X", "1GB", "1 G", "-1G", "1.5G", "1Gi", "1GiBs", "1iB", "0x10",
        ] {
            let err = parse_size_in("--size", text, range.clone())
                .unwrap_err()
                .to_string();
            assert!(err.contains(&format!("--size={text}")), "{text}: {err}");
            assert!(err.contains("2 MiB to 1 TiB"), "{text}: {err}");
        }
        for text in ["1M", "2T", "1P", "99999999999999999999", "20000000P"] {
            let err = parse_size_in("--size", text, range.clone())
                .unwrap_err()
                .to_string();
            assert!(err.contains("out of range"), "{text}: {err}");
            assert!(err.contains("2 MiB to 1 TiB"), "{text}: {err}");
        }
        assert_eq!(
            parse_size_in("--size", "2M", range.clone()).unwrap(),
            2 << 20
        );
        assert_eq!(parse_size_in("--size", "1T", range).unwrap(), 1 << 40);
    }

    #[test]
    fn human_bytes_never_misstates() {
        assert_eq!(human_bytes(0), "0 bytes");
        assert_eq!(human_bytes(1023), "1023 bytes");
        assert_eq!(human_bytes(2 << 20), "2 MiB");
        assert_eq!(human_bytes(1 << 50), "1 PiB");
        assert_eq!(human_bytes(1536), "1.50 KiB (1536 bytes)");
    }
}
