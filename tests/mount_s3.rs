//! `ckptfs mount s3://BUCKET/PREFIX MNT --read-only` against a real
//! S3-compatible server (moto, `tests/s3_server.py`) on 127.0.0.1: the
//! same bytes as the store on disk, only the touched frames fetched, a
//! disk cache that survives a remount and serves without the server, a
//! damaged cache refetched, and a network failure answered EIO, then
//! recovered from. Real mounts: root and /dev/fuse, as CI provides.

use crate::common;

use common::s3::S3Server;
use common::{gauss_bf16, populate_store, safetensors_file, Aligned, Mount, Rng};
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A safetensors file of 8 bf16 tensors of 2 MiB each, and where each
/// tensor's bytes start.
fn eight_tensors() -> (Vec<u8>, Vec<(u64, u64)>) {
    let mut rng = Rng(15);
    let t: Vec<(String, Vec<u8>)> = (0..8)
        .map(|i| {
            (
                format!("layer.{i}.weight"),
                gauss_bf16(&mut rng, 1 << 20, 0.02),
            )
        })
        .collect();
    let refs: Vec<(&str, &str, Vec<u64>, Vec<u8>)> = t
        .iter()
        .map(|(n, b)| (n.as_str(), "BF16", vec![1024, 1024], b.clone()))
        .collect();
    let f = safetensors_file(&refs, None);
    let data_start = 8 + u64::from_le_bytes(f[..8].try_into().unwrap());
    let spans = (0..8u64)
        .map(|i| (data_start + i * (2 << 20), 2 << 20))
        .collect();
    (f, spans)
}

struct Fixture {
    server: S3Server,
    m: Mount,
    pairs: Vec<(String, PathBuf)>,
    cache: PathBuf,
    big: Vec<u8>,
    spans: Vec<(u64, u64)>,
    /// Holds the disk cache and the original big file; removed last,
    /// after the mount (fields drop in order).
    _dir: tempfile::TempDir,
}

/// Mount options for `server`: a 2 s request timeout (the network-failure
/// tests wait for it) unless `extra` sets its own.
fn mount_args(server: &S3Server, cache: &Path, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "--read-only".into(),
        "--endpoint-url".into(),
        server.endpoint(),
        "--cache-dir".into(),
        cache.display().to_string(),
    ];
    if !extra.contains(&"--request-timeout") {
        v.extend(["--request-timeout".into(), "2".into()]);
    }
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// A store (the test vectors, a config, a subdirectory, an 8-tensor
/// archive) packed locally, uploaded to `bucket/models`, mounted.
fn fixture(bucket: &str, extra: &[&str]) -> Fixture {
    let server = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let cache_dir = dir.path().to_path_buf();
    let cache = cache_dir.join("cache");
    let (big, spans) = eight_tensors();
    let mut pairs = Vec::new();
    let url = format!("s3://{bucket}/models");
    let args = mount_args(&server, &cache, extra);
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let m = Mount::of_store_arg(
        |store| {
            pairs = populate_store(store);
            std::fs::remove_file(store.join("config-link.json")).unwrap();
            let orig = store.join("big.safetensors.orig");
            std::fs::write(&orig, &big).unwrap();
            common::pack(&orig, &store.join("big.safetensors.zstn"));
            std::fs::rename(&orig, cache_dir.join("big.safetensors")).unwrap();
            pairs.push(("big.safetensors".into(), cache_dir.join("big.safetensors")));
            server.put_tree(bucket, "models", store);
        },
        &url,
        &args,
    );
    Fixture {
        server,
        m,
        pairs,
        cache,
        big,
        spans,
        _dir: dir,
    }
}

/// A mount of bucket `url` (with [`mount_args`] and `extra`), whose store
/// `fill` writes and uploads.
fn mount_bucket(
    server: &S3Server,
    cache: &Path,
    url: &str,
    extra: &[&str],
    fill: impl FnOnce(&Path),
) -> Mount {
    let args = mount_args(server, cache, extra);
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    Mount::of_store_arg(fill, url, &args)
}

/// 4 KiB at `off` of `path`, read with O_DIRECT (no kernel read-ahead: the
/// daemon sees this read only).
fn read_direct(path: &Path, off: u64) -> Vec<u8> {
    let d = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap();
    let mut a = Aligned::new(4096);
    d.read_exact_at(a.as_mut(), off).unwrap();
    a.as_mut().to_vec()
}

fn read_all_identical(f: &Fixture) {
    for (name, orig) in &f.pairs {
        let got = std::fs::read(f.m.path(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(got == std::fs::read(orig).unwrap(), "{name}: bytes differ");
    }
    assert_eq!(
        std::fs::read(f.m.path("config.json")).unwrap(),
        std::fs::read(f.m.store.join("config.json")).unwrap()
    );
}

#[test]
fn every_file_reads_identical_and_only_touched_frames_are_fetched() {
    let f = fixture("read", &[]);
    let stored = std::fs::metadata(f.m.store.join("big.safetensors.zstn"))
        .unwrap()
        .len();
    // The listing shows the store as a local mount would.
    let mut names: Vec<String> = std::fs::read_dir(&f.m.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert!(names.contains(&"big.safetensors".to_string()), "{names:?}");
    assert!(names.contains(&"sub".to_string()), "{names:?}");
    assert!(names.iter().all(|n| !n.ends_with(".zstn")), "{names:?}");
    assert_eq!(
        std::fs::metadata(f.m.path("big.safetensors"))
            .unwrap()
            .len(),
        f.big.len() as u64
    );

    // 64 KiB inside one tensor (O_DIRECT: no kernel read-ahead): that
    // tensor's frame is fetched, not the other seven.
    f.server.reset();
    let (off, _) = f.spans[5];
    let off = off.next_multiple_of(4096) + (256 << 10);
    let d = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(f.m.path("big.safetensors"))
        .unwrap();
    let mut a = Aligned::new(64 << 10);
    d.read_exact_at(a.as_mut(), off).unwrap();
    assert!(a.as_mut()[..] == f.big[off as usize..off as usize + (64 << 10)]);
    let (gets, bytes) = f.server.gets();
    eprintln!("64 KiB of tensor 5: {gets} GETs, {bytes} of {stored} stored bytes");
    assert!(gets >= 1, "nothing fetched?");
    assert!(
        bytes < stored / 4,
        "64 KiB of one tensor of eight fetched {bytes} of {stored} stored bytes"
    );

    // Everything, by read(2), mmap and O_DIRECT.
    read_all_identical(&f);
    for (name, orig) in &f.pairs {
        let want = std::fs::read(orig).unwrap();
        let file = File::open(f.m.path(name)).unwrap();
        if !want.is_empty() {
            // SAFETY: a read-only map of a file nobody truncates meanwhile.
            let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
            assert!(map[..] == want[..], "{name}: mmap differs");
        }
        let d = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(f.m.path(name))
            .unwrap();
        let mut a = Aligned::new(want.len().div_ceil(4096).max(1) * 4096);
        let n = d.read_at(a.as_mut(), 0).unwrap();
        assert_eq!(n, want.len(), "{name}: O_DIRECT length");
        assert!(a.as_mut()[..n] == want[..], "{name}: O_DIRECT differs");
    }
    // safetensors' safe_open in the venv.
    let mut cmd = std::process::Command::new(common::venv_python());
    cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mount_safetensors_check.py"));
    for (name, orig) in &f.pairs {
        cmd.arg(f.m.path(name)).arg(orig);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_sequential_read_of_many_tensors_fetches_frames_ahead_in_few_requests() {
    let f = fixture("frames", &[]);
    let stored = std::fs::metadata(f.m.store.join("big.safetensors.zstn"))
        .unwrap()
        .len();
    f.server.reset();
    let got = std::fs::read(f.m.path("big.safetensors")).unwrap();
    assert!(got == f.big, "the sequential read is exact");
    let (gets, bytes) = f.server.gets();
    eprintln!("sequential read of 8 tensors: {gets} GETs, {bytes} of {stored} stored bytes");
    // Block by block, each tensor costs its frame's structure (a few
    // small GETs) and a GET per plane per window of blocks. A reader
    // going through the tensors in order gets the frames after the one
    // it reads in the background, whole, in runs of up to 8 MiB.
    assert!(
        gets <= 20,
        "a sequential read of 8 tensors took {gets} GETs"
    );
    // Nothing is fetched twice.
    assert!(bytes <= stored, "{bytes} bytes fetched of {stored} stored");
}

#[test]
fn the_disk_cache_survives_a_remount_and_serves_without_the_server() {
    let mut f = fixture("remount", &[]);
    read_all_identical(&f);
    f.m.unmount().expect("daemon exits");
    f.server.stop_proxy();
    f.server.reset();
    let args = mount_args(&f.server, &f.cache, &[]);
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    f.m.remount(&args);
    read_all_identical(&f);
    assert_eq!(
        f.server.gets(),
        (0, 0),
        "the cache should have served everything"
    );
}

/// The ranges the saved state of the cached copy of `rel` names (None
/// before one is saved).
fn saved_ranges(cache: &Path, rel: &str) -> Option<Vec<(u64, u64)>> {
    for e in std::fs::read_dir(cache.join("state")).ok()? {
        let Ok(text) = std::fs::read_to_string(e.ok()?.path()) else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        if v["rel"] == rel {
            let pairs = v["ranges"].as_array()?;
            return Some(
                pairs
                    .iter()
                    .map(|p| (p[0].as_u64().unwrap(), p[1].as_u64().unwrap()))
                    .collect(),
            );
        }
    }
    None
}

#[test]
fn what_was_fetched_is_saved_while_the_mount_runs_and_survives_a_kill() {
    let mut f = fixture("killed", &[]);
    let size = std::fs::metadata(f.m.store.join("big.safetensors.zstn"))
        .unwrap()
        .len();
    assert!(std::fs::read(f.m.path("big.safetensors")).unwrap() == f.big);
    // The range set is saved in the background, shortly after the fetches
    // (a reader does not wait for it): wait for it to name every byte the
    // read fetched (the whole object), without unmounting.
    let whole = vec![(0, size)];
    let mut saved = None;
    for _ in 0..300 {
        saved = saved_ranges(&f.cache, "big.safetensors.zstn");
        if saved.as_ref() == Some(&whole) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(saved, Some(whole), "the fetched ranges were never saved");
    // No exit path runs: what was saved is all the next mount knows.
    f.m.kill9();
    f.server.stop_proxy();
    f.server.reset();
    let args = mount_args(&f.server, &f.cache, &[]);
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    f.m.remount(&args);
    assert!(std::fs::read(f.m.path("big.safetensors")).unwrap() == f.big);
    assert_eq!(f.server.gets(), (0, 0), "the saved cache needed the server");
}

#[test]
fn a_damaged_cache_block_is_detected_and_fetched_again() {
    let mut f = fixture("damage", &[]);
    read_all_identical(&f);
    f.m.unmount().expect("daemon exits");
    // Flip bytes in the middle of each tensor's frame in the cached copy.
    let cached = f.cache.join("mirror/big.safetensors.zstn");
    let mut bytes = std::fs::read(&cached).unwrap();
    let n = bytes.len();
    for k in 1..8 {
        bytes[n * k / 9] ^= 0x55;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(&cached)
        .unwrap()
        .write_all_at(&bytes, 0)
        .unwrap();
    let args = mount_args(&f.server, &f.cache, &[]);
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    f.server.reset();
    f.m.remount(&args);
    assert!(std::fs::read(f.m.path("big.safetensors")).unwrap() == f.big);
    let (gets, _) = f.server.gets();
    assert!(gets >= 1, "the damaged frames were not fetched again");
    assert!(
        f.m.log_text()
            .contains("failed their checksum; fetching them again"),
        "{}",
        f.m.log_text()
    );
}

#[test]
fn the_server_out_of_reach_gives_eio_and_the_mount_recovers() {
    let mut f = fixture("outage", &[]);
    let file = File::open(f.m.path("big.safetensors")).unwrap();
    let (off, len) = f.spans[0];
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, off).unwrap();
    f.server.stop_proxy();
    // A file none of whose bytes were fetched (read-ahead may have fetched
    // the rest of the first one).
    let name = "packed_fp32_dense.safetensors";
    let want = std::fs::read(f.m.store.join("packed_fp32_dense.safetensors.zstn")).unwrap();
    let e = std::fs::read(f.m.path(name)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert!(
        f.m.log_text()
            .contains("s3://outage/models/packed_fp32_dense.safetensors.zstn"),
        "the log should name the object: {}",
        f.m.log_text()
    );
    f.server.start_proxy();
    assert!(!want.is_empty());
    read_all_identical(&f);
}

/// With the server frozen (SIGSTOP: connections accepted, nothing
/// answered), each read ends with EIO by its `--read-timeout`, however
/// many fetches and retries it would need (each request may wait
/// `--request-timeout`, 20 s here: before, one read waited 2-3 fetches of
/// up to 5 x 20 s each). The log says the read timeout passed, naming the
/// object; once the server answers again the same reads succeed.
#[test]
fn a_read_during_an_outage_ends_by_the_read_timeout() {
    let f = fixture(
        "frozen",
        &["--request-timeout", "20", "--read-timeout", "3"],
    );
    f.server.pause();
    // Two files none of whose bytes were fetched.
    let t0 = std::time::Instant::now();
    let e = std::fs::read(f.m.path("packed_bf16_dense.safetensors")).unwrap_err();
    let first = t0.elapsed();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let t1 = std::time::Instant::now();
    let e = std::fs::read(f.m.path("packed_fp32_dense.safetensors")).unwrap_err();
    let second = t1.elapsed();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    f.server.resume();
    // A bound far above the deadline (3 s), only to catch waits of
    // several requests (each up to 20 s), not a timing measurement.
    let bound = std::time::Duration::from_secs(3 + 30);
    assert!(first < bound && second < bound, "{first:?} {second:?}");
    let log = f.m.log_text();
    assert!(
        log.contains("read timeout (3 s, --read-timeout)")
            && log.contains("s3://frozen/models/packed_fp32_dense.safetensors.zstn"),
        "the log should say the read timeout passed, naming the object: {log}"
    );
    read_all_identical(&f);
}

#[test]
fn a_replaced_object_is_a_new_version_and_open_handles_keep_the_old() {
    let f = fixture("versions", &["--metadata-ttl", "0.5"]);
    let old = File::open(f.m.path("big.safetensors")).unwrap();
    let mut before = vec![0u8; f.big.len()];
    old.read_exact_at(&mut before, 0).unwrap();
    assert!(before == f.big);
    // Replace the object with another model.
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(99);
    let other = safetensors_file(
        &[(
            "w",
            "BF16",
            vec![512, 512],
            gauss_bf16(&mut rng, 512 * 512, 0.1),
        )],
        None,
    );
    std::fs::write(dir.path().join("o.safetensors"), &other).unwrap();
    common::pack(
        &dir.path().join("o.safetensors"),
        &dir.path().join("o.zstn"),
    );
    f.server.put(
        "versions",
        &[(
            "models/big.safetensors.zstn".to_string(),
            &dir.path().join("o.zstn"),
        )],
    );
    // Within a few listings the name shows the new version...
    let mut seen = Vec::new();
    for _ in 0..100 {
        seen = std::fs::read(f.m.path("big.safetensors")).unwrap_or_default();
        if seen == other {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(seen == other, "the new version never showed up");
    // ...while the handle opened before still reads the old bytes.
    let mut again = vec![0u8; f.big.len()];
    old.read_exact_at(&mut again, 0).unwrap();
    assert!(again == f.big);
}

/// The entries below `dir` with their metadata, skipping those the daemon
/// renamed or removed meanwhile (its state files are saved through a
/// temporary file and a rename, in the background).
fn entries(dir: &Path) -> Vec<(PathBuf, std::fs::Metadata)> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let e = e.unwrap();
            match e.metadata() {
                Ok(m) => Some((e.path(), m)),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
                Err(err) => panic!("{}: {err}", e.path().display()),
            }
        })
        .collect()
}

/// Bytes the regular files below `dir` occupy on disk (what `du` counts
/// of them).
fn disk_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for (path, m) in entries(dir) {
        if m.is_dir() {
            total += disk_usage(&path);
        } else if m.is_file() {
            total += m.blocks() * 512;
        }
    }
    total
}

/// What each file below `dir` occupies, for messages.
fn usage_listing(dir: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let mut out = String::new();
    for (path, m) in entries(dir) {
        if m.is_dir() {
            out += &usage_listing(&path);
        } else if m.blocks() > 0 {
            out += &format!("\n  {} {} of {}", path.display(), m.blocks() * 512, m.len());
        }
    }
    out
}

/// A store of one file holding one bf16 tensor of 32 MiB (32 blocks of
/// 1 MiB), uploaded to `bucket/m` and mounted; the original's bytes and
/// where the tensor's data start.
fn one_large_tensor(server: &S3Server, bucket: &str, cache: &Path) -> (Mount, Vec<u8>, u64) {
    let mut rng = Rng(32);
    let orig = safetensors_file(
        &[(
            "w",
            "BF16",
            vec![4096, 4096],
            gauss_bf16(&mut rng, 16 << 20, 0.02),
        )],
        None,
    );
    let data_start = 8 + u64::from_le_bytes(orig[..8].try_into().unwrap());
    // The callers count requests and bytes: a GET that outlives a short
    // timeout on a loaded machine (moto reads the whole object for every
    // ranged GET) would be retried and counted twice.
    let args = mount_args(server, cache, &["--request-timeout", "60"]);
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let m = Mount::of_store_arg(
        |store| {
            let tmp = tempfile::tempdir().unwrap();
            let src = tmp.path().join("w.safetensors");
            std::fs::write(&src, &orig).unwrap();
            common::pack(&src, &store.join("w.safetensors.zstn"));
            server.put_tree(bucket, "m", store);
        },
        &format!("s3://{bucket}/m"),
        &args,
    );
    (m, orig, data_start)
}

#[test]
fn a_small_read_of_a_large_tensor_fetches_about_one_block() {
    let server = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let (m, orig, data_start) = one_large_tensor(&server, "granular", &dir.path().join("cache"));
    let stored = std::fs::metadata(m.store.join("w.safetensors.zstn"))
        .unwrap()
        .len();
    server.reset();
    // 4 KiB in the middle of the tensor (O_DIRECT: no kernel read-ahead).
    let off = (data_start + (27 << 19)).next_multiple_of(4096);
    assert!(read_direct(&m.path("w.safetensors"), off) == orig[off as usize..off as usize + 4096]);
    let (gets, bytes) = server.gets();
    eprintln!("4 KiB of a 32 MiB tensor: {gets} GETs, {bytes} of {stored} stored bytes");
    // One compressed block is about 0.7 MiB; the header, index, checksum
    // block and the frame's structure add a few KiB.
    assert!(
        bytes < 2 << 20 && bytes * 10 < stored,
        "4 KiB of one tensor fetched {bytes} of {stored} stored bytes in {gets} GETs"
    );
    // Another block further on (not a sequential read, which would start
    // read-ahead): about one more block, and still exact.
    server.reset();
    let next = off + (3 << 20);
    assert!(
        read_direct(&m.path("w.safetensors"), next) == orig[next as usize..next as usize + 4096]
    );
    let (gets2, bytes2) = server.gets();
    assert!(
        bytes2 < 1 << 20,
        "the next block fetched {bytes2} bytes in {gets2} GETs"
    );
}

#[test]
fn a_sequential_read_fetches_blocks_ahead_in_few_requests() {
    let server = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let (m, orig, _) = one_large_tensor(&server, "sequential", &dir.path().join("cache"));
    server.reset();
    // The whole file, in order (32 blocks of 1 MiB, three planes each).
    let got = std::fs::read(m.path("w.safetensors")).unwrap();
    assert!(got == orig, "the sequential read is exact");
    let (gets, bytes) = server.gets();
    eprintln!("sequential read of a 32-block tensor: {gets} GETs, {bytes} bytes");
    // Fetched block by block, each plane of each block would be a GET of
    // its own (about 3 x 32); read ahead, a plane costs one GET per 8 MiB.
    assert!(
        gets <= 40,
        "a sequential read of 32 blocks took {gets} GETs"
    );
}

/// A large plain object (not an archive) is fetched as it is read, in
/// pieces of 8 MiB, not whole when opened; a reader going through it in
/// order gets the next pieces ahead, and no byte is fetched twice.
#[test]
fn a_large_plain_object_is_fetched_by_ranges_as_it_is_read() {
    let server = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(41);
    let size = (40 << 20) + 12345;
    let big: Vec<u8> = (0..size).map(|_| rng.next() as u8).collect();
    let small = b"a small plain file\n".to_vec();
    let m = mount_bucket(
        &server,
        &dir.path().join("cache"),
        "s3://plain/p",
        &["--request-timeout", "60"],
        |store| {
            std::fs::write(store.join("weights.bin"), &big).unwrap();
            std::fs::write(store.join("notes.txt"), &small).unwrap();
            server.put_tree("plain", "p", store);
        },
    );
    server.reset();
    assert_eq!(std::fs::read(m.path("notes.txt")).unwrap(), small);
    // 4 KiB in the middle (O_DIRECT: no kernel read-ahead).
    let off = 20 << 20;
    assert!(read_direct(&m.path("weights.bin"), off) == big[off as usize..off as usize + 4096]);
    let (gets, bytes) = server.gets();
    eprintln!("a small file and 4 KiB of a {size}-byte plain object: {gets} GETs, {bytes} bytes");
    assert!(
        bytes <= (8 << 20) + 4096,
        "fetched {bytes} bytes of a {size}-byte object in {gets} GETs for a 4 KiB read"
    );
    // The whole object, in order, then through a map.
    let got = std::fs::read(m.path("weights.bin")).unwrap();
    assert!(got == big, "the object read through the S3 mount differs");
    let (gets, bytes) = server.gets();
    eprintln!("then the whole object: {gets} GETs, {bytes} bytes");
    assert!(
        bytes <= size as u64 + 4096,
        "{bytes} bytes fetched for {size}: some twice"
    );
    assert!(gets <= 12, "{gets} GETs for a {size}-byte object");
    let file = File::open(m.path("weights.bin")).unwrap();
    // SAFETY: the mapped file is not changed while mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    for at in [0, 12345, (33 << 20) + 7, size - 100] {
        assert_eq!(map[at..at + 100], big[at..at + 100], "at {at}");
    }
}

/// On a server that lists no ETags and ignores conditional GETs (as
/// s3s-fs 0.14 does), a same-size replacement of an object is still a new
/// version (told by its modification time), and a handle opened on the
/// old version never gets the new bytes: its reads of bytes not cached
/// fail (EIO) instead.
#[test]
fn without_listed_etags_or_conditions_versions_are_still_never_mixed() {
    let server = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(43);
    let size = 12 << 20;
    let v1: Vec<u8> = (0..size).map(|_| rng.next() as u8).collect();
    let v2: Vec<u8> = (0..size).map(|_| rng.next() as u8).collect();
    server.like_s3s_fs();
    let m = mount_bucket(
        &server,
        &dir.path().join("cache"),
        "s3://noetag/p",
        &["--request-timeout", "60", "--metadata-ttl", "0.5"],
        |store| {
            std::fs::write(store.join("w.bin"), &v1).unwrap();
            server.put_tree("noetag", "p", store);
        },
    );
    // The old handle reads (and so caches) its first 8 MiB piece only.
    let old = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(m.path("w.bin"))
        .unwrap();
    let mut a = Aligned::new(4096);
    old.read_exact_at(a.as_mut(), 0).unwrap();
    assert!(a.as_mut()[..] == v1[..4096]);
    // Replaced a second later (HTTP dates count seconds), same size.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let src = dir.path().join("v2");
    std::fs::write(&src, &v2).unwrap();
    server.put("noetag", &[("p/w.bin".to_string(), &src)]);
    let mut seen = Vec::new();
    for _ in 0..100 {
        seen = std::fs::read(m.path("w.bin")).unwrap_or_default();
        if seen == v2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(seen == v2, "the same-size replacement never showed up");
    // The old handle: its cached piece still reads; the rest is refused.
    old.read_exact_at(a.as_mut(), 4096).unwrap();
    assert!(a.as_mut()[..] == v1[4096..8192]);
    let e = old.read_exact_at(a.as_mut(), 10 << 20).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
}

#[test]
fn the_disk_cache_stays_under_its_limit_and_keeps_serving_after_a_remount() {
    const LIMIT: u64 = 4 << 20;
    let limit_arg = LIMIT.to_string();
    let mut f = fixture("limited", &["--disk-cache-size", &limit_arg]);
    let stored: u64 = std::fs::read_dir(&f.m.store)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(
        stored > 3 * LIMIT,
        "the store ({stored} bytes) should exceed the limit"
    );
    // Every byte read exact, file after file, the cache at or under its
    // limit after each.
    for (name, orig) in &f.pairs {
        let got = std::fs::read(f.m.path(name)).unwrap();
        assert!(got == std::fs::read(orig).unwrap(), "{name}: bytes differ");
        let used = disk_usage(&f.cache);
        assert!(
            used <= LIMIT,
            "after {name}: the cache holds {used} bytes: {}",
            usage_listing(&f.cache)
        );
    }
    // A remount without the option keeps the limit; what the cache holds
    // of the last block read is served without the server.
    f.m.unmount().expect("daemon exits");
    let args = mount_args(&f.server, &f.cache, &[]);
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    f.m.remount(&args);
    let off = (f.spans[3].0 + (256 << 10)).next_multiple_of(4096);
    let want = &f.big[off as usize..off as usize + (64 << 10)];
    let read_64k = |m: &Mount| {
        // O_DIRECT, one request: no read-ahead to fetch more.
        let d = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(m.path("big.safetensors"))
            .unwrap();
        let mut a = Aligned::new(64 << 10);
        d.read_exact_at(a.as_mut(), off).unwrap();
        assert!(a.as_mut()[..] == *want);
    };
    read_64k(&f.m);
    f.m.unmount().expect("daemon exits");
    let used = disk_usage(&f.cache);
    assert!(
        used <= LIMIT,
        "after a remount: {used} bytes: {}",
        usage_listing(&f.cache)
    );
    f.server.stop_proxy();
    f.server.reset();
    f.m.remount(&args);
    read_64k(&f.m);
    assert_eq!(
        f.server.gets(),
        (0, 0),
        "the cached block needed the server"
    );
    let used = disk_usage(&f.cache);
    assert!(
        used <= LIMIT,
        "served from the cache: {used} bytes: {}",
        usage_listing(&f.cache)
    );
    // Beyond what is cached, the server is needed again, and the limit
    // still holds once it answers.
    f.server.start_proxy();
    assert!(std::fs::read(f.m.path("big.safetensors")).unwrap() == f.big);
    let used = disk_usage(&f.cache);
    assert!(
        used <= LIMIT,
        "after a second full read: {used} bytes: {}",
        usage_listing(&f.cache)
    );
}

/// A safetensors file of a 32 MiB bf16 tensor `big` (from `Rng(seed)`),
/// an 8 KiB one `norm` and `extra` (name, shape, bf16 bytes).
fn big_and_norm(seed: u64, extra: Vec<(&str, Vec<u64>, Vec<u8>)>) -> Vec<u8> {
    let mut rng = Rng(seed);
    let mut t = vec![
        (
            "big",
            "BF16",
            vec![4096, 4096],
            gauss_bf16(&mut rng, 16 << 20, 0.02),
        ),
        ("norm", "BF16", vec![4096], gauss_bf16(&mut rng, 4096, 1.0)),
    ];
    t.extend(extra.into_iter().map(|(n, s, b)| (n, "BF16", s, b)));
    safetensors_file(&t, None)
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Runs ckptfs with `args`, which must succeed.
fn ckptfs_ok(args: &[&str]) {
    let out = common::ckptfs(args);
    assert!(out.status.success(), "ckptfs {args:?}: {out:?}");
}

/// A `.blz` in a bucket is read like a `.zstn`: its header when the
/// directory is first looked at, then the blocks a read needs. Every file
/// of it reads identical; a small read of a large tensor moves about one
/// compressed block, not the archive.
#[test]
fn a_blz_in_a_bucket_is_fetched_block_by_block() {
    let server = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let shard = big_and_norm(33, vec![]);
    let config = b"{\"model_type\": \"llama\"}\n".to_vec();
    let data_start = 8 + u64::from_le_bytes(shard[..8].try_into().unwrap());
    let m = mount_bucket(
        &server,
        &dir.path().join("cache"),
        "s3://blzs/m",
        &["--request-timeout", "60"],
        |store| {
            let src = tempfile::tempdir().unwrap();
            std::fs::write(src.path().join("model.safetensors"), &shard).unwrap();
            std::fs::write(src.path().join("config.json"), &config).unwrap();
            ckptfs_ok(&["pack", p(src.path()), "-o", p(&store.join("model.blz"))]);
            server.put_tree("blzs", "m", store);
        },
    );
    let stored = std::fs::metadata(m.store.join("model.blz")).unwrap().len();
    server.reset();
    // Looking at the directory reads the header only.
    let mut names: Vec<String> = std::fs::read_dir(m.path("model"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["config.json", "model.safetensors"]);
    assert_eq!(std::fs::read(m.path("model/config.json")).unwrap(), config);
    // 4 KiB in the middle of the large tensor.
    let off = (data_start + (27 << 19)).next_multiple_of(4096);
    assert!(
        read_direct(&m.path("model/model.safetensors"), off)
            == shard[off as usize..off as usize + 4096]
    );
    let (gets, bytes) = server.gets();
    eprintln!("listing, config and 4 KiB of a 32 MiB tensor in a .blz: {gets} GETs, {bytes} of {stored} stored bytes");
    assert!(
        bytes < 2 << 20 && bytes * 10 < stored,
        "fetched {bytes} of {stored} stored bytes in {gets} GETs"
    );
    // The whole shard, exact.
    let got = std::fs::read(m.path("model/model.safetensors")).unwrap();
    assert!(got == shard, "the shard read through the S3 mount differs");
}

/// The files of the directory `dir`, relative, sorted.
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap();
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    out
}

/// Where tensor `name`'s bytes are in a safetensors file.
fn tensor_range(st: &[u8], name: &str) -> std::ops::Range<u64> {
    let n = u64::from_le_bytes(st[..8].try_into().unwrap());
    let h: serde_json::Value = serde_json::from_slice(&st[8..8 + n as usize]).unwrap();
    let o = &h[name]["data_offsets"];
    (8 + n + o[0].as_u64().unwrap())..(8 + n + o[1].as_u64().unwrap())
}

/// A BLAZE-X `.blz` in a bucket: its prelude and header when the
/// directory is first looked at (config.json and the sidecars come from
/// the header), then each tensor whole when it is first read (its xxh3
/// covers it whole). Every file reads as `ckptfs unpack` writes it
/// locally; a read of a small tensor moves that tensor, not the archive; a
/// tensor damaged in the disk cache is fetched again and served right.
#[test]
fn a_blazex_blz_in_a_bucket_is_fetched_tensor_by_tensor() {
    let server = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let mut rng = Rng(35);
    let last = gauss_bf16(&mut rng, 1 << 16, 0.02);
    let shard = big_and_norm(34, vec![("z_last", vec![1024, 64], last)]);
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("model.safetensors"), &shard).unwrap();
    std::fs::write(src.join("config.json"), b"{\"model_type\": \"llama\"}\n").unwrap();
    std::fs::write(src.join("tokenizer_config.json"), b"{\"bos\": \"<s>\"}").unwrap();
    let reference = dir.path().join("ref");
    let args = mount_args(&server, &cache, &["--request-timeout", "60"]);
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let mut m = Mount::of_store_arg(
        |store| {
            let blz = store.join("model.blz");
            ckptfs_ok(&["pack", p(&src), "-o", p(&blz), "--format", "blazex"]);
            ckptfs_ok(&["unpack", p(&blz), "-o", p(&reference)]);
            server.put_tree("blazex", "m", store);
        },
        "s3://blazex/m",
        &args,
    );
    let stored = std::fs::metadata(m.store.join("model.blz")).unwrap().len();
    let want = files_under(&reference);
    assert!(
        want.contains(&"tokenizer_config.json".to_string()),
        "{want:?}"
    );
    let model = std::fs::read(reference.join("model.safetensors")).unwrap();
    server.reset();
    // Looking at the directory, and the files the header holds.
    assert_eq!(files_under(&m.path("model")), want);
    for n in ["config.json", "tokenizer_config.json"] {
        let got = std::fs::read(m.path(&format!("model/{n}"))).unwrap();
        assert!(got == std::fs::read(reference.join(n)).unwrap(), "{n}");
    }
    // 4 KiB of a small tensor (O_DIRECT: no read-ahead). Tensors are
    // stored in name order: `norm` sits between the large one and the
    // last, away from the head and tail fetched at open.
    let r = tensor_range(&model, "norm");
    let off = r.start.next_multiple_of(4096);
    assert!(off + 4096 <= r.end);
    let got = read_direct(&m.path("model/model.safetensors"), off);
    assert!(got[..] == model[off as usize..off as usize + 4096]);
    let (gets, bytes) = server.gets();
    eprintln!(
        "listing, config, a sidecar and 4 KiB of an 8 KiB tensor in a BLAZE-X .blz: \
         {gets} GETs, {bytes} of {stored} stored bytes"
    );
    assert!(
        bytes < 1 << 20 && bytes * 20 < stored,
        "fetched {bytes} of {stored} stored bytes in {gets} GETs"
    );
    // Every file, exact.
    for n in &want {
        let got = std::fs::read(m.path(&format!("model/{n}"))).unwrap();
        assert!(
            got == std::fs::read(reference.join(n)).unwrap(),
            "{n} differs"
        );
    }

    // Bytes of the large tensor damaged in the disk cache: fetched again
    // once its xxh3 fails, and served right.
    m.unmount().expect("daemon exits");
    let cached = cache.join("mirror/model.blz");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&cached)
        .unwrap();
    f.write_all_at(b"damage", stored / 3).unwrap();
    drop(f);
    server.reset();
    m.remount(&args);
    let got = std::fs::read(m.path("model/model.safetensors")).unwrap();
    assert!(got == model, "the damaged tensor was served wrong");
    let (gets, bytes) = server.gets();
    eprintln!("a damaged 32 MiB tensor fetched again: {gets} GETs, {bytes} bytes");
    assert!(gets >= 1, "the damaged tensor was not fetched again");
    assert!(
        m.log_text()
            .contains("failed their checksum; fetching them again"),
        "{}",
        m.log_text()
    );
}

/// A delta archive (`.z4dm`) in a bucket, its base another archive of the
/// bucket: its head, record heads and trailer when it is first looked at,
/// then the blocks a read needs, each DELTA block with the base's block it
/// is XORed with (the base fetches its own, ranged too). A small read of a
/// large tensor moves about one block of each; the whole file is exact.
#[test]
fn a_delta_in_a_bucket_is_fetched_block_by_block() {
    let server = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    // layers.0.weight: 16 MiB of bf16, updated (a DELTA record);
    // layers.1.weight: 16 MiB of f32, unchanged (COPY).
    let (base, target) = common::delta_pair(41, 2, 8 << 20);
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("base.safetensors"), &base).unwrap();
    std::fs::write(src.join("target.safetensors"), &target).unwrap();
    let m = mount_bucket(
        &server,
        &dir.path().join("cache"),
        "s3://deltas/m",
        &["--request-timeout", "60"],
        |store| {
            for d in ["s1", "s2"] {
                std::fs::create_dir(store.join(d)).unwrap();
            }
            let (b, t) = (store.join("s1/model.zstn"), store.join("s2/model.z4dm"));
            common::pack(&src.join("base.safetensors"), &b);
            let target = src.join("target.safetensors");
            ckptfs_ok(&["pack", p(&target), "--base", p(&b), "-o", p(&t)]);
            server.put_tree("deltas", "m", store);
        },
    );
    let stored = std::fs::metadata(m.store.join("s2/model.z4dm"))
        .unwrap()
        .len();
    let base_stored = std::fs::metadata(m.store.join("s1/model.zstn"))
        .unwrap()
        .len();
    server.reset();
    // 4 KiB in the middle of the updated tensor.
    let r = tensor_range(&target, "layers.0.weight");
    let off = ((r.start + r.end) / 2).next_multiple_of(4096);
    let got = read_direct(&m.path("s2/model.safetensors"), off);
    assert!(got[..] == target[off as usize..off as usize + 4096]);
    let (gets, bytes) = server.gets();
    let by_key = server.get_bytes_by_key();
    let of = |k: &str| {
        by_key
            .iter()
            .filter(|(p, _)| p.ends_with(k))
            .map(|(_, n)| n)
            .sum::<u64>()
    };
    let (delta_bytes, base_bytes) = (of("s2/model.z4dm"), of("s1/model.zstn"));
    eprintln!(
        "4 KiB of a 16 MiB DELTA tensor: {gets} GETs, {bytes} bytes: {delta_bytes} of the \
         delta's {stored}, {base_bytes} of the base's {base_stored}"
    );
    // One block of either is well under 1 MiB compressed; the heads,
    // trailers, index and frame structures add a few pages.
    assert!(
        delta_bytes < 2 << 20 && delta_bytes * 4 < stored,
        "the delta: {delta_bytes} of {stored} stored bytes ({by_key:?})"
    );
    assert!(
        base_bytes < 2 << 20 && base_bytes * 10 < base_stored,
        "the base: {base_bytes} of {base_stored} stored bytes ({by_key:?})"
    );
    // The whole file, exact.
    let got = std::fs::read(m.path("s2/model.safetensors")).unwrap();
    assert!(got == target, "the delta read through the S3 mount differs");
}
