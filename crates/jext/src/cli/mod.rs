//! Command-line parsing and dispatch. Each subcommand lives in its own module and returns
//! a process exit status; errors are printed as "jext <command>: <what failed>".

mod bench;
mod control;
mod crash;
mod demo;
mod files;
mod mount;
mod mounts;
mod progress;
mod tools;

pub(crate) use mount::daemon_stats;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "jext",
    version,
    about = "A user-space ext4 whose journal is better than the kernel's"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Make a temporary image, write a small tree, crash, recover, verify, and report
    /// what reached the disk.
    ///
    /// Example: jext demo
    Demo {
        /// Keep the image at this path instead of a temporary file.
        #[arg(long)]
        keep: Option<PathBuf>,
    },
    /// Make an ext4 file system (the defaults of mkfs.ext4).
    ///
    /// Examples: jext mkfs disk.img --size 1G
    ///           jext mkfs /dev/loop0
    Mkfs {
        /// An image file (created or resized to --size) or a block device.
        image: PathBuf,
        /// Size of a new image file (sparse), 2 MiB to 192 TiB: bytes, or a number with
        /// K, M, G, T or P (binary; also KiB ... PiB), like 64M, 1G, 1TiB.
        #[arg(long)]
        size: Option<String>,
        /// Block size, 1024 to 65536, a power of two; like --size, 4096 or 4K (default:
        /// 1024 below 512 MiB, else 4096).
        #[arg(long)]
        block_size: Option<String>,
        /// Journal size in blocks (default by size, as mkfs.ext4).
        #[arg(long)]
        journal_blocks: Option<u32>,
        /// Make no journal, as mkfs.ext4 -O ^has_journal: metadata is then written in
        /// place, and a crash may leave the file system inconsistent until e2fsck repairs
        /// it (no fast commits, no data=journal).
        #[arg(long)]
        no_journal: bool,
        /// Make no fast-commit area (the fast_commit feature is on by default: eligible
        /// fsyncs write a fast commit instead of committing the running transaction).
        #[arg(long)]
        no_fast_commit: bool,
        /// Volume label (up to 16 bytes).
        #[arg(long, default_value = "")]
        label: String,
    },
    /// Check a file system without changing it, like e2fsck -fn.
    /// Exit status: 0 clean, 4 problems found, 8 could not check.
    ///
    /// Example: jext fsck disk.img
    Fsck { image: PathBuf },
    /// Replay the journal with jext's recovery and leave the image clean: what a journal
    /// holding jext's single-I/O commits (which Linux refuses) needs before Linux mounts it.
    /// Exit status: 0 recovered (or already clean), 8 could not.
    ///
    /// Example: jext recover disk.img
    Recover { image: PathBuf },
    /// Show on-disk structures.
    ///
    /// Examples: jext debug disk.img superblock
    ///           jext debug disk.img inode 12
    ///           jext debug disk.img dir /etc
    ///           jext debug disk.img journal
    Debug {
        image: PathBuf,
        #[command(subcommand)]
        what: tools::DebugCommand,
    },
    /// Mount an ext4 image (or block device) with FUSE, as a fuseblk file system: `umount`
    /// returns once the image is clean, `sync` reaches jext. Runs in the background unless -f.
    /// A mounted image is refused to any other writer (the error names the daemon).
    ///
    /// Options (-o, comma-separated): data=ordered|journal|writeback, commit=SECS, ro, rw,
    /// errors=remount-ro|continue, cache_size=SIZE, barrier=0|1, nobarrier, acl (default) or
    /// noacl, allow_other, default_permissions (default) or nodefault_permissions,
    /// writeback_cache or nowriteback_cache (default), threads=N (request threads; default one
    /// per core, at least two), fuse_uring (serve through FUSE over io_uring when root has
    /// switched it on in /sys/module/fuse/parameters/enable_uring; else say so and use
    /// /dev/fuse), poll_us=N (how long a request thread polls for the next request
    /// before it sleeps; default 50, 0 never polls), owner_wait=SECS (wait for another
    /// owner of the image to let go), remount (with ro or rw: change a live mount), and the
    /// VFS flags nosuid, nodev, noexec, noatime, sync, dirsync.
    ///
    /// Examples: jext mount disk.img /mnt
    ///           jext mount -o data=journal,allow_other disk.img /mnt
    ///           jext mount -o remount,ro disk.img /mnt
    ///           jext mount -f disk.img /mnt     (foreground; Ctrl-C unmounts)
    Mount {
        /// Mount options.
        #[arg(short = 'o')]
        options: Option<String>,
        /// Stay in the foreground.
        #[arg(short = 'f')]
        foreground: bool,
        image: PathBuf,
        mountpoint: PathBuf,
    },
    /// Unmount a jext mount and wait until the daemon has checkpointed and closed the image.
    ///
    /// Example: jext umount /mnt
    Umount { mountpoint: PathBuf },
    /// Makes everything written under a jext mount durable (what `sync -f DIR` does; needed
    /// only on a mount made without a loop device, which the kernel never tells of a sync).
    ///
    /// Example: jext sync /mnt
    Sync { mountpoint: PathBuf },
    /// List a directory of an image (without mounting it).
    ///
    /// Example: jext ls disk.img /etc
    Ls {
        image: PathBuf,
        #[arg(default_value = "/")]
        path: String,
    },
    /// Print a file of an image to stdout.
    ///
    /// Example: jext cat disk.img /etc/hostname
    Cat { image: PathBuf, path: String },
    /// Copy a file or tree out of an image, keeping modes, owners, times, symlinks, xattrs.
    ///
    /// Example: jext get disk.img /home ./home-copy
    Get {
        image: PathBuf,
        path: String,
        dest: PathBuf,
    },
    /// Copy a host file or tree into an image at PATH (which must not exist yet).
    ///
    /// Example: jext put ./src disk.img /src
    Put {
        src: PathBuf,
        image: PathBuf,
        path: String,
    },
    /// Explore crash states: record workloads on a simulated disk, rebuild every state a
    /// crash may leave, recover each with jext and check it (fsync'd data and names,
    /// rename atomicity, no mixed blocks, jext fsck, e2fsck -fn on a sample).
    /// Exit status: 0 no failures, 1 failures found, 2 bad arguments.
    ///
    /// Examples: jext crash                     (the CI-sized exploration, all modes)
    ///           jext crash --budget 1h         (the long run: more workloads until time is up)
    ///           jext crash --workload odd-fsync-1000 --mode journal
    ///           jext crash --mode ordered+percore
    ///           jext crash --replay 'ace1-17/journal/42/0,2'
    Crash {
        /// Run until this much time has passed (e.g. 10m, 1h), with the long workload plan.
        #[arg(long)]
        budget: Option<String>,
        /// Worker threads (default: one per core).
        #[arg(long)]
        jobs: Option<usize>,
        /// Only this mode (repeatable): ordered, journal, writeback, adaptive, each
        /// optionally with +classic for classic journal commits, +blocks for whole-block
        /// journal records (journal_records=blocks), +percore for per-core i-transactions
        /// (ijournal=percore), +in_place for small synced appends written in place
        /// (small_syncs=in_place); default: the six data and commit modes,
        /// journal+blocks, ordered+in_place, ordered+percore+in_place, ordered+percore,
        /// journal+percore and adaptive.
        #[arg(long = "mode")]
        modes: Vec<String>,
        /// Only this workload (repeatable), e.g. ace1-17, ace3-5, create-delete-10.
        #[arg(long = "workload")]
        workloads: Vec<String>,
        /// Also let writes tear at 512-byte sectors.
        #[arg(long)]
        torn: bool,
        /// Also cut the largest write of each crash window (a single-I/O commit) after
        /// every 512-byte sector, and tear it at every sector.
        #[arg(long)]
        every_cut: bool,
        /// Run e2fsck -fn on every N-th state of each worker (1: all; 0: never).
        /// Default: every state with --budget, every 50th otherwise.
        #[arg(long)]
        e2fsck_every: Option<u64>,
        /// Also loop-mount every N-th state (default 20) in Linux and compare its
        /// recovery with jext's (root). With --replay: the replayed state.
        #[arg(long, num_args = 0..=1, default_missing_value = "20", value_name = "N")]
        kernel_check: Option<u64>,
        /// Seed for the sampled crash points and subsets.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Replay one failure: WORKLOAD/MODE/POINT/SELECTION as printed by a run.
        #[arg(long)]
        replay: Option<String>,
        /// With --replay: save the crash image (before recovery) here.
        #[arg(long)]
        keep_image: Option<PathBuf>,
    },
    /// Benchmark jext against the raw device and Linux ext4 on the same backing (as root:
    /// loop devices with direct I/O; without root only the image-file systems run).
    ///
    /// Examples: jext bench all --quick
    ///           jext bench fsync-latency --out bench/results/today
    Bench {
        /// seq, fsync-latency, memory, dwsl, fsync-tail, ordered-write, io-per-fsync, untar,
        /// sqlite, varmail, or all; or scale (fsck vs e2fsck and directories vs Linux ext4
        /// at growing sizes, its own report).
        experiment: String,
        /// A short run (one repetition, smaller sizes) that finishes in a few minutes.
        #[arg(long)]
        quick: bool,
        /// Repetitions of each run (default 3; 1 with --quick).
        #[arg(long)]
        repetitions: Option<usize>,
        /// Directory for scratch images; its disk is the disk under test.
        #[arg(long, default_value = "/var/tmp")]
        dir: PathBuf,
        /// Only systems whose name contains this text or one of its |-separated
        /// alternatives (e.g. "jext", "ext4", "ordered (loop)|percore|fast_commit"); for
        /// scale, only the rows whose name contains it (fsck-empty, linux-trees,
        /// dir-library, dir-mount).
        #[arg(long)]
        only: Option<String>,
        /// For scale: the sizes of the fragmented file instead of the default curve,
        /// comma-separated (e.g. "1G,100G"), to rerun the points of a long curve that
        /// did not finish.
        #[arg(long)]
        frag_sizes: Option<String>,
        /// For scale: the directory sizes (entries) instead of the default curve,
        /// comma-separated (e.g. "1000000").
        #[arg(long)]
        dir_entries: Option<String>,
        /// For scale: run the library directory rows once in this process and print
        /// each as a JSON line (what the bench runs in each fresh process).
        #[arg(long, hide = true)]
        library_runs_json: bool,
        /// Also write report.md and results.json into this directory.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// Runs a parsed command; returns the exit status.
pub fn run(cli: Cli) -> i32 {
    match cli.command {
        Command::Demo { keep } => demo::run(keep),
        Command::Mkfs {
            image,
            size,
            block_size,
            journal_blocks,
            no_journal,
            no_fast_commit,
            label,
        } => tools::mkfs(
            &image,
            size.as_deref(),
            block_size.as_deref(),
            !no_journal,
            journal_blocks,
            !no_fast_commit,
            label,
        ),
        Command::Fsck { image } => tools::fsck(&image),
        Command::Recover { image } => tools::recover(&image),
        Command::Debug { image, what } => tools::debug(&image, what),
        Command::Mount {
            options,
            foreground,
            image,
            mountpoint,
        } => mount::mount(&image, &mountpoint, options.as_deref(), foreground),
        Command::Umount { mountpoint } => mount::umount(&mountpoint),
        Command::Sync { mountpoint } => mount::sync(&mountpoint),
        Command::Ls { image, path } => files::ls(&image, &path),
        Command::Cat { image, path } => files::cat(&image, &path),
        Command::Get { image, path, dest } => files::get(&image, &path, &dest),
        Command::Put { src, image, path } => files::put(&src, &image, &path),
        Command::Crash {
            budget,
            jobs,
            modes,
            workloads,
            torn,
            every_cut,
            e2fsck_every,
            kernel_check,
            seed,
            replay,
            keep_image,
        } => crash::run(crash::Args {
            budget,
            jobs,
            modes,
            workloads,
            torn,
            every_cut,
            e2fsck_every,
            kernel_check,
            seed,
            replay,
            keep_image,
        }),
        Command::Bench {
            experiment,
            quick,
            repetitions,
            dir,
            only,
            frag_sizes,
            dir_entries,
            library_runs_json,
            out,
        } => bench::run(bench::Args {
            experiment,
            quick,
            repetitions,
            dir,
            only,
            frag_sizes,
            dir_entries,
            library_runs_json,
            out,
        }),
    }
}

/// What a read-only tool says when a live writer (a mount's daemon) owns the image: it
/// reads the image as it is now, so what it shows may lag behind what the daemon holds.
fn note_live_owner(image: &std::path::Path) {
    if let Some(holder) = jext::owner_of(image) {
        eprintln!(
            "jext: note: {} is in use by {holder}; what this shows may be stale",
            image.display()
        );
    }
}
