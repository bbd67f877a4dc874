//! Helpers shared by the integration tests: scratch directories, Linux's mkfs.ext4 and
//! loop mounts (the kernel as an oracle). A missing tool fails the test loudly.
#![allow(dead_code)]

use jext_fs::format::extent::Extent;
use jext_fs::format::superblock::{features, Superblock};
use jext_fs::format::Location;
use jext_fs::{Fs, MountOptions};
use jext_journal::format::fast_commit::{Dentry, FastCommitWriter, FcRecord};
use jext_journal::format::superblock::JournalSuperblock;
use jext_journal::{AreaRun, JournalArea};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("jext-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // JEXT_KEEP_SCRATCH=1 keeps the images of a failed test for inspection.
        if std::env::var("JEXT_KEEP_SCRATCH").is_err() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A simulated 32 MiB device with a fresh jext file system of 4 KiB blocks.
pub fn fresh_sim_fs() -> std::sync::Arc<jext_device::SimDevice> {
    let dev = std::sync::Arc::new(jext_device::SimDevice::new(32 << 20));
    let opts = jext_fs::MkfsOptions {
        assume_zeroed: true,
        uuid: Some([9; 16]),
        block_size: Some(4096),
        ..jext_fs::MkfsOptions::default()
    };
    jext_fs::mkfs(dev.clone(), &opts).unwrap();
    dev
}

/// What `path` holds after recovery of `dev` (a crash state) mounted with `options`;
/// the recovered image must pass fsck.
pub fn recovered_content(
    dev: jext_device::SimDevice,
    path: &str,
    options: MountOptions,
) -> Vec<u8> {
    let dev = std::sync::Arc::new(dev);
    let fs = Fs::open(dev.clone(), options).expect("recovery mounts");
    let f = fs.open_file(path).expect("the file survives");
    let size = f.stat().unwrap().size as usize;
    let data = f.read_at(0, size).unwrap();
    drop(f);
    fs.unmount().unwrap();
    let report = jext_fs::fsck(dev).unwrap();
    assert!(report.is_clean(), "fsck after recovery: {report:?}");
    data
}

/// Runs a command and panics with its output if it fails.
pub fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd} (install it with scripts/setup): {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Makes a sparse image file with Linux's mkfs.ext4.
pub fn mkfs_ext4(image: &Path, size_mib: u64, extra: &[&str]) {
    let f = std::fs::File::create(image).unwrap();
    f.set_len(size_mib << 20).unwrap();
    drop(f);
    let mut args = vec!["-q", "-F"];
    args.extend_from_slice(extra);
    let image = image.to_str().unwrap();
    args.push(image);
    run("mkfs.ext4", &args);
}

/// Runs `e2fsck -fn` and returns (exit code, output).
pub fn e2fsck(image: &Path) -> (i32, String) {
    let out = Command::new("e2fsck")
        .args(["-fn", image.to_str().unwrap()])
        .output()
        .expect("cannot run e2fsck (install e2fsprogs with scripts/setup)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// Asserts `e2fsck -fn` finds nothing to fix.
pub fn assert_e2fsck_clean(image: &Path) {
    let (code, text) = e2fsck(image);
    assert_eq!(
        code,
        0,
        "e2fsck -fn found problems in {}:\n{text}",
        image.display()
    );
}

/// A Linux loop mount of an image, unmounted on drop.
pub struct LoopMount {
    pub dir: PathBuf,
    mounted: bool,
}

impl LoopMount {
    pub fn new(image: &Path, dir: &Path, options: &str) -> LoopMount {
        std::fs::create_dir_all(dir).unwrap();
        let mut opts = String::from("loop");
        if !options.is_empty() {
            opts.push(',');
            opts.push_str(options);
        }
        run(
            "mount",
            &[
                "-t",
                "ext4",
                "-o",
                &opts,
                image.to_str().unwrap(),
                dir.to_str().unwrap(),
            ],
        );
        LoopMount {
            dir: dir.to_path_buf(),
            mounted: true,
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    pub fn unmount(mut self) {
        self.do_unmount();
    }

    fn do_unmount(&mut self) {
        if self.mounted {
            self.mounted = false;
            run("umount", &[self.dir.to_str().unwrap()]);
        }
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(&self.dir).status();
        }
    }
}

/// Reads `len` bytes at `offset` of a file.
pub fn read_at(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, offset).unwrap();
    buf
}

/// Every entry of directory `dir`, "." and ".." included, batch after batch.
pub fn list_dir(fs: &jext_fs::Fs, dir: jext_fs::Ino) -> Vec<jext_fs::DirEntry> {
    let mut out = Vec::new();
    let mut cookie = 0;
    loop {
        let batch = fs.readdir(dir, cookie).unwrap();
        let Some(last) = batch.last() else {
            return out;
        };
        cookie = last.next_cookie;
        out.extend(batch);
    }
}

/// What a test device does before it hands a request to the simulated disk under it:
/// take its time, or hold the request at a door the test opens.
pub trait DeviceHook: Send + Sync {
    fn before_read(&self, _offset: u64, _len: usize) {}
    fn before_write(&self, _offset: u64, _data: &[u8]) {}
    /// What the hook does, for the device's description.
    fn name(&self) -> &'static str;
}

/// A simulated disk with `hook` run before each read and write; everything else is the
/// simulator's.
pub struct HookedDevice<H> {
    pub sim: jext_device::SimDevice,
    pub hook: H,
}

impl<H> HookedDevice<H> {
    pub fn new(size_bytes: u64, hook: H) -> HookedDevice<H> {
        HookedDevice {
            sim: jext_device::SimDevice::new(size_bytes),
            hook,
        }
    }
}

impl<H: DeviceHook> jext_device::BlockDevice for HookedDevice<H> {
    fn size_bytes(&self) -> u64 {
        self.sim.size_bytes()
    }
    fn sector_size(&self) -> u32 {
        self.sim.sector_size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), jext_device::DeviceError> {
        self.hook.before_read(offset, buf.len());
        self.sim.read_at(offset, buf)
    }
    fn write(
        &self,
        offset: u64,
        data: &[u8],
        flags: jext_device::WriteFlags,
    ) -> Result<(), jext_device::DeviceError> {
        self.hook.before_write(offset, data);
        self.sim.write(offset, data, flags)
    }
    fn flush(&self) -> Result<(), jext_device::DeviceError> {
        self.sim.flush()
    }
    fn capabilities(&self) -> jext_device::Capabilities {
        self.sim.capabilities()
    }
    fn counters(&self) -> &jext_device::DeviceCounters {
        self.sim.counters()
    }
    fn describe(&self) -> String {
        format!("{} over {}", self.hook.name(), self.sim.describe())
    }
}

/// The journal inode's extents as the journal's area runs.
pub fn area_runs(extents: &[Extent]) -> Vec<AreaRun> {
    extents
        .iter()
        .map(|e| AreaRun {
            logical: e.logical,
            physical: e.start,
            len: e.len,
        })
        .collect()
}

/// Writes `records` into a cleanly unmounted image's fast-commit area as fast commits of
/// the journal's next tid, and marks the image as needing recovery: the next mount (by
/// jext or Linux) replays them.
pub fn pend_fast_commits(image: &Path, records: &[FcRecord]) {
    let fs = Fs::open_path(image, MountOptions::default()).unwrap();
    let runs = area_runs(&fs.extents(8).unwrap());
    let block_size = fs.block_size();
    fs.unmount().unwrap();
    drop(fs);
    let area = JournalArea::new(block_size, runs).unwrap();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .unwrap();
    let mut bytes = vec![0u8; block_size as usize];
    file.read_exact_at(&mut bytes, area.byte_offset(0)).unwrap();
    let mut jsb = JournalSuperblock::decode(&bytes, area.len_blocks()).unwrap();
    assert!(jsb.is_clean(), "the unmount left the journal empty");
    jsb.enable_fast_commit();
    let mut writer = FastCommitWriter::new(block_size as usize, jsb.sequence(), true);
    for record in records {
        writer.push(record);
    }
    let first = jsb.fast_commit_first().unwrap();
    for (i, block) in writer.finish().iter().enumerate() {
        file.write_all_at(block, area.byte_offset(first + i as u32))
            .unwrap();
    }
    jsb.set_start(jsb.first());
    file.write_all_at(&jsb.encode(), area.byte_offset(0))
        .unwrap();
    let mut raw = vec![0u8; 1024];
    file.read_exact_at(&mut raw, 1024).unwrap();
    let mut sb = Superblock::decode(&raw, Location::Superblock { group: 0 }).unwrap();
    sb.set_feature_incompat(sb.feature_incompat() | features::INCOMPAT_RECOVER);
    file.write_all_at(&sb.encode(), 1024).unwrap();
    file.sync_all().unwrap();
}

/// Inode `ino` of an unmounted image as an INODE record logs it: its first 128 bytes and
/// `i_extra_isize` more (where it lies, from debugfs).
pub fn logged_inode(image: &Path, ino: u32) -> FcRecord {
    let imap = run(
        "debugfs",
        &["-R", &format!("imap <{ino}>"), image.to_str().unwrap()],
    );
    let field = |after: &str| {
        let rest = &imap[imap.find(after).unwrap_or_else(|| panic!("{imap}")) + after.len()..];
        rest.split(|c: char| c == ',' || c.is_whitespace())
            .find(|w| !w.is_empty())
            .unwrap()
            .to_string()
    };
    let block: u64 = field("located at block ").parse().unwrap();
    let offset = u64::from_str_radix(field("offset 0x").as_str(), 16).unwrap();
    let file = std::fs::File::open(image).unwrap();
    let mut raw = vec![0u8; 256];
    file.read_exact_at(&mut raw, block * 4096 + offset).unwrap();
    let extra = usize::from(u16::from_le_bytes([raw[0x80], raw[0x81]]));
    raw.truncate(128 + extra);
    FcRecord::Inode { ino, raw }
}

pub fn dentry(parent: u32, ino: u32, name: &str) -> Dentry {
    Dentry {
        parent,
        ino,
        name: name.as_bytes().to_vec(),
    }
}
