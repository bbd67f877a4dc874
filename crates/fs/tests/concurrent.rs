//! Several threads operating on one `Fs` at once, each checked against its own model.
//!
//! Each thread owns a directory and names (so its own model predicts every result of its
//! own operations exactly), and also works in directories every thread shares: it creates,
//! renames and unlinks its own names in a shared directory, moves files between its
//! directory and the shared ones, makes hard links across them, and fsyncs. Those shared
//! directories, the allocator, the inode table and the journal see truly concurrent
//! changes. After the threads join, the union of the models must be exactly the tree;
//! then the image is unmounted, `e2fsck -fn` must be clean, and a remount must show the same
//! tree. Every data mode. `JEXT_CONCURRENT_STEPS` (default 400) sets each thread's steps,
//! `JEXT_CONCURRENT_SEED` the seed.

mod common;

use common::{assert_e2fsck_clean, mkfs_ext4, Scratch};
use jext_fs::{DataMode, FileKind, Fs, MountOptions, RenameFlags, SetAttr};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

const THREADS: usize = 4;
const SHARED_DIRS: [&str; 2] = ["/shared0", "/shared1"];

/// Path to contents: one thread's files (directories are the tree's fixed skeleton).
type Files = BTreeMap<String, Vec<u8>>;

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn split(path: &str) -> (&str, &str) {
    let (dir, name) = path.rsplit_once('/').expect("absolute path");
    (if dir.is_empty() { "/" } else { dir }, name)
}

/// One thread's work: every result checked against `files` as it goes.
struct Worker<'a> {
    fs: &'a Fs,
    id: usize,
    rng: StdRng,
    files: Files,
    next_name: usize,
}

impl Worker<'_> {
    fn own_dir(&self) -> String {
        format!("/t{}", self.id)
    }

    /// A directory this thread may create names in.
    fn any_dir(&mut self) -> String {
        match self.rng.gen_range(0..3) {
            0 => self.own_dir(),
            n => SHARED_DIRS[n - 1].to_string(),
        }
    }

    fn new_path(&mut self) -> String {
        self.next_name += 1;
        let dir = self.any_dir();
        format!("{dir}/w{}-{}", self.id, self.next_name)
    }

    fn pick(&mut self) -> Option<String> {
        if self.files.is_empty() {
            return None;
        }
        let i = self.rng.gen_range(0..self.files.len());
        self.files.keys().nth(i).cloned()
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        let seed: u8 = self.rng.gen();
        (0..len).map(|i| seed.wrapping_add(i as u8)).collect()
    }

    fn step(&mut self) {
        match self.rng.gen_range(0..10) {
            0 | 1 => self.create(),
            2 | 3 => self.write(),
            4 => self.truncate(),
            5 => self.rename(),
            6 => self.unlink(),
            7 => self.link(),
            8 => self.fsync(),
            _ => self.check_one(),
        }
    }

    fn create(&mut self) {
        let path = self.new_path();
        let f = self.fs.create_file(&path, 0o644).unwrap();
        let len = self.rng.gen_range(0..20_000);
        let data = self.bytes(len);
        f.write_at(0, &data).unwrap();
        self.files.insert(path, data);
    }

    fn write(&mut self) {
        let Some(path) = self.pick() else { return };
        let len = self.rng.gen_range(1..30_000);
        let offset = self.rng.gen_range(0..60_000u64);
        let data = self.bytes(len);
        let f = self.fs.open_file(&path).unwrap();
        f.write_at(offset, &data).unwrap();
        let model = self.files.get_mut(&path).unwrap();
        let end = offset as usize + len;
        if model.len() < end {
            model.resize(end, 0);
        }
        model[offset as usize..end].copy_from_slice(&data);
    }

    fn truncate(&mut self) {
        let Some(path) = self.pick() else { return };
        let size = self.rng.gen_range(0..40_000u64);
        let ino = self.fs.resolve(&path).unwrap();
        let change = SetAttr {
            size: Some(size),
            ..SetAttr::default()
        };
        self.fs.setattr(ino, &change).unwrap();
        self.files.get_mut(&path).unwrap().resize(size as usize, 0);
    }

    fn rename(&mut self) {
        let Some(from) = self.pick() else { return };
        let to = self.new_path();
        let (fd, fname) = split(&from);
        let (td, tname) = split(&to);
        let (fd, td) = (self.fs.resolve(fd).unwrap(), self.fs.resolve(td).unwrap());
        self.fs
            .rename(
                fd,
                fname.as_bytes(),
                td,
                tname.as_bytes(),
                RenameFlags::default(),
            )
            .unwrap();
        let data = self.files.remove(&from).unwrap();
        self.files.insert(to, data);
    }

    fn unlink(&mut self) {
        let Some(path) = self.pick() else { return };
        let (dir, name) = split(&path);
        let dir = self.fs.resolve(dir).unwrap();
        self.fs.unlink(dir, name.as_bytes()).unwrap();
        self.files.remove(&path);
        // A hard link of it elsewhere keeps the inode; the model drops only this name.
    }

    /// A second name for a file, in another directory. The model keeps both names with
    /// their own copy of the contents; only `write` and `truncate` could make them differ,
    /// so a linked file is never written again (its new name is tracked as a plain file
    /// after its first name is removed here).
    fn link(&mut self) {
        let Some(path) = self.pick() else { return };
        let to = self.new_path();
        let ino = self.fs.resolve(&path).unwrap();
        let (td, tname) = split(&to);
        let td = self.fs.resolve(td).unwrap();
        self.fs.link(ino, td, tname.as_bytes()).unwrap();
        let (dir, name) = split(&path);
        let dir = self.fs.resolve(dir).unwrap();
        self.fs.unlink(dir, name.as_bytes()).unwrap();
        let data = self.files.remove(&path).unwrap();
        self.files.insert(to, data);
    }

    fn fsync(&mut self) {
        let Some(path) = self.pick() else { return };
        let f = self.fs.open_file(&path).unwrap();
        if self.rng.gen() {
            f.fsync().unwrap();
        } else {
            f.fdatasync().unwrap();
        }
    }

    fn check_one(&mut self) {
        let Some(path) = self.pick() else { return };
        let expected = &self.files[&path];
        let f = self.fs.open_file(&path).unwrap();
        let got = f.read_at(0, expected.len() + 10).unwrap();
        assert!(
            got == *expected,
            "thread {}: {path} reads {} bytes that differ from the {} it wrote",
            self.id,
            got.len(),
            expected.len()
        );
    }
}

/// Every regular file under `dir`, recursively, as path to contents.
fn tree(fs: &Fs, dir: &str, out: &mut Files) {
    let ino = fs.resolve(dir).unwrap();
    let mut cookie = 0;
    loop {
        let entries = fs.readdir(ino, cookie).unwrap();
        let Some(last) = entries.last() else { break };
        cookie = last.next_cookie;
        for e in &entries {
            let name = String::from_utf8(e.name.clone()).unwrap();
            if name == "." || name == ".." || name == "lost+found" {
                continue;
            }
            let path = format!("{}/{name}", dir.trim_end_matches('/'));
            match e.kind {
                FileKind::Directory => tree(fs, &path, out),
                FileKind::Regular => {
                    let f = fs.open_file(&path).unwrap();
                    let size = f.stat().unwrap().size as usize;
                    out.insert(path, f.read_at(0, size).unwrap());
                }
                other => panic!("{path}: unexpected {other:?}"),
            }
        }
    }
}

fn run(mode: DataMode, name: &str) {
    let scratch = Scratch::new(name);
    let image = scratch.path("a.img");
    mkfs_ext4(&image, 256, &[]);
    let options = MountOptions {
        data_mode: mode,
        ..MountOptions::default()
    };
    let fs = Fs::open_path(&image, options.clone()).unwrap();
    for dir in SHARED_DIRS {
        fs.mkdir_path(dir, 0o777).unwrap();
    }
    for id in 0..THREADS {
        fs.mkdir_path(&format!("/t{id}"), 0o755).unwrap();
    }
    let steps = env_number("JEXT_CONCURRENT_STEPS", 400);
    let seed = env_number("JEXT_CONCURRENT_SEED", 11);
    let models: Vec<Files> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|id| {
                let fs = &fs;
                s.spawn(move || {
                    let mut w = Worker {
                        fs,
                        id,
                        rng: StdRng::seed_from_u64(seed * 1000 + id as u64),
                        files: Files::new(),
                        next_name: 0,
                    };
                    for _ in 0..steps {
                        w.step();
                    }
                    w.files
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let expected: Files = models.into_iter().flatten().collect();
    let mut seen = Files::new();
    tree(&fs, "/", &mut seen);
    assert_same_tree(
        &seen,
        &expected,
        "the mounted tree (the union of the threads' models)",
    );
    fs.unmount().unwrap();
    assert_e2fsck_clean(&image);
    let again = Fs::open_path(&image, options).unwrap();
    let mut remounted = Files::new();
    tree(&again, "/", &mut remounted);
    assert_same_tree(&remounted, &expected, "the tree after unmount and remount");
    again.unmount().unwrap();
}

/// The first few runs of bytes where `a` and `b` differ (over their common length); runs
/// less than 64 bytes apart are one (two patterns agree on a byte now and then).
fn differing_ranges(a: &[u8], b: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    for i in (0..a.len().min(b.len())).filter(|&i| a[i] != b[i]) {
        if let Some(run) = runs.last_mut().filter(|run| i < run.end + 64) {
            run.end = i + 1;
        } else if runs.len() == 8 {
            break;
        } else {
            runs.push(i..i + 1);
        }
    }
    runs
}

/// Fails naming every path that is missing, extra, or reads differently, with the sizes
/// and the first byte that differs, so a rare failure says what went wrong.
fn assert_same_tree(got: &Files, expected: &Files, what: &str) {
    let mut wrong = Vec::new();
    for (path, want) in expected {
        match got.get(path) {
            None => wrong.push(format!("{path}: missing ({} bytes expected)", want.len())),
            Some(have) if have != want => wrong.push(format!(
                "{path}: {} bytes, expected {}; differing byte ranges {:?}",
                have.len(),
                want.len(),
                differing_ranges(have, want)
            )),
            Some(_) => {}
        }
    }
    for path in got.keys().filter(|p| !expected.contains_key(*p)) {
        wrong.push(format!("{path}: present, not expected"));
    }
    assert!(wrong.is_empty(), "{what} differs:\n{}", wrong.join("\n"));
}

#[test]
fn threads_at_once_ordered() {
    run(DataMode::Ordered, "concurrent-ordered");
}

#[test]
fn threads_at_once_journal() {
    run(DataMode::Journal, "concurrent-journal");
}

#[test]
fn threads_at_once_writeback() {
    run(DataMode::Writeback, "concurrent-writeback");
}
