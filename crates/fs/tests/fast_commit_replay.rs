//! Fast commits Linux wrote, replayed by jext. The kernel works on a loop-mounted
//! `mkfs.ext4 -O fast_commit` image with a long commit interval (so fsync writes fast
//! commits, not full ones), and the image is copied while still mounted: the copy holds
//! fast commits after its last full commit. jext mounts one copy (recovery, then the
//! replay as its first transaction) and Linux another (its own replay); every fsynced
//! file must read back through jext as written, the two trees must agree, e2fsck must
//! find jext's result clean, and Linux must read jext's result as it reads its own.
//!
//! Needs root, loop devices, mkfs.ext4, e2fsck and debugfs: without root the tests say
//! SKIPPED and pass.

mod common;

use common::{e2fsck, list_dir, mkfs_ext4, run, LoopMount, Scratch};
use jext_device::{CrashCapture, SimDevice};
use jext_fs::{FileKind, Fs, Ino, MountOptions, ROOT_INO};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

/// What a tree holds at one path, as both sides can tell it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Node {
    kind: &'static str,
    perm: u32,
    /// Files: size, links, mtime and bytes; symlinks: the target; directories: nothing
    /// more (Linux's replay sets a new directory's link count to 1).
    size: u64,
    links: u64,
    mtime: i64,
    bytes: Vec<u8>,
}

fn kind_name(kind: FileKind) -> &'static str {
    match kind {
        FileKind::Regular => "file",
        FileKind::Directory => "dir",
        FileKind::Symlink => "symlink",
        _ => "other",
    }
}

/// The tree under a host directory (a Linux mount), lost+found left out.
fn host_tree(root: &Path) -> BTreeMap<String, Node> {
    let mut out = BTreeMap::new();
    let mut stack = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, rel)) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = format!("{rel}/{name}");
            if path == "/lost+found" {
                continue;
            }
            let meta = std::fs::symlink_metadata(entry.path()).unwrap();
            let ft = meta.file_type();
            let mut node = Node {
                kind: if ft.is_file() {
                    "file"
                } else if ft.is_dir() {
                    "dir"
                } else if ft.is_symlink() {
                    "symlink"
                } else {
                    "other"
                },
                perm: meta.permissions().mode() & 0o7777,
                size: 0,
                links: 0,
                mtime: 0,
                bytes: Vec::new(),
            };
            if ft.is_file() {
                node.size = meta.len();
                node.links = meta.nlink();
                node.mtime = meta.mtime();
                node.bytes = std::fs::read(entry.path()).unwrap();
            } else if ft.is_symlink() {
                let target = std::fs::read_link(entry.path()).unwrap();
                node.bytes = target.into_os_string().into_encoded_bytes();
            } else if ft.is_dir() {
                stack.push((entry.path(), path.clone()));
            }
            out.insert(path, node);
        }
    }
    out
}

/// The same through jext's API.
fn jext_tree(fs: &Fs) -> BTreeMap<String, Node> {
    let mut out = BTreeMap::new();
    let mut stack: Vec<(Ino, String)> = vec![(ROOT_INO, String::new())];
    while let Some((dir, rel)) = stack.pop() {
        for e in list_dir(fs, dir) {
            let name = String::from_utf8_lossy(&e.name).into_owned();
            let path = format!("{rel}/{name}");
            if name == "." || name == ".." || path == "/lost+found" {
                continue;
            }
            let st = fs.stat(e.ino).unwrap();
            assert_eq!(st.kind, e.kind, "{path}: entry type and inode type");
            let mut node = Node {
                kind: kind_name(st.kind),
                perm: u32::from(st.perm),
                size: 0,
                links: 0,
                mtime: 0,
                bytes: Vec::new(),
            };
            match st.kind {
                FileKind::Regular => {
                    node.size = st.size;
                    node.links = u64::from(st.nlink);
                    node.mtime = st.mtime.seconds;
                    node.bytes = fs.read(e.ino, 0, st.size as usize).unwrap();
                }
                FileKind::Symlink => node.bytes = fs.readlink(e.ino).unwrap(),
                FileKind::Directory => stack.push((e.ino, path.clone())),
                _ => {}
            }
            out.insert(path, node);
        }
    }
    out
}

/// Asserts two trees agree, naming the first paths that differ.
fn assert_same_tree(what: &str, a: &BTreeMap<String, Node>, b: &BTreeMap<String, Node>) {
    let only_a: Vec<&String> = a.keys().filter(|k| !b.contains_key(*k)).collect();
    let only_b: Vec<&String> = b.keys().filter(|k| !a.contains_key(*k)).collect();
    assert!(
        only_a.is_empty() && only_b.is_empty(),
        "{what}: paths only on the left {only_a:?}, only on the right {only_b:?}"
    );
    for (path, node) in a {
        let other = &b[path];
        if node != other {
            let brief = |n: &Node| {
                format!(
                    "{} perm {:o} size {} links {} mtime {} ({} bytes)",
                    n.kind,
                    n.perm,
                    n.size,
                    n.links,
                    n.mtime,
                    n.bytes.len()
                )
            };
            let first_diff = node
                .bytes
                .iter()
                .zip(&other.bytes)
                .position(|(x, y)| x != y);
            panic!(
                "{what}: {path} differs: {} vs {} (first differing byte {first_diff:?})",
                brief(node),
                brief(other)
            );
        }
    }
}

fn root_and_loop_or_skip(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root || !Path::new("/dev/loop-control").exists() {
        eprintln!("SKIPPED {test}: needs root and loop devices to let Linux write fast commits");
        return false;
    }
    true
}

/// Bytes that differ per file and per offset, so a block in the wrong place shows.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((i * 31 + seed * 131 + i / 4096) % 251) as u8)
        .collect()
}

fn fsync(path: &Path) {
    std::fs::File::open(path).unwrap().sync_all().unwrap();
}

/// The work Linux does before the crash; returns what each fsynced file must hold.
fn linux_work(m: &LoopMount) -> BTreeMap<String, Vec<u8>> {
    let p = |rel: &str| m.path(rel);
    let mut expect = BTreeMap::new();
    // Committed by a full commit: the starting state the fast commits build on.
    std::fs::write(p("appended"), pattern(1, 5000)).unwrap();
    std::fs::write(p("truncated"), pattern(2, 300_000)).unwrap();
    std::fs::write(p("punched"), pattern(3, 200_000)).unwrap();
    std::fs::write(p("doomed"), pattern(4, 70_000)).unwrap();
    std::fs::write(p("renamed-from"), pattern(5, 9000)).unwrap();
    std::fs::create_dir(p("old-dir")).unwrap();
    run("fallocate", &["-l", "1M", p("prealloc").to_str().unwrap()]);
    run("sync", &[]);

    // From here on only fast commits (commit=600 holds back the full commit).
    let mut appended = pattern(1, 5000);
    let more = pattern(11, 12_345);
    let f = std::fs::OpenOptions::new()
        .append(true)
        .open(p("appended"))
        .unwrap();
    f.write_all_at(&more, 5000).unwrap();
    f.sync_all().unwrap();
    appended.extend_from_slice(&more);
    expect.insert("/appended".to_string(), appended);

    // New nested directories with a leaf file: CREAT for each level.
    std::fs::create_dir_all(p("new/nested/deeper")).unwrap();
    let leaf = pattern(6, 40_000);
    std::fs::write(p("new/nested/deeper/leaf"), &leaf).unwrap();
    fsync(&p("new/nested/deeper/leaf"));
    expect.insert("/new/nested/deeper/leaf".to_string(), leaf);

    // Many new files in one directory (its blocks grow during the replay).
    // Only the fsynced one's data is promised (the others' is still delayed).
    for i in 0..60 {
        let name = format!("old-dir/file-with-a-long-name-{i:03}");
        std::fs::write(p(&name), pattern(100 + i, 100 + i as usize * 37)).unwrap();
    }
    fsync(&p("old-dir/file-with-a-long-name-059"));
    expect.insert(
        "/old-dir/file-with-a-long-name-059".to_string(),
        pattern(159, 100 + 59 * 37),
    );

    // A fragmented file: every other block written, so hundreds of extents and an
    // extent tree with index blocks the replay must allocate.
    let frag = std::fs::File::create(p("fragmented")).unwrap();
    let mut frag_bytes = vec![0u8; 600 * 8192];
    for i in 0..600u64 {
        let chunk = pattern(7 + i, 4096);
        frag.write_all_at(&chunk, i * 8192).unwrap();
        frag_bytes[(i * 8192) as usize..(i * 8192 + 4096) as usize].copy_from_slice(&chunk);
    }
    frag_bytes.truncate(599 * 8192 + 4096);
    frag.sync_all().unwrap();
    expect.insert("/fragmented".to_string(), frag_bytes);

    // Truncate down, and punch a hole: DEL_RANGE.
    let t = std::fs::OpenOptions::new()
        .write(true)
        .open(p("truncated"))
        .unwrap();
    t.set_len(10_000).unwrap();
    t.sync_all().unwrap();
    expect.insert("/truncated".to_string(), pattern(2, 10_000));
    run(
        "fallocate",
        &[
            "-p",
            "-o",
            "65536",
            "-l",
            "65536",
            p("punched").to_str().unwrap(),
        ],
    );
    fsync(&p("punched"));
    let mut punched = pattern(3, 200_000);
    punched[65536..131072].fill(0);
    expect.insert("/punched".to_string(), punched);

    // Writing inside a preallocated (unwritten) extent: ADD_RANGE of written blocks
    // over unwritten ones.
    let pre = std::fs::OpenOptions::new()
        .write(true)
        .open(p("prealloc"))
        .unwrap();
    let inside = pattern(9, 5000);
    pre.write_all_at(&inside, 8192).unwrap();
    pre.sync_all().unwrap();
    let mut prealloc = vec![0u8; 1 << 20];
    prealloc[8192..8192 + 5000].copy_from_slice(&inside);
    expect.insert("/prealloc".to_string(), prealloc);

    // Unlink, rename and a hard link; a later fsync carries them.
    std::fs::remove_file(p("doomed")).unwrap();
    std::fs::rename(p("renamed-from"), p("new/renamed-to")).unwrap();
    std::fs::hard_link(p("appended"), p("new/hard-link")).unwrap();
    let last = pattern(8, 3000);
    std::fs::write(p("new/last"), &last).unwrap();
    fsync(&p("new/last"));
    expect.insert("/new/last".to_string(), last);
    expect
}

/// What Linux does before the crash; returns what each fsynced file must hold.
type Work<'a> = &'a dyn Fn(&LoopMount) -> BTreeMap<String, Vec<u8>>;

/// The record kinds `linux_work` makes Linux log.
const ALL_TAGS: &[&str] = &[
    "tag HEAD",
    "CREAT_DENTRY",
    "ADD_RANGE",
    "DEL_RANGE",
    "DEL_ENTRY",
    "ADD_ENTRY",
];

/// Makes the crashed image: Linux's work, copied while mounted; `tags` must be among the
/// fast-commit records `debugfs logdump` lists.
fn crashed_image(
    scratch: &Scratch,
    block_size: &str,
    work: Work,
    tags: &[&str],
) -> (std::path::PathBuf, BTreeMap<String, Vec<u8>>) {
    // A `sync` anywhere on the machine (another test program, a build) makes Linux commit
    // in full and its fast commits obsolete: try again a few times before failing.
    let mut missing = String::new();
    for _ in 0..3 {
        let live = scratch.path("live.img");
        mkfs_ext4(&live, 256, &["-b", block_size, "-O", "fast_commit"]);
        let crashed = scratch.path("crashed.img");
        let m = LoopMount::new(&live, &scratch.path("live"), "commit=600");
        let expect = work(&m);
        std::fs::copy(&live, &crashed).unwrap();
        m.unmount();
        let dump = run("debugfs", &["-R", "logdump", crashed.to_str().unwrap()]);
        match tags.iter().find(|tag| !dump.contains(*tag)) {
            None => return (crashed, expect),
            Some(tag) => missing = format!("{tag}:\n{dump}"),
        }
    }
    panic!("the crashed image must hold fast commits with {missing}");
}

/// `sync` in one test would make the other's file system commit in full, turning its fast
/// commits obsolete: the Linux halves run one at a time.
static LINUX: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn linux_replay_agrees_with_jext(name: &str, block_size: &str, work: Work, tags: &[&str]) {
    let _one_at_a_time = LINUX.lock().unwrap_or_else(|e| e.into_inner());
    let scratch = Scratch::new(&format!("fc-replay-{name}-{block_size}"));
    let (crashed, expect) = crashed_image(&scratch, block_size, work, tags);
    let kernel_img = scratch.path("kernel.img");
    let jext_img = scratch.path("jext.img");
    std::fs::copy(&crashed, &kernel_img).unwrap();
    std::fs::copy(&crashed, &jext_img).unwrap();

    // Linux's own replay of the same copy.
    let m = LoopMount::new(&kernel_img, &scratch.path("kernel"), "");
    let kernel_tree = host_tree(&m.dir);
    m.unmount();

    let (fs, report) = Fs::open_with_report(
        jext_device::open_path(&jext_img, false).unwrap(),
        MountOptions::default(),
    )
    .unwrap();
    assert!(report.recovery.fast_commits.fast_commits >= 1);
    let tree = jext_tree(&fs);
    for (path, bytes) in &expect {
        let node = tree
            .get(path)
            .unwrap_or_else(|| panic!("{path} was fsynced but jext's replay lost it"));
        assert!(
            node.bytes == *bytes,
            "{path}: jext reads {} bytes, {} were fsynced",
            node.bytes.len(),
            bytes.len()
        );
    }
    assert!(!tree.contains_key("/doomed") && !tree.contains_key("/renamed-from"));
    assert_same_tree("jext's replay vs Linux's", &tree, &kernel_tree);
    fs.unmount().unwrap();
    drop(fs);

    let (code, text) = e2fsck(&jext_img);
    assert_eq!(code, 0, "e2fsck -fn after jext's replay:\n{text}");
    let (kernel_code, kernel_text) = e2fsck(&kernel_img);
    if kernel_code != 0 {
        eprintln!("(for comparison) e2fsck -fn after Linux's own replay:\n{kernel_text}");
    }
    // Linux reads jext's result as it reads its own.
    let m = LoopMount::new(&jext_img, &scratch.path("jext"), "ro");
    let linux_view = host_tree(&m.dir);
    m.unmount();
    assert_same_tree(
        "Linux reading jext's replay vs Linux's replay",
        &linux_view,
        &kernel_tree,
    );
}

#[test]
fn linux_fast_commits_replay_as_linux_replays_them_1k() {
    if root_and_loop_or_skip("linux_fast_commits_replay_as_linux_replays_them_1k") {
        linux_replay_agrees_with_jext("fixed", "1024", &linux_work, ALL_TAGS);
    }
}

#[test]
fn linux_fast_commits_replay_as_linux_replays_them_4k() {
    if root_and_loop_or_skip("linux_fast_commits_replay_as_linux_replays_them_4k") {
        linux_replay_agrees_with_jext("fixed", "4096", &linux_work, ALL_TAGS);
    }
}

/// A crash anywhere in jext's mount of a crashed image (recovery, the replay's commit,
/// finishing orphans, the unmount) leaves an image that the next mount brings to the same
/// tree: the replay is one transaction and applying it again from the same state gives
/// the same result. Crash points: before and after every flush, the end, with none and
/// with a random half of the writes not yet flushed.
#[test]
fn a_crash_during_the_replay_converges_to_the_same_tree() {
    if !root_and_loop_or_skip("a_crash_during_the_replay_converges_to_the_same_tree") {
        return;
    }
    let _one_at_a_time = LINUX.lock().unwrap_or_else(|e| e.into_inner());
    let scratch = Scratch::new("fc-replay-crash");
    let (crashed, _) = crashed_image(&scratch, "1024", &linux_work, ALL_TAGS);
    let dev = Arc::new(SimDevice::from_image_file(&crashed).unwrap());
    dev.start_capture();
    let fs = Fs::open(dev.clone(), MountOptions::default()).unwrap();
    let expected = jext_tree(&fs);
    fs.unmount().unwrap();
    drop(fs);
    let capture: CrashCapture = dev.take_capture().unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    // Around every flush, and the end.
    let mut points: Vec<usize> = vec![capture.ops().len()];
    for flush in capture.flush_points() {
        points.extend([flush, flush + 1]);
    }
    points.sort_unstable();
    points.dedup();
    let image = scratch.path("state.img");
    let mut states = 0;
    for upto in points {
        let window = capture.window_len(upto);
        let keep: Vec<bool> = (0..window).map(|_| rng.gen_bool(0.5)).collect();
        for (label, state) in [
            ("none", capture.crash_state(upto, |_| false)),
            ("half", capture.crash_state(upto, |i| keep[i])),
        ] {
            let state = Arc::new(state);
            let fs = Fs::open(state.clone(), MountOptions::default())
                .unwrap_or_else(|e| panic!("crash at op {upto} ({label} of the window): {e}"));
            assert_same_tree(
                &format!("crash at op {upto} ({label} of the window)"),
                &jext_tree(&fs),
                &expected,
            );
            fs.unmount().unwrap();
            state.write_current_image(&image).unwrap();
            let (code, text) = e2fsck(&image);
            assert_eq!(code, 0, "crash at op {upto} ({label}): e2fsck -fn:\n{text}");
            states += 1;
        }
    }
    eprintln!("{states} crash states of jext's replay checked");
    assert!(states >= 6, "only {states} crash points");
}

/// Random work: files created, appended, truncated, unlinked and renamed, directories
/// made, some files fsynced; a file's fsynced bytes are promised until it changes again.
fn random_work(seed: u64, m: &LoopMount) -> BTreeMap<String, Vec<u8>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut dirs = vec![String::new()];
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut expect = BTreeMap::new();
    // Names with another name for the same inode: left unchanged, so the model stays
    // one of bytes per name.
    let mut linked = std::collections::BTreeSet::new();
    let path = |rel: &str| m.path(rel.trim_start_matches('/'));
    for i in 0..8 {
        let name = format!("/base-{i}");
        let bytes = pattern(seed + i, rng.gen_range(0..20_000));
        std::fs::write(path(&name), &bytes).unwrap();
        files.insert(name, bytes);
    }
    run("sync", &[]);
    for step in 0..200u64 {
        let pick = |rng: &mut StdRng, files: &BTreeMap<String, Vec<u8>>| {
            let i = rng.gen_range(0..files.len().max(1));
            files.keys().nth(i).cloned()
        };
        match rng.gen_range(0..11) {
            0 | 1 => {
                let dir = &dirs[rng.gen_range(0..dirs.len())];
                let name = format!("{dir}/f-{step}");
                let bytes = pattern(seed * 1000 + step, rng.gen_range(0..30_000));
                std::fs::write(path(&name), &bytes).unwrap();
                expect.remove(&name);
                files.insert(name, bytes);
            }
            2 | 3 => {
                let Some(name) = pick(&mut rng, &files).filter(|n| !linked.contains(n)) else {
                    continue;
                };
                let more = pattern(step, rng.gen_range(1..9000));
                let f = std::fs::OpenOptions::new()
                    .append(true)
                    .open(path(&name))
                    .unwrap();
                std::io::Write::write_all(&mut &f, &more).unwrap();
                files.get_mut(&name).unwrap().extend_from_slice(&more);
                expect.remove(&name);
            }
            4 => {
                let Some(name) = pick(&mut rng, &files).filter(|n| !linked.contains(n)) else {
                    continue;
                };
                let bytes = files.get_mut(&name).unwrap();
                let len = rng.gen_range(0..=bytes.len() + 5000);
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(path(&name))
                    .unwrap()
                    .set_len(len as u64)
                    .unwrap();
                bytes.resize(len, 0);
                expect.remove(&name);
            }
            5 => {
                let Some(name) = pick(&mut rng, &files) else {
                    continue;
                };
                std::fs::remove_file(path(&name)).unwrap();
                files.remove(&name);
                expect.remove(&name);
            }
            6 => {
                let parent = dirs[rng.gen_range(0..dirs.len())].clone();
                let dir = format!("{parent}/d-{step}");
                std::fs::create_dir(path(&dir)).unwrap();
                dirs.push(dir);
            }
            7 => {
                let Some(name) = pick(&mut rng, &files) else {
                    continue;
                };
                let dir = &dirs[rng.gen_range(0..dirs.len())];
                let to = format!("{dir}/r-{step}");
                std::fs::rename(path(&name), path(&to)).unwrap();
                let bytes = files.remove(&name).unwrap();
                expect.remove(&name);
                if linked.remove(&name) {
                    linked.insert(to.clone());
                }
                files.insert(to, bytes);
            }
            8 => {
                let Some(name) = pick(&mut rng, &files) else {
                    continue;
                };
                let dir = &dirs[rng.gen_range(0..dirs.len())];
                let to = format!("{dir}/l-{step}");
                std::fs::hard_link(path(&name), path(&to)).unwrap();
                let bytes = files[&name].clone();
                linked.insert(name);
                linked.insert(to.clone());
                files.insert(to, bytes);
            }
            _ => {
                let Some(name) = pick(&mut rng, &files) else {
                    continue;
                };
                fsync(&path(&name));
                expect.insert(name.clone(), files[&name].clone());
            }
        }
    }
    expect
}

#[test]
fn random_linux_work_replays_as_linux_replays_it() {
    if !root_and_loop_or_skip("random_linux_work_replays_as_linux_replays_it") {
        return;
    }
    for seed in 1..=4u64 {
        let work = move |m: &LoopMount| random_work(seed, m);
        let block_size = if seed % 2 == 0 { "4096" } else { "1024" };
        linux_replay_agrees_with_jext(&format!("random-{seed}"), block_size, &work, &["tag HEAD"]);
    }
}

/// The records Linux wrote, replayed by jext, then replayed again onto that result
/// through the mount: the same tree, and e2fsck clean both times.
#[test]
fn linux_records_replayed_twice_give_the_same_tree() {
    if !root_and_loop_or_skip("linux_records_replayed_twice_give_the_same_tree") {
        return;
    }
    let scratch = Scratch::new("fc-replay-twice");
    let (crashed, _) = {
        let _one_at_a_time = LINUX.lock().unwrap_or_else(|e| e.into_inner());
        crashed_image(&scratch, "1024", &linux_work, ALL_TAGS)
    };
    let (fs, report) = Fs::open_with_report(
        jext_device::open_path(&crashed, false).unwrap(),
        MountOptions::default(),
    )
    .unwrap();
    let records = report.recovery.fast_commits.records.clone();
    assert!(records.len() > 100, "{} records", records.len());
    let once = jext_tree(&fs);
    fs.unmount().unwrap();
    drop(fs);
    let (code, text) = e2fsck(&crashed);
    assert_eq!(code, 0, "e2fsck -fn after one replay:\n{text}");

    common::pend_fast_commits(&crashed, &records);
    let (fs, report) = Fs::open_with_report(
        jext_device::open_path(&crashed, false).unwrap(),
        MountOptions::default(),
    )
    .unwrap();
    assert_eq!(
        report.recovery.fast_commits.records, records,
        "the second mount found the same records"
    );
    assert_same_tree("replayed twice vs once", &jext_tree(&fs), &once);
    fs.unmount().unwrap();
    drop(fs);
    let (code, text) = e2fsck(&crashed);
    assert_eq!(code, 0, "e2fsck -fn after the second replay:\n{text}");
}
