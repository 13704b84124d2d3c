//! Writes into `ckptfs mount s3://BUCKET/PREFIX MNT` (without
//! `--read-only`) against moto's server on 127.0.0.1
//! (`tests/s3_server.py`): a `save_file` ends as `X.zstn` in the bucket
//! that `ckptfs unpack` and z4ai decode identically, plain files are
//! uploaded on close, renames and unlinks reach the bucket, a crash before
//! the upload loses nothing, one writer and two read-only daemons agree,
//! and a second writer is refused. Real mounts: root and /dev/fuse.

use crate::common;

use common::s3::S3Server;
use common::{bin, spool_entries, venv_python, Mount};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn client(args: &[&str]) -> Output {
    Command::new(venv_python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mount_write_client.py"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn args(server: &S3Server, cache: &Path, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "--endpoint-url".into(),
        server.endpoint(),
        "--cache-dir".into(),
        cache.display().to_string(),
        "--request-timeout".into(),
        "1".into(),
        "--metadata-ttl".into(),
        "1".into(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn mount(server: &S3Server, url: &str, cache: &Path, extra: &[&str]) -> Mount {
    let a = args(server, cache, extra);
    let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
    Mount::of_store_arg(|_| {}, url, &a)
}

/// Polls `cond` every 50 ms for up to `secs` (a deadline against hangs,
/// not a timing assertion).
fn wait_for(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not after {secs} s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn keys(server: &S3Server, bucket: &str) -> Vec<String> {
    server
        .list(bucket, "models/")
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

fn has(server: &S3Server, bucket: &str, key: &str) -> bool {
    keys(server, bucket).iter().any(|k| k == key)
}

/// A bucket with one object under `models/`.
fn bucket(server: &S3Server, name: &str, dir: &Path) {
    let readme = dir.join("README.md");
    std::fs::write(&readme, b"a store\n").unwrap();
    server.put(name, &[("models/README.md".into(), readme.as_path())]);
}

fn spool_of(cache: &Path) -> Vec<String> {
    spool_entries(&cache.join("mirror"))
}

#[test]
fn save_file_ends_as_zstn_in_the_bucket_and_plain_files_are_uploaded() {
    let server = S3Server::start();
    let tmp = tempfile::tempdir().unwrap();
    bucket(&server, "wbucket", tmp.path());
    let cache = tmp.path().join("cache");
    // z4ai decodes what is uploaded below: the write-back writes only
    // frames z4ai 0.2.0 reads (the default would use split-float frames).
    let m = mount(
        &server,
        "s3://wbucket/models",
        &cache,
        &["--compat", "z4ai"],
    );
    let model = m.path("model.safetensors");
    let model_s = model.to_str().unwrap();
    ok(client(&["save", model_s, "7", "65536"]));
    std::fs::write(m.path("notes.txt"), b"plain bytes\n").unwrap();
    std::fs::create_dir(m.path("sub")).unwrap();
    std::fs::write(m.path("sub/a.txt"), b"in a directory\n").unwrap();
    wait_for(30, "uploads", || {
        spool_of(&cache).is_empty()
            && has(&server, "wbucket", "models/model.zstn")
            && has(&server, "wbucket", "models/notes.txt")
            && has(&server, "wbucket", "models/sub/a.txt")
    });
    assert!(!has(&server, "wbucket", "models/model.safetensors"));
    // The cache holds the bucket's bytes: the directories the daemon makes
    // for itself are 0700 and its own state files 0600, though it runs with
    // umask 0 (issue 46, item 2). (Directories inside `mirror/` are the
    // store's own, with the modes their makers gave them, behind it.)
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&cache), 0o700);
        for d in ["mirror", "state", "tmp"] {
            assert_eq!(mode(&cache.join(d)), 0o700, "{d}");
        }
        for d in [cache.clone(), cache.join("state")] {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_file() {
                    assert_eq!(mode(&p), 0o600, "{}", p.display());
                }
            }
        }
    }
    // This daemon shows the committed file at once, by its name.
    let mut names: Vec<String> = std::fs::read_dir(&m.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["README.md", "model.safetensors", "notes.txt", "sub"],
        "{}",
        m.log_text()
    );
    ok(client(&["expect", model_s, "7", "65536"]));
    let served = std::fs::read(&model).unwrap();

    // The object decodes identically with `ckptfs unpack` and with z4ai.
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    server.get("wbucket", "models/model.zstn", &out.join("model.zstn"));
    let unpacked = out.join("unpacked.safetensors");
    let o = Command::new(bin())
        .args(["unpack", "s3://wbucket/models/model.zstn", "-o"])
        .arg(&unpacked)
        .env("AWS_ENDPOINT_URL", server.endpoint())
        .output()
        .unwrap();
    ok(o);
    assert!(std::fs::read(&unpacked).unwrap() == served);
    std::fs::write(out.join("model.safetensors"), &served).unwrap();
    common::run_test_script("z4ai_decode.py", &[out.to_str().unwrap()]);
    let notes = out.join("notes.txt");
    server.get("wbucket", "models/notes.txt", &notes);
    assert_eq!(std::fs::read(&notes).unwrap(), b"plain bytes\n");

    // Rename: a copy then a delete of the object; unlink: a delete.
    std::fs::rename(m.path("notes.txt"), m.path("renamed.txt")).unwrap();
    assert!(has(&server, "wbucket", "models/renamed.txt"));
    assert!(!has(&server, "wbucket", "models/notes.txt"));
    assert_eq!(
        std::fs::read(m.path("renamed.txt")).unwrap(),
        b"plain bytes\n"
    );
    std::fs::rename(&model, m.path("moved.safetensors")).unwrap();
    assert!(has(&server, "wbucket", "models/moved.zstn"));
    assert!(!has(&server, "wbucket", "models/model.zstn"));
    ok(client(&[
        "expect",
        m.path("moved.safetensors").to_str().unwrap(),
        "7",
        "65536",
    ]));
    std::fs::remove_file(m.path("moved.safetensors")).unwrap();
    std::fs::remove_file(m.path("sub/a.txt")).unwrap();
    assert_eq!(
        keys(&server, "wbucket"),
        [
            "models/.ckptfs-writer.lock",
            "models/README.md",
            "models/renamed.txt"
        ]
    );
    // Overwriting a plain object in place.
    std::fs::write(m.path("README.md"), b"rewritten\n").unwrap();
    wait_for(30, "rewrite uploaded", || {
        spool_of(&cache).is_empty()
            && server
                .list("wbucket", "models/README.md")
                .first()
                .is_some_and(|(_, n)| *n == 10)
    });
    // Unlinking an overwritten file that is still staged removes the old
    // object too.
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(m.path("renamed.txt"))
            .unwrap();
        f.write_all(b"more\n").unwrap();
        std::fs::remove_file(m.path("renamed.txt")).unwrap();
    }
    wait_for(30, "staged copy dropped", || spool_of(&cache).is_empty());
    assert!(!has(&server, "wbucket", "models/renamed.txt"));
    // Directory renames would copy every object: EXDEV (mv copies).
    let e = std::fs::rename(m.path("sub"), m.path("sub2")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EXDEV));
}

#[test]
fn a_crash_before_the_upload_loses_nothing() {
    let mut server = S3Server::start();
    let tmp = tempfile::tempdir().unwrap();
    bucket(&server, "crash", tmp.path());
    let cache = tmp.path().join("cache");
    let mut m = mount(&server, "s3://crash/models", &cache, &[]);
    // The network goes: the upload fails (and is retried).
    server.stop_proxy();
    let model = m.path("model.safetensors");
    ok(client(&["save", model.to_str().unwrap(), "11", "65536"]));
    std::fs::write(m.path("plain.bin"), vec![5u8; 3000]).unwrap();
    wait_for(60, "a failed upload", || {
        m.log_text().contains("upload failed")
    });
    // Served from the staged copy meanwhile.
    ok(client(&["expect", model.to_str().unwrap(), "11", "65536"]));
    assert!(!spool_of(&cache).is_empty());
    m.kill9();
    server.start_proxy();
    assert!(!has(&server, "crash", "models/model.zstn"));
    // The next mount with the same cache directory takes the writer lock
    // it left and uploads what it staged.
    let a = args(&server, &cache, &[]);
    let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
    m.remount(&a);
    wait_for(60, "recovered uploads", || {
        spool_of(&cache).is_empty()
            && has(&server, "crash", "models/model.zstn")
            && has(&server, "crash", "models/plain.bin")
    });
    ok(client(&["expect", model.to_str().unwrap(), "11", "65536"]));
    assert_eq!(std::fs::read(m.path("plain.bin")).unwrap(), vec![5u8; 3000]);
    let got = tmp.path().join("got.zstn");
    server.get("crash", "models/model.zstn", &got);
    let o = Command::new(bin())
        .arg("verify")
        .arg(&got)
        .output()
        .unwrap();
    ok(o);
}

fn expect_soon(m: &Mount, seed: u32) {
    let p = m.path("model.safetensors");
    let p = p.to_str().unwrap().to_string();
    let s = seed.to_string();
    wait_for(30, &format!("{p} at version {seed}"), || {
        client(&["expect", &p, &s, "65536"]).status.success()
    });
}

#[test]
fn one_writer_two_readers_and_a_second_writer_is_refused() {
    let server = S3Server::start();
    let tmp = tempfile::tempdir().unwrap();
    bucket(&server, "shared", tmp.path());
    let url = "s3://shared/models";
    let wcache = tmp.path().join("w");
    let mut w = mount(&server, url, &wcache, &[]);
    let r1 = mount(&server, url, &tmp.path().join("r1"), &["--read-only"]);
    let r2 = mount(&server, url, &tmp.path().join("r2"), &["--read-only"]);

    // A second writable daemon (its own cache directory) is refused.
    let mnt2 = tmp.path().join("mnt2");
    std::fs::create_dir(&mnt2).unwrap();
    let o = Command::new(bin())
        .arg("mount")
        .arg(url)
        .arg(&mnt2)
        .arg("--foreground")
        .args(args(&server, &tmp.path().join("w2"), &[]))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("s3://shared/models") && e.contains("in use by a writable ckptfs daemon"),
        "{e}"
    );
    assert_eq!(e.trim().lines().count(), 1, "{e}");

    // Every commit reaches both readers, exact.
    let model = w.path("model.safetensors");
    for seed in 1..=3 {
        ok(client(&[
            "save",
            model.to_str().unwrap(),
            &seed.to_string(),
            "65536",
        ]));
        expect_soon(&r1, seed);
        expect_soon(&r2, seed);
    }

    // The writer dies while committing version 4: readers go on reading
    // a whole version (3 or 4), never a torn one.
    ok(client(&["save", model.to_str().unwrap(), "4", "65536"]));
    w.kill9();
    for r in [&r1, &r2] {
        let p = r.path("model.safetensors");
        let p = p.to_str().unwrap();
        // Each read is one open and a read to the end: its bytes must be
        // version 3 or 4 whole (the client fails on anything else). A read
        // that meets the switch from one to the other may fail cleanly
        // instead (its handle's version is gone): it is read again.
        wait_for(30, "a whole version 3 or 4", || {
            let got = ok(client(&["version", p, "65536", "3", "4"]));
            let got = got.trim().to_string();
            let whole = got == "3" || got == "4";
            if !whole {
                eprintln!("{p}: {got}");
            }
            whole
        });
    }
    // The writer comes back with its cache directory: version 4 is
    // committed and the readers see it.
    let a = args(&server, &wcache, &[]);
    let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
    w.remount(&a);
    expect_soon(&r1, 4);
    expect_soon(&r2, 4);
    // At a clean unmount the lock goes with the writer.
    w.unmount();
    assert!(!has(&server, "shared", "models/.ckptfs-writer.lock"));
}

/// A server that ignores conditional writes (as s3s-fs 0.14 does) cannot
/// keep a second writer out: a writable mount is refused there with one
/// line, and no lock is left behind; a read-only mount works.
#[test]
fn a_writable_mount_is_refused_where_conditional_writes_are_ignored() {
    let server = S3Server::start();
    let tmp = tempfile::tempdir().unwrap();
    bucket(&server, "noconds", tmp.path());
    server.like_s3s_fs();
    let url = "s3://noconds/models";
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let o = Command::new(bin())
        .arg("mount")
        .arg(url)
        .arg(&mnt)
        .arg("--foreground")
        .args(args(&server, &tmp.path().join("w"), &[]))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains(url) && e.contains("ignores conditional writes") && e.contains("--read-only"),
        "{e}"
    );
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    let listing = server.list("noconds", "models");
    assert!(
        listing
            .iter()
            .all(|(k, _)| !k.ends_with(".ckptfs-writer.lock")),
        "{listing:?}"
    );
    let r = mount(&server, url, &tmp.path().join("r"), &["--read-only"]);
    assert_eq!(std::fs::read(r.path("README.md")).unwrap(), b"a store\n");
}

/// Mount options with a request timeout that a 16 MiB part through moto
/// fits in.
fn big_args(server: &S3Server, cache: &Path) -> Vec<String> {
    let mut a = args(server, cache, &[]);
    let i = a.iter().position(|x| x == "--request-timeout").unwrap();
    a[i + 1] = "30".into();
    a
}

/// A 300 MiB checkpoint written into the mount is compressed and uploaded
/// in parts (before: the upload panicked, "there is no reactor running",
/// and killed the write-back thread). The daemon is killed (`kill -9`)
/// while the multipart upload is in flight: the next mount aborts the
/// interrupted upload, uploads the file again from the spool, and it reads
/// back byte-identical; no incomplete upload is left on the server.
#[test]
fn a_300_mib_checkpoint_is_uploaded_in_parts_and_survives_a_kill_during_the_upload() {
    let server = S3Server::start();
    let tmp = tempfile::tempdir().unwrap();
    bucket(&server, "bigw", tmp.path());
    let src = tmp.path().join("src.safetensors");
    common::s3::write_big_safetensors(&src, 300, 77);
    let cache = tmp.path().join("cache");
    let a = big_args(&server, &cache);
    let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
    let mut m = Mount::of_store_arg(|_| {}, "s3://bigw/models", &a);
    std::fs::copy(&src, m.path("model.safetensors")).unwrap();
    // The upload has started (its id is in the journal) when this is
    // logged; the parts follow.
    wait_for(120, "the multipart upload to start", || {
        m.log_text()
            .contains("s3://bigw/models/model.zstn: uploading")
    });
    m.kill9();
    let left = server.uploads("bigw");
    assert!(
        !has(&server, "bigw", "models/model.zstn"),
        "the kill came before the upload completed"
    );
    assert_eq!(left.len(), 1, "the interrupted upload: {left:?}");
    m.remount(&a);
    wait_for(120, "the recovered upload", || {
        spool_of(&cache).is_empty() && has(&server, "bigw", "models/model.zstn")
    });
    let log = m.log_text();
    assert!(
        log.contains(&format!(
            "aborted the upload {} a crash interrupted",
            left[0].1
        )),
        "{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
    assert!(server.uploads("bigw").is_empty(), "no upload left behind");
    let size = server
        .list("bigw", "models/model.zstn")
        .first()
        .map(|x| x.1)
        .unwrap();
    assert!(size > 64 << 20, "uploaded in parts: {size}");
    assert!(
        common::s3::same_file(&src, &m.path("model.safetensors")),
        "the file reads back identical"
    );
    // And as another client sees the object.
    let got = tmp.path().join("got.zstn");
    server.get("bigw", "models/model.zstn", &got);
    let back = tmp.path().join("back.safetensors");
    let o = Command::new(bin())
        .arg("unpack")
        .arg(&got)
        .arg("-o")
        .arg(&back)
        .output()
        .unwrap();
    ok(o);
    assert!(common::s3::same_file(&src, &back));
}

/// Uploads that fail (the server answers 503) are retried with back-off
/// while the mount runs, never panic, and leave no incomplete multipart
/// upload; `umount` then exits 1 naming each file not uploaded by its URL
/// (so does the daemon), and the files stay staged. The next mount
/// retries them (failing again, still without a panic) until the server
/// takes them.
#[test]
fn a_failed_upload_is_retried_reported_at_umount_and_never_dropped() {
    let server = S3Server::start();
    let tmp = tempfile::tempdir().unwrap();
    bucket(&server, "failw", tmp.path());
    let cache = tmp.path().join("cache");
    let a = big_args(&server, &cache);
    let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
    let mut m = Mount::of_store_arg(|_| {}, "s3://failw/models", &a);
    server.fail_uploads(true);
    let mut rng = common::Rng(3);
    let big: Vec<u8> = (0..(70u64 << 20) / 8)
        .flat_map(|_| rng.next().to_le_bytes())
        .collect();
    std::fs::write(m.path("big.bin"), &big).unwrap();
    std::fs::write(m.path("notes.txt"), b"notes\n").unwrap();
    let failures = |m: &Mount| m.log_text().matches("big.bin: upload failed").count();
    wait_for(60, "a retried upload", || failures(&m) >= 2);
    assert!(
        server.uploads("failw").is_empty(),
        "failed uploads are aborted"
    );
    // Served from the staged copy meanwhile.
    assert!(std::fs::read(m.path("big.bin")).unwrap() == big);

    let o = Command::new(bin())
        .arg("umount")
        .arg(&m.mnt)
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains("not uploaded: s3://failw/models/big.bin: upload failed")
            && e.contains("not uploaded: s3://failw/models/notes.txt"),
        "{e}"
    );
    assert!(e.contains("2 files were not uploaded"), "{e}");
    let st = m.child.take().unwrap().wait().unwrap();
    assert_eq!(st.code(), Some(1), "the daemon's exit: {}", m.log_text());
    assert!(spool_of(&cache).len() >= 2, "both files stay staged");
    assert!(!m.log_text().contains("panicked"), "{}", m.log_text());

    // The next mount's recovery fails again: no panic, retried.
    let before = failures(&m);
    m.remount(&a);
    wait_for(60, "a failed recovered upload", || failures(&m) > before);
    assert!(!m.log_text().contains("panicked"), "{}", m.log_text());
    server.fail_uploads(false);
    wait_for(120, "the uploads once the server takes them", || {
        spool_of(&cache).is_empty()
            && has(&server, "failw", "models/big.bin")
            && has(&server, "failw", "models/notes.txt")
    });
    let got = tmp.path().join("big.bin");
    server.get("failw", "models/big.bin", &got);
    assert!(std::fs::read(&got).unwrap() == big);
    assert!(server.uploads("failw").is_empty());
    let o = Command::new(bin())
        .arg("umount")
        .arg(&m.mnt)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(m.child.take().unwrap().wait().unwrap().code(), Some(0));
}
