//! The systems a benchmark compares, each set up fresh on its own backing and torn down
//! after one run: the raw floor (an image file, or a loop device with O_DIRECT), jext
//! through the library in each data mode (also on the simulator's device presets) and
//! through its FUSE mount, Linux ext4 mounted on a loop device, and fuse2fs; and for the
//! block-level experiment, devices driven through jext's IO layer directly (simulated
//! presets, the image file, a loop device).
//!
//! Promises: every loop-backed system sits on the same kind of backing (a loop device with
//! direct I/O over a sparse image in the scratch directory), so ratios compare file systems,
//! not caches; a system on the simulator says so (`System::on_simulator`), and the report
//! never divides its figures by real storage's. A system reports the device requests it
//! caused: jext from its own counters, the kernel from the loop device's block
//! statistics. Must never run a system on a device it did not make itself.

use super::experiments::path_str;
use super::rig::{run, BlockStats, LoopDevice, Mount, Scratch};
use jext::{
    mkfs, CommitMode, DataMode, FileJournalMode, Fs, IJournal, MkfsOptions, MountOptions,
    SmallSyncs,
};
use jext_device::{LatencyModel, Preset, SimDevice};
use jext_fuse::requests::DaemonStats;
use jext_io::EngineKind;
use jext_journal::RecordMode;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a system's bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// An image file on the host file system, written through the host page cache.
    File,
    /// A loop device with direct I/O over an image file.
    Loop,
    /// The simulator with barrier writes, timed by a preset slowed by [`SIM_SLOWDOWN`]:
    /// BarrierFS's device classes under the whole file system (Table 1, Fig. 9 as ratios
    /// between one system's own syncs and barriers, since no kernel file system runs there).
    Sim(Preset),
}

/// One configuration under test.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum System {
    /// pwrite to the image file itself, fdatasync to make it durable.
    RawFile,
    /// O_DIRECT pwrite to the loop device, fdatasync to make it durable.
    RawLoop,
    /// jext through the library, in-process, on an image made with or without a
    /// fast-commit area (without one, every fsync commits the running transaction), with
    /// this journal commit mode and this kind of journal record.
    Jext {
        mode: DataMode,
        backing: Backing,
        fast_commit: bool,
        commit: CommitMode,
        records: RecordMode,
        /// How an ordered file's small synced appends go (`small_syncs=`).
        small_syncs: SmallSyncs,
    },
    /// jext through the library in data=ordered with `ijournal=percore`: fsyncs write
    /// i-transactions to per-core rings (iJournaling's per-core areas, Fig. 9).
    JextPercore { backing: Backing },
    /// Linux ext4 with these mount options, made by mkfs.ext4 with these extra features.
    Ext4 {
        options: &'static str,
        features: &'static str,
    },
    /// jext through its FUSE mount on a loop device, used through ordinary file calls.
    /// With `writeback_cache`, mounted with `-o writeback_cache`; with `uring`, with
    /// `-o fuse_uring` (requests through FUSE over io_uring instead of `/dev/fuse`).
    JextFuse {
        mode: DataMode,
        writeback_cache: bool,
        uring: bool,
    },
    /// jext through its FUSE mount on a loop device, as the SQLite matrix of issue 14
    /// needs it: mount `options` given as text, so that an option this build does not know
    /// (`data=adaptive` before it exists) fails the set-up with the mount's own words
    /// rather than the build; on an image jext's mkfs made with or without a journal; with
    /// `per_file`, a `+j` directory holds the database and its rollback journal, the
    /// database itself `-j` (see [`Running::sqlite_dir`]); with `barrier_syncs`, the
    /// programs run on it have every fsync an fbarrier and every fdatasync an fdatabarrier
    /// (`syncs_as_barriers.c`, BarrierFS Fig. 15's ordering runs).
    JextMount {
        name: &'static str,
        options: &'static str,
        journal: bool,
        per_file: bool,
        barrier_syncs: bool,
    },
    /// fuse2fs (e2fsprogs' user-space ext4) on a loop device made by mkfs.ext4.
    Fuse2fs,
    /// A device driven through jext's IO layer with no file system (`io-order`).
    Block(BlockTarget),
}

/// A device of the block-level experiment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockTarget {
    /// The simulator with barrier writes, timed by a preset slowed by [`SIM_SLOWDOWN`].
    Sim(Preset),
    /// The image file, through this engine.
    File(EngineKind),
    /// A loop device with direct I/O over the image file, through this engine.
    Loop(EngineKind),
}

/// How much slower than the device class the simulator runs: its commands then take
/// hundreds of µs, so this machine's own thread wake-ups (tens of µs) stay small beside
/// them. Ratios between ordering modes do not depend on it.
pub const SIM_SLOWDOWN: u64 = 20;

impl BlockTarget {
    /// The simulated device of a preset, as the experiment runs it.
    pub fn sim_model(preset: Preset) -> LatencyModel {
        preset.model().slowed(SIM_SLOWDOWN)
    }
}

/// A zeroed simulated device of `bytes` with barrier writes, timed by `preset`.
fn sim_device(preset: Preset, bytes: u64) -> Arc<dyn jext::BlockDevice> {
    Arc::new(
        SimDevice::new(bytes)
            .with_barrier_write()
            .with_latency(BlockTarget::sim_model(preset)),
    )
}

impl System {
    pub fn name(&self) -> String {
        match self {
            System::RawFile => "raw file (pwrite)".into(),
            System::RawLoop => "raw loop (O_DIRECT)".into(),
            System::Jext {
                mode,
                backing,
                fast_commit,
                commit,
                records,
                small_syncs,
            } => {
                let on = backing_name(*backing);
                let classic = if *fast_commit { "" } else { " -O ^fast_commit" };
                let commit = match commit {
                    CommitMode::SingleIo => String::new(),
                    other => format!(",journal_commit={}", other.name()),
                };
                // After the backing, so that a pattern naming the default system
                // ("jext data=journal (loop)") picks this one beside it.
                let records = match records {
                    RecordMode::Bytes => String::new(),
                    other => format!(" journal_records={}", other.name()),
                };
                let small_syncs = match small_syncs {
                    SmallSyncs::Journal => String::new(),
                    other => format!(" small_syncs={}", other.name()),
                };
                format!(
                    "jext {}{commit}{classic} ({on}){records}{small_syncs}",
                    mode_name(*mode)
                )
            }
            System::JextPercore { backing } => format!(
                "jext data=ordered ijournal=percore ({})",
                backing_name(*backing)
            ),
            System::Ext4 {
                options,
                features: "",
            } => format!("ext4 {options}"),
            System::Ext4 { options, features } => format!("ext4 {options} -O {features}"),
            System::JextFuse {
                mode,
                writeback_cache,
                uring,
            } => {
                let cache = if *writeback_cache {
                    ",writeback_cache"
                } else {
                    ""
                };
                let transport = if *uring { " io_uring" } else { "" };
                format!("jext {}{cache} (FUSE{transport})", mode_name(*mode))
            }
            System::JextMount { name, .. } => (*name).into(),
            System::Fuse2fs => "fuse2fs".into(),
            System::Block(BlockTarget::Sim(preset)) => format!("sim {} (barrier)", preset.name()),
            System::Block(BlockTarget::File(engine)) => format!("image file ({})", engine.name()),
            System::Block(BlockTarget::Loop(engine)) => {
                format!("loop O_DIRECT ({})", engine.name())
            }
        }
    }

    /// jext through the library in `mode` on `backing`, with the default mkfs and mount
    /// options otherwise.
    pub fn jext(mode: DataMode, backing: Backing) -> System {
        System::Jext {
            mode,
            backing,
            fast_commit: true,
            commit: CommitMode::SingleIo,
            records: RecordMode::Bytes,
            small_syncs: SmallSyncs::Journal,
        }
    }

    /// Whether the system runs on a simulated device: its figures compare with the same
    /// system's other variants, never with a system on real storage.
    pub fn on_simulator(&self) -> bool {
        matches!(
            self,
            System::Jext {
                backing: Backing::Sim(_),
                ..
            } | System::JextPercore {
                backing: Backing::Sim(_)
            } | System::Block(BlockTarget::Sim(_))
        )
    }

    pub fn needs_root(&self) -> bool {
        !matches!(
            self,
            System::RawFile
                | System::Jext {
                    backing: Backing::File | Backing::Sim(_),
                    ..
                }
                | System::JextPercore {
                    backing: Backing::File | Backing::Sim(_)
                }
                | System::Block(BlockTarget::Sim(_) | BlockTarget::File(_))
        )
    }

    /// The mount options of a system jext runs through the library.
    fn jext_options(&self) -> MountOptions {
        match self {
            System::Jext {
                mode,
                commit,
                records,
                small_syncs,
                ..
            } => MountOptions {
                data_mode: *mode,
                journal_commit: *commit,
                journal_records: *records,
                small_syncs: *small_syncs,
                ..MountOptions::default()
            },
            // Small synced appends journal their data, which their i-transactions carry.
            System::JextPercore { .. } => MountOptions {
                ijournal: IJournal::PerCore,
                ..MountOptions::default()
            },
            other => unreachable!("{} is not jext through the library", other.name()),
        }
    }

    /// Makes the system ready on a fresh image of `image_bytes` in `scratch`.
    pub fn set_up(&self, scratch: &Scratch, image_bytes: u64) -> io::Result<Running> {
        let simulated = match self {
            System::Block(BlockTarget::Sim(preset)) => Some(Target::Block(
                sim_device(*preset, image_bytes),
                EngineKind::Native,
            )),
            System::Jext {
                backing: Backing::Sim(preset),
                fast_commit,
                ..
            } => {
                let device = sim_device(*preset, image_bytes);
                // The simulator starts zeroed: mkfs need not write its journal out.
                Some(Target::Jext(open_jext(
                    device,
                    *fast_commit,
                    true,
                    self.jext_options(),
                )?))
            }
            System::JextPercore {
                backing: Backing::Sim(preset),
            } => {
                let device = sim_device(*preset, image_bytes);
                Some(Target::Jext(open_jext(
                    device,
                    true,
                    true,
                    self.jext_options(),
                )?))
            }
            _ => None,
        };
        if let Some(target) = simulated {
            return Ok(Running {
                target,
                device: None,
                journaled_dir: None,
                sync_shim: None,
            });
        }
        if let System::JextMount { options, .. } = self {
            // Before any image or loop device: a mount option this build does not know
            // is refused here, in the parser's words.
            MountOptions::parse(options).map_err(|e| {
                io::Error::other(format!("this jext cannot mount with {options}: {e}"))
            })?;
        }
        let image = scratch.image("bench.img", image_bytes)?;
        let device = if self.needs_root() {
            Some(LoopDevice::attach(&image)?)
        } else {
            None
        };
        let point = scratch.dir.join("mnt");
        let mut journaled_dir = None;
        let target = match (self, &device) {
            (System::RawFile, _) => {
                Target::Raw(std::fs::OpenOptions::new().write(true).open(&image)?)
            }
            (System::RawLoop, Some(dev)) => Target::Raw(
                std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(&dev.path)?,
            ),
            (System::Jext { fast_commit, .. }, dev) => {
                let path = dev.as_ref().map_or(image.clone(), |d| d.path.clone());
                let device = jext::open_device(&path, false).map_err(io::Error::other)?;
                Target::Jext(open_jext(device, *fast_commit, false, self.jext_options())?)
            }
            (System::JextPercore { .. }, dev) => {
                let path = dev.as_ref().map_or(image.clone(), |d| d.path.clone());
                let device = jext::open_device(&path, false).map_err(io::Error::other)?;
                Target::Jext(open_jext(device, true, false, self.jext_options())?)
            }
            (System::Ext4 { options, features }, Some(dev)) => {
                mkfs_ext4(dev, features)?;
                // The lazy inode-table initialiser would write in the background.
                let options = format!("{options},noinit_itable");
                Target::Mounted(Mount::kernel("ext4", dev.path_str(), &point, &options)?)
            }
            (
                System::JextFuse {
                    mode,
                    writeback_cache,
                    uring,
                },
                Some(dev),
            ) => {
                mkfs_jext(
                    jext::open_device(&dev.path, false).map_err(io::Error::other)?,
                    true,
                )?;
                let cache = if *writeback_cache {
                    ",writeback_cache"
                } else {
                    ""
                };
                let transport = if *uring { ",fuse_uring" } else { "" };
                let options = format!("{}{cache}{transport}", mode_name(*mode));
                Target::Mounted(Mount::jext(dev.path_str(), &point, &options)?)
            }
            (
                System::JextMount {
                    options,
                    journal,
                    per_file,
                    ..
                },
                Some(dev),
            ) => {
                let device = jext::open_device(&dev.path, false).map_err(io::Error::other)?;
                let opts = MkfsOptions {
                    journal: *journal,
                    ..jext_mkfs_options(true)
                };
                mkfs(device.clone(), &opts).map_err(io::Error::other)?;
                if *per_file {
                    journaled_dir = Some(prepare_per_file(device)?);
                } else {
                    drop(device);
                }
                Target::Mounted(Mount::jext(dev.path_str(), &point, options)?)
            }
            (System::Fuse2fs, Some(dev)) => {
                mkfs_ext4(dev, "")?;
                Target::Mounted(Mount::fuse2fs(dev.path_str(), &point)?)
            }
            (System::Block(BlockTarget::Sim(_)), _) => {
                unreachable!("the simulator was set up above")
            }
            (System::Block(BlockTarget::File(engine)), _) => Target::Block(
                jext::open_device(&image, false).map_err(io::Error::other)?,
                *engine,
            ),
            (System::Block(BlockTarget::Loop(engine)), Some(dev)) => Target::Block(
                jext::open_device(&dev.path, false).map_err(io::Error::other)?,
                *engine,
            ),
            (_, None) => {
                return Err(io::Error::other(format!(
                    "{} needs a loop device",
                    self.name()
                )))
            }
        };
        let sync_shim = match self {
            System::JextMount {
                barrier_syncs: true,
                ..
            } => Some(build_sync_shim(scratch)?),
            _ => None,
        };
        Ok(Running {
            target,
            device,
            journaled_dir,
            sync_shim,
        })
    }
}

/// Builds `syncs_as_barriers.c` into a shared library in `scratch`.
fn build_sync_shim(scratch: &Scratch) -> io::Result<PathBuf> {
    let dir = scratch.dir.join("sync-shim");
    std::fs::create_dir_all(&dir)?;
    let source = dir.join("syncs_as_barriers.c");
    std::fs::write(&source, include_str!("syncs_as_barriers.c"))?;
    std::fs::write(
        dir.join("jext.h"),
        include_str!("../../../../include/jext.h"),
    )?;
    let library = dir.join("syncs_as_barriers.so");
    let (source, output, include) = (path_str(&source)?, path_str(&library)?, path_str(&dir)?);
    let args = [
        "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-I", include, "-o", output, source, "-ldl",
    ];
    run("gcc", &args)?;
    Ok(library)
}

/// The directory of the per-file system's rollback journals, from the mount's root.
const JOURNALED_DIR: &str = "journaled";

/// Makes the per-file layout through the library (a mount cannot: `chattr +j` needs
/// CAP_SYS_RESOURCE, which some sandboxes drop): a `+j` directory, so that every file
/// created in it is data-journaled as ext4 inherits the flag, holding an empty database
/// file that is not (SQLite opens an empty file as a new database). A rollback journal
/// SQLite creates beside it is then journaled, and the database ordered.
fn prepare_per_file(device: Arc<dyn jext::BlockDevice>) -> io::Result<PathBuf> {
    let fs = Fs::open(device, MountOptions::default()).map_err(io::Error::other)?;
    let made = (|| {
        let dir = fs.mkdir_path(&format!("/{JOURNALED_DIR}"), 0o755)?;
        fs.set_journal_mode(dir.ino, FileJournalMode::Data)?;
        let db = fs.create_file(&format!("/{JOURNALED_DIR}/bench.db"), 0o644)?;
        db.set_journal_mode(FileJournalMode::Mount)
    })();
    let unmounted = fs.unmount();
    made.and(unmounted).map_err(io::Error::other)?;
    Ok(PathBuf::from(JOURNALED_DIR))
}

pub fn mode_name(mode: DataMode) -> &'static str {
    match mode {
        DataMode::Ordered => "data=ordered",
        DataMode::Journal => "data=journal",
        DataMode::Writeback => "data=writeback",
    }
}

fn backing_name(backing: Backing) -> String {
    match backing {
        Backing::File => "file".into(),
        Backing::Loop => "loop".into(),
        Backing::Sim(preset) => format!("sim {}", preset.name()),
    }
}

/// Makes jext on `device` (`zeroed`: the device reads as zeros already) and mounts it.
fn open_jext(
    device: Arc<dyn jext::BlockDevice>,
    fast_commit: bool,
    zeroed: bool,
    options: MountOptions,
) -> io::Result<Fs> {
    let mkfs_options = MkfsOptions {
        assume_zeroed: zeroed,
        ..jext_mkfs_options(fast_commit)
    };
    mkfs(Arc::clone(&device), &mkfs_options).map_err(io::Error::other)?;
    Fs::open(device, options).map_err(io::Error::other)
}

fn mkfs_jext(device: Arc<dyn jext::BlockDevice>, fast_commit: bool) -> io::Result<()> {
    mkfs(device, &jext_mkfs_options(fast_commit))
        .map(drop)
        .map_err(io::Error::other)
}

/// Zeroes the journal at mkfs, as `mkfs.ext4` does on these devices: a log never written
/// sits in unallocated parts of the image file, and each of jext's first commits then paid
/// the host file system's allocation on its flush (80 KiB append + fsync alone, p50 1.96 ms
/// against 1.33 ms with the journal written; ext4 ordered 1.03-1.28 ms).
fn jext_mkfs_options(fast_commit: bool) -> MkfsOptions {
    MkfsOptions {
        assume_zeroed: false,
        fast_commit,
        label: "jext-bench".into(),
        ..MkfsOptions::default()
    }
}

fn mkfs_ext4(dev: &LoopDevice, features: &str) -> io::Result<()> {
    let mut args = vec!["-F", "-q"];
    if !features.is_empty() {
        args.extend(["-O", features]);
    }
    args.push(dev.path_str());
    run("mkfs.ext4", &args).map(drop)
}

/// A system that is set up: where files live, and the device under it. Fields drop in
/// order: the file system first, then the mount, then the loop device.
pub struct Running {
    target: Target,
    device: Option<LoopDevice>,
    /// The per-file system's `+j` directory, from the mount's root.
    journaled_dir: Option<PathBuf>,
    /// The library programs run on the mount preload, turning their syncs into barriers.
    sync_shim: Option<PathBuf>,
}

enum Target {
    Raw(std::fs::File),
    Jext(Fs),
    Mounted(Mount),
    /// A device for the IO layer, and the engine to drive it with.
    Block(Arc<dyn jext::BlockDevice>, EngineKind),
}

/// Device requests a system caused.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IoCounts {
    pub writes: u64,
    pub write_bytes: u64,
    pub flushes: u64,
    /// FUA writes, where the system can tell (jext); the kernel's loop statistics cannot.
    pub fua_writes: Option<u64>,
}

impl IoCounts {
    pub fn since(&self, earlier: &IoCounts) -> IoCounts {
        IoCounts {
            writes: self.writes - earlier.writes,
            write_bytes: self.write_bytes - earlier.write_bytes,
            flushes: self.flushes - earlier.flushes,
            fua_writes: self.fua_writes.zip(earlier.fua_writes).map(|(a, b)| a - b),
        }
    }
}

impl From<BlockStats> for IoCounts {
    fn from(s: BlockStats) -> IoCounts {
        IoCounts {
            writes: s.writes,
            write_bytes: s.write_bytes,
            flushes: s.flushes,
            fua_writes: None,
        }
    }
}

impl Running {
    /// A new file; raw systems give each name its own region of the device.
    pub fn create(&self, name: &str, region: u64) -> io::Result<BenchFile> {
        match &self.target {
            Target::Block(..) => Err(io::Error::other("a block-level system has no files")),
            Target::Raw(file) => Ok(BenchFile::Raw {
                file: file.try_clone()?,
                base: region,
                bounce: AlignedBuffer::default(),
            }),
            Target::Jext(fs) => Ok(BenchFile::Jext(
                fs.create_file(&format!("/{name}"), 0o644)
                    .map_err(io::Error::other)?,
            )),
            Target::Mounted(mount) => {
                let path: PathBuf = mount.point.join(name);
                Ok(BenchFile::Vfs(std::fs::File::create(path)?))
            }
        }
    }

    /// The device and engine of a block-level system.
    pub fn block_device(&self) -> io::Result<(Arc<dyn jext::BlockDevice>, EngineKind)> {
        match &self.target {
            Target::Block(device, engine) => Ok((device.clone(), *engine)),
            _ => Err(io::Error::other("not a block-level system")),
        }
    }

    /// Where the file system is mounted, for systems programs can use.
    pub fn mount_point(&self) -> Option<&std::path::Path> {
        match &self.target {
            Target::Mounted(mount) => Some(&mount.point),
            _ => None,
        }
    }

    /// Where the `sqlite` experiment keeps its database: the mount's root, or on the
    /// per-file system with a rollback journal, the `+j` directory, so that the journal
    /// is data-journaled and the database (and a write-ahead log) ordered.
    pub fn sqlite_dir(&self, rollback_journal: bool) -> io::Result<PathBuf> {
        let root = self
            .mount_point()
            .ok_or_else(|| io::Error::other("this experiment needs a mounted file system"))?;
        Ok(match (&self.journaled_dir, rollback_journal) {
            (Some(dir), true) => root.join(dir),
            _ => root.to_path_buf(),
        })
    }

    /// The library a program run on the mount preloads (`LD_PRELOAD`), if any.
    pub fn sync_shim(&self) -> Option<&Path> {
        self.sync_shim.as_deref()
    }

    /// Makes everything written to a mounted system durable: `sync -f` for the kernel's
    /// mounts (and fuse2fs, where it ends in the kernel), `jext sync` for jext's mount.
    pub fn sync_mount(&self) -> io::Result<()> {
        match &self.target {
            Target::Mounted(mount) => mount.sync(),
            _ => Err(io::Error::other("only a mounted file system can be synced")),
        }
    }

    /// Requests the device has seen so far, where they can be counted.
    pub fn io(&self) -> io::Result<Option<IoCounts>> {
        let counters = match &self.target {
            Target::Jext(fs) => Some(fs.counters()),
            Target::Block(device, _) => Some(device.counters().snapshot()),
            _ => None,
        };
        if let Some(c) = counters {
            return Ok(Some(IoCounts {
                writes: c.writes,
                write_bytes: c.write_bytes,
                flushes: c.flushes,
                fua_writes: Some(c.fua_writes),
            }));
        }
        self.device
            .as_ref()
            .map(|d| d.stats().map(IoCounts::from))
            .transpose()
    }

    /// What jext's daemon has served so far, if this is jext's mount.
    pub fn daemon_stats(&self) -> io::Result<Option<DaemonStats>> {
        match &self.target {
            Target::Mounted(mount) => mount.daemon_stats(),
            _ => Ok(None),
        }
    }

    /// jext's memory bound for its caches (`cache_size`), if this is jext.
    pub fn cache_bound_bytes(&self) -> Option<u64> {
        match &self.target {
            Target::Jext(fs) => Some(fs.options().cache_size_bytes as u64),
            _ => None,
        }
    }

    /// Bytes jext's page and buffer caches hold now, if this is jext.
    pub fn cache_bytes(&self) -> Option<u64> {
        let Target::Jext(fs) = &self.target else {
            return None;
        };
        let (pages, _dirty, blocks) = fs.cache_usage().ok()?;
        let block_bytes = u64::from(fs.statfs().ok()?.block_size);
        Some((pages as u64 + blocks as u64) * block_bytes)
    }

    /// Unmounts cleanly (jext checkpoints); the guards then tear down the rest.
    pub fn finish(self) -> io::Result<()> {
        if let Target::Jext(fs) = &self.target {
            fs.unmount().map_err(io::Error::other)?;
        }
        Ok(())
    }
}

/// An open file of a system under test.
pub enum BenchFile {
    Raw {
        file: std::fs::File,
        base: u64,
        bounce: AlignedBuffer,
    },
    Jext(jext::File),
    /// A file reached through the kernel's VFS (a kernel or FUSE mount).
    Vfs(std::fs::File),
}

impl BenchFile {
    pub fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        match self {
            BenchFile::Raw { file, base, bounce } => {
                file.write_all_at(bounce.holding(data), *base + offset)
            }
            BenchFile::Jext(f) => {
                let written = f.write_at(offset, data).map_err(io::Error::other)?;
                assert_eq!(written, data.len(), "jext wrote part of a buffer");
                Ok(())
            }
            BenchFile::Vfs(f) => f.write_all_at(data, offset),
        }
    }

    /// fbarrier, or fdatabarrier when `data_only`: jext through the library or its mount.
    pub fn barrier(&mut self, data_only: bool) -> io::Result<()> {
        match self {
            BenchFile::Jext(f) if data_only => f.fdatabarrier().map_err(io::Error::other),
            BenchFile::Jext(f) => f.fbarrier().map_err(io::Error::other),
            BenchFile::Vfs(f) => {
                let cmd = if data_only {
                    jext_fuse::JEXT_IOC_FDATABARRIER
                } else {
                    jext_fuse::JEXT_IOC_FBARRIER
                };
                // SAFETY: an ioctl without an argument on a descriptor this file owns.
                let rc = unsafe { libc::ioctl(f.as_raw_fd(), cmd as _) };
                if rc == 0 {
                    Ok(())
                } else {
                    Err(io::Error::last_os_error())
                }
            }
            BenchFile::Raw { .. } => Err(io::Error::other("a raw device has no barrier call")),
        }
    }

    /// fsync, or fdatasync when `data_only`.
    pub fn sync(&mut self, data_only: bool) -> io::Result<()> {
        match self {
            BenchFile::Raw { file, .. } => file.sync_data(),
            BenchFile::Jext(f) if data_only => f.fdatasync().map_err(io::Error::other),
            BenchFile::Jext(f) => f.fsync().map_err(io::Error::other),
            BenchFile::Vfs(f) if data_only => f.sync_data(),
            BenchFile::Vfs(f) => f.sync_all(),
        }
    }
}

/// A buffer aligned to 4096 bytes, as O_DIRECT requires, found inside an over-sized Vec
/// so no allocator tricks (or unsafe) are needed.
#[derive(Default)]
pub struct AlignedBuffer {
    storage: Vec<u8>,
}

const DIRECT_ALIGN: usize = 4096;

impl AlignedBuffer {
    /// `data` copied to an aligned place; valid until the next call.
    pub fn holding(&mut self, data: &[u8]) -> &[u8] {
        if self.storage.len() < data.len() + DIRECT_ALIGN {
            self.storage = vec![0; data.len() + DIRECT_ALIGN];
        }
        let skew = self.storage.as_ptr() as usize % DIRECT_ALIGN;
        let start = (DIRECT_ALIGN - skew) % DIRECT_ALIGN;
        let slot = &mut self.storage[start..start + data.len()];
        slot.copy_from_slice(data);
        assert_eq!(slot.as_ptr() as usize % DIRECT_ALIGN, 0);
        slot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_are_aligned_and_hold_the_data() {
        let mut buf = AlignedBuffer::default();
        for len in [4096usize, 8192, 1 << 20, 4096] {
            let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let held = buf.holding(&data);
            assert_eq!(held.as_ptr() as usize % DIRECT_ALIGN, 0);
            assert!(held == &data[..]);
        }
    }

    #[test]
    fn names_say_mode_and_backing() {
        let s = System::jext(DataMode::Journal, Backing::Loop);
        assert_eq!(s.name(), "jext data=journal (loop)");
        assert!(s.needs_root());
        assert!(!System::RawFile.needs_root());
        let fc = System::Ext4 {
            options: "data=ordered",
            features: "fast_commit",
        };
        assert_eq!(fc.name(), "ext4 data=ordered -O fast_commit");
        let on_sim = System::jext(DataMode::Journal, Backing::Sim(Preset::Ufs));
        assert_eq!(on_sim.name(), "jext data=journal (sim ufs)");
        assert!(!on_sim.needs_root() && on_sim.on_simulator() && !s.on_simulator());
    }

    #[test]
    fn jext_on_a_preset_runs_and_counts_its_requests() {
        let system = System::jext(DataMode::Ordered, Backing::Sim(Preset::SupercapSsd));
        let scratch = Scratch::new(&std::env::temp_dir()).unwrap();
        let running = system.set_up(&scratch, 256 << 20).unwrap();
        let measured =
            crate::bench::experiments::allocating_write_fsync(&running, 3, false).unwrap();
        let crate::bench::experiments::Measured::Latency { io, .. } = measured else {
            panic!("fsync-latency measures latencies");
        };
        assert_eq!(io.expect("jext counts its own requests").flushes, 3);
        running.finish().unwrap();
    }
}
