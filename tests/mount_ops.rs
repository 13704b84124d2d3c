//! Running ckptfs as an operator would (issue 44): a line of /etc/fstab
//! mounted by mount(8), the `-o` options, `ckptfs stats`, the Prometheus
//! endpoint, a systemd unit and its commands, and logs in syslog.

use crate::common;

use common::{bin, ckptfs, gauss_bf16, pack, run_as_nobody, safetensors_file, Mount, Rng};
use std::io::{Read, Write};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

/// Held by the tests that mount through mount(8): a daemon it starts logs
/// to the /dev/log of whichever test replaced it.
static MOUNT_HELPER: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A bf16 checkpoint of `mib` MiB (several 1 MiB blocks).
fn checkpoint(seed: u64, mib: usize) -> Vec<u8> {
    let mut rng = Rng(seed);
    let n = mib * MIB / 2;
    safetensors_file(
        &[
            (
                "a.weight",
                "BF16",
                vec![(n / 2 / 512) as u64, 512],
                gauss_bf16(&mut rng, n / 2, 0.02),
            ),
            (
                "b.weight",
                "BF16",
                vec![(n / 2 / 512) as u64, 512],
                gauss_bf16(&mut rng, n / 2, 0.02),
            ),
        ],
        None,
    )
}

fn mounted(mnt: &Path) -> bool {
    let want = mnt.to_string_lossy().replace(' ', "\\040");
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

/// Processes whose command line names `mnt` (a daemon serving it).
fn daemons_of(mnt: &Path) -> Vec<u32> {
    let want = mnt.as_os_str().as_encoded_bytes();
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|&b| b == 0).any(|a| a == want))
        })
        .collect()
}

fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `ckptfs stats --json MNT`.
fn stats(mnt: &Path) -> serde_json::Value {
    let out = ckptfs(&["stats", "--json", mnt.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A store with one archive `model.zstn` of `mib` MiB; returns the
/// original bytes.
fn store_with_model(store: &Path, mib: usize) -> Vec<u8> {
    let raw = checkpoint(7, mib);
    let src = store.join("model.safetensors");
    std::fs::write(&src, &raw).unwrap();
    pack(&src, &store.join("model.zstn"));
    std::fs::remove_file(&src).unwrap();
    raw
}

/// `/usr/local/bin/ckptfs` pointing at the binary under test while it
/// lives (mount.fuse3 runs `ckptfs` from a fixed PATH), unless one is
/// installed there already, which is then used as it is.
struct OnHelperPath(Option<PathBuf>);

impl OnHelperPath {
    fn new() -> OnHelperPath {
        let link = PathBuf::from("/usr/local/bin/ckptfs");
        if link.symlink_metadata().is_ok() {
            return OnHelperPath(None);
        }
        std::os::unix::fs::symlink(bin(), &link).unwrap();
        OnHelperPath(Some(link))
    }
}

impl Drop for OnHelperPath {
    fn drop(&mut self) {
        if let Some(l) = &self.0 {
            let _ = std::fs::remove_file(l);
        }
    }
}

/// The README's fstab line, as mount(8) runs it: `fuse.ckptfs` through
/// fuse3's mount.fuse3, options of both kinds, `ro` honoured, bytes
/// exact, and a plain `umount` that leaves no daemon behind. Also the
/// `prog#source` form of type `fuse`, which names the binary.
#[test]
fn an_fstab_line_mounts_read_only_and_umount_leaves_no_daemon() {
    let _one = MOUNT_HELPER.lock().unwrap_or_else(|e| e.into_inner());
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    let mnt = d.path().join("mnt");
    std::fs::create_dir_all(&store).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    let mnt = mnt.canonicalize().unwrap();
    // Above the 1 MiB block size and the 8 MiB cache given below.
    let raw = store_with_model(&store, 12);
    let _on_path = OnHelperPath::new();
    let lines = [
        format!(
            "{} {} fuse.ckptfs ro,allow_other,cache_size=8M,nofail,_netdev,x-systemd.after=network-online.target 0 0\n",
            store.display(),
            mnt.display()
        ),
        format!(
            "{}#{} {} fuse ro,noatime,cache_size=8M,log_level=debug 0 0\n",
            bin(),
            store.display(),
            mnt.display()
        ),
    ];
    for line in lines {
        let fstab = d.path().join("fstab");
        std::fs::write(&fstab, &line).unwrap();
        let out = Command::new("mount")
            .arg("-T")
            .arg(&fstab)
            .arg(&mnt)
            .output()
            .unwrap();
        assert!(out.status.success(), "{line}: {}", text(&out.stderr));
        // mount(8)'s helper prints nothing on success.
        assert_eq!(text(&out.stdout), "", "{line}");
        assert!(mounted(&mnt), "{line}");
        assert_eq!(
            std::fs::read(mnt.join("model.safetensors")).unwrap(),
            raw,
            "{line}"
        );
        let e = std::fs::write(mnt.join("new.safetensors"), b"x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{line}");
        assert_eq!(daemons_of(&mnt).len(), 1, "{line}");
        let out = Command::new("umount").arg(&mnt).output().unwrap();
        assert!(out.status.success(), "{line}: {}", text(&out.stderr));
        wait_until("the daemon to exit", 20, || daemons_of(&mnt).is_empty());
        assert!(!mounted(&mnt));
        assert_eq!(
            std::fs::read_dir(&store).unwrap().count(),
            1,
            "{line}: store untouched"
        );
    }
}

/// An option ckptfs does not know is refused in one line before anything
/// is mounted, in either form of the command.
#[test]
fn an_unknown_mount_option_is_refused_in_one_line() {
    let d = tempfile::tempdir().unwrap();
    let (s, m) = (d.path().join("s"), d.path().join("m"));
    std::fs::create_dir(&s).unwrap();
    std::fs::create_dir(&m).unwrap();
    let (s, m) = (s.to_str().unwrap(), m.to_str().unwrap());
    for args in [
        vec!["mount", s, m, "-o", "ro,cache_size=1G,frobnicate"],
        vec![s, m, "-o", "ro,frobnicate"],
    ] {
        let out = ckptfs(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = text(&out.stderr);
        assert_eq!(
            err.trim_end(),
            "ckptfs: -o frobnicate: unknown mount option (see `ckptfs mount --help`)",
            "{args:?}"
        );
        assert!(!mounted(Path::new(m)));
    }
}

/// `ckptfs stats --json` after known reads and writes: the bytes served
/// are the bytes read, each block decoded once, the commit counted, a
/// lookup of a missing name counted as ENOENT; other users of an
/// `--allow-other` mount cannot read the counters.
#[test]
fn stats_count_known_reads_writes_and_errors() {
    let mut raw = Vec::new();
    let m = Mount::new(|s| raw = store_with_model(s, 6), &["--allow-other"]);
    let s0 = stats(&m.mnt);
    assert_eq!(s0["bytes_served"], 0, "{s0}");
    assert_eq!(s0["commits"], 0, "{s0}");
    let mut f = std::fs::File::open(m.path("model.safetensors")).unwrap();
    let mut got = Vec::new();
    f.read_to_end(&mut got).unwrap();
    assert_eq!(got, raw);
    let s1 = stats(&m.mnt);
    assert_eq!(s1["bytes_served"], raw.len() as u64, "{s1}");
    assert_eq!(s1["decoded_again"], 0, "{s1}");
    assert!(s1["blocks_decoded"].as_u64().unwrap() >= 6, "{s1}");
    assert!(s1["decode_seconds"].as_f64().unwrap() > 0.0, "{s1}");
    // Every block was asked of the cache; a block the read-ahead decoded
    // before the read came is a hit, not a miss (under load it often is).
    let asked = s1["cache_misses"].as_u64().unwrap() + s1["cache_hits"].as_u64().unwrap();
    assert!(asked >= 6, "{s1}");
    assert!(s1["cache_misses"].as_u64().unwrap() >= 1, "{s1}");
    assert!(s1["cache_bytes"].as_u64().unwrap() > 0, "{s1}");
    let enoent = |s: &serde_json::Value| s["errors"]["ENOENT"].as_u64().unwrap_or(0);
    assert!(std::fs::metadata(m.path("no-such-file-here")).is_err());
    let s2 = stats(&m.mnt);
    assert_eq!(enoent(&s2), enoent(&s1) + 1, "{s2}");
    // A write, committed.
    std::fs::write(m.path("run.safetensors"), checkpoint(9, 2)).unwrap();
    wait_until("the commit", 60, || {
        let s = stats(&m.mnt);
        s["commits"] == 1 && s["writeback_queued"] == 0
    });
    assert!(m.store.join("run.zstn").is_file());
    assert_eq!(stats(&m.mnt)["commit_failures"], 0);
    // The plain form: a `name value` line each.
    let out = ckptfs(&["stats", m.mnt.to_str().unwrap()]);
    let plain = text(&out.stdout);
    assert!(
        plain
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["commits", "1"]),
        "{plain}"
    );
    // The counters are the owner's.
    let errno = run_as_nobody(
        "import os, sys\ntry:\n os.getxattr(sys.argv[1], 'user.ckptfs.stats'); print(0)\nexcept OSError as e:\n print(e.errno)",
        &[&m.mnt],
    );
    assert_eq!(errno.trim(), libc::EACCES.to_string());
    let out = ckptfs(&["stats", "/"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr).trim_end(),
        "ckptfs: /: not in a ckptfs mount"
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn scrape(port: u16) -> String {
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    out
}

/// The value of sample `name` in a Prometheus text answer.
fn sample(scraped: &str, name: &str) -> f64 {
    scraped
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in {scraped}"))
}

/// `--metrics-addr` serves the counters over loopback in Prometheus's
/// format, and agrees with `ckptfs stats`.
#[test]
fn the_metrics_endpoint_is_scraped_over_loopback() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut raw = Vec::new();
    let m = Mount::new(|s| raw = store_with_model(s, 3), &["--metrics-addr", &addr]);
    assert_eq!(std::fs::read(m.path("model.safetensors")).unwrap(), raw);
    let r = scrape(port);
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
    assert_eq!(
        sample(&r, "ckptfs_bytes_served_total"),
        raw.len() as f64,
        "{r}"
    );
    let s = stats(&m.mnt);
    assert_eq!(
        sample(&r, "ckptfs_blocks_decoded_total"),
        s["blocks_decoded"].as_f64().unwrap()
    );
    assert!(r.contains("# TYPE ckptfs_cache_bytes gauge"), "{r}");
    assert!(r.trim_end().ends_with("# EOF"), "{r}");
    // Only the address given: not the other interfaces' (the mount's
    // daemon listens on 127.0.0.1 alone).
    let listening = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let hex = format!(":{port:04X} ");
    let ours: Vec<&str> = listening
        .lines()
        .filter(|l| l.contains(&hex) && l.contains(" 0A "))
        .collect();
    assert_eq!(ours.len(), 1, "{ours:?}");
    assert!(
        ours[0]
            .split_whitespace()
            .nth(1)
            .unwrap()
            .starts_with("0100007F:"),
        "{ours:?}"
    );
}

/// The command of the documented systemd unit, run as systemd would:
/// `Type=notify` (READY=1 once mounted, STOPPING=1 at the end), then its
/// `ExecStop`, `ckptfs umount`, which returns once the file written just
/// before is committed; and the unit file itself passes `systemd-analyze
/// verify` (with ExecStart pointing at this build).
#[test]
fn the_systemd_unit_verifies_and_its_commands_notify_and_stop_cleanly() {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/systemd/ckptfs-models.service"),
    )
    .unwrap();
    let d = tempfile::tempdir().unwrap();
    let unit_path = d.path().join("ckptfs-models.service");
    std::fs::write(&unit_path, unit.replace("/usr/local/bin/ckptfs", bin())).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit_path)
        .output()
        .expect("systemd-analyze (package systemd)");
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        unit.contains("Type=notify")
            && unit.contains("ExecStop=/usr/local/bin/ckptfs umount /models/mnt")
    );

    let store = d.path().join("store");
    let mnt = d.path().join("mnt");
    std::fs::create_dir(&store).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let raw = store_with_model(&store, 2);
    let sock_path = d.path().join("notify");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut daemon = Command::new(bin())
        .args(["mount", "--foreground"])
        .arg(&store)
        .arg(&mnt)
        .args(["-o", "cache_size=8M"])
        .env("NOTIFY_SOCKET", &sock_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 256];
    let n = sock.recv(&mut buf).expect("READY=1");
    assert_eq!(&buf[..n], b"READY=1");
    let mnt = mnt.canonicalize().unwrap();
    assert!(mounted(&mnt), "READY=1 only once mounted");
    assert_eq!(std::fs::read(mnt.join("model.safetensors")).unwrap(), raw);
    // Written just before the stop: compressed before `umount` returns.
    let ckpt = checkpoint(11, 3);
    std::fs::write(mnt.join("step-1.safetensors"), &ckpt).unwrap();
    let out = ckptfs(&["umount", mnt.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let n = sock.recv(&mut buf).expect("STOPPING=1");
    assert_eq!(&buf[..n], b"STOPPING=1");
    let st = daemon.wait().unwrap();
    let mut log = String::new();
    daemon
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    assert!(st.success(), "{log}");
    assert!(store.join("step-1.zstn").is_file(), "{log}");
    let back = ckptfs(&[
        "unpack",
        store.join("step-1.zstn").to_str().unwrap(),
        "-o",
        "-",
    ]);
    assert!(back.stdout == ckpt);
    // The summary line at unmount.
    let summary = log
        .lines()
        .find(|l| l.contains("unmounted "))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        summary.contains(&format!("served {} bytes", raw.len())),
        "{summary}"
    );
    assert!(
        summary.contains("1 commits, 0 commit failures"),
        "{summary}"
    );
}

/// /dev/log replaced by a socket of this test while it lives (the one
/// there, if any, put back after).
struct DevLog {
    sock: UnixDatagram,
    moved: Option<PathBuf>,
}

impl DevLog {
    fn new() -> DevLog {
        let p = Path::new("/dev/log");
        let moved = p.symlink_metadata().is_ok().then(|| {
            let aside = PathBuf::from(format!("/dev/log.ckptfs-test-{}", std::process::id()));
            std::fs::rename(p, &aside).unwrap();
            aside
        });
        let sock = UnixDatagram::bind(p).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        DevLog { sock, moved }
    }

    /// Messages until one contains `want`.
    fn until(&self, want: &str) -> Vec<String> {
        let mut got = Vec::new();
        let mut buf = vec![0u8; 8192];
        loop {
            let n = self
                .sock
                .recv(&mut buf)
                .unwrap_or_else(|e| panic!("{want:?} not logged ({e}): {got:#?}"));
            let m = text(&buf[..n]);
            let done = m.contains(want);
            got.push(m);
            if done {
                return got;
            }
        }
    }
}

impl Drop for DevLog {
    fn drop(&mut self) {
        let _ = std::fs::remove_file("/dev/log");
        if let Some(a) = &self.moved {
            let _ = std::fs::rename(a, "/dev/log");
        }
    }
}

/// A mount from /etc/fstab logs to syslog (journald reads it): one line
/// per event naming the file and the cause, and the summary at unmount.
#[test]
fn a_mount_from_fstab_logs_to_syslog_with_a_summary_at_unmount() {
    let _one = MOUNT_HELPER.lock().unwrap_or_else(|e| e.into_inner());
    let dev_log = DevLog::new();
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    let mnt = d.path().join("mnt");
    std::fs::create_dir(&store).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let raw = store_with_model(&store, 2);
    // A damaged archive beside it: its reads fail with EIO and a line.
    let mut bad = std::fs::read(store.join("model.zstn")).unwrap();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x40;
    std::fs::write(store.join("bad.zstn"), &bad).unwrap();
    let fstab = d.path().join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "{}#{} {} fuse ro 0 0\n",
            bin(),
            store.display(),
            mnt.display()
        ),
    )
    .unwrap();
    let out = Command::new("mount")
        .arg("-T")
        .arg(&fstab)
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mnt = mnt.canonicalize().unwrap();
    let started = dev_log.until(&format!(" at {} (", mnt.display()));
    assert!(
        started.iter().any(|m| m.contains("ckptfs[")),
        "tagged ckptfs[PID]: {started:?}"
    );
    assert_eq!(std::fs::read(mnt.join("model.safetensors")).unwrap(), raw);
    let e = std::fs::read(mnt.join("bad.safetensors")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    // The line names the archive (and why, which depends on the byte hit).
    dev_log.until("bad.zstn");
    let out = Command::new("umount").arg(&mnt).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let end = dev_log.until(&format!("unmounted {}: ", mnt.display()));
    let summary = end.last().unwrap();
    // The damaged file's blocks before the damage may be served too.
    let served: usize = summary
        .split("served ")
        .nth(1)
        .and_then(|r| r.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{summary}"));
    assert!(served >= raw.len(), "{summary}");
    assert!(summary.contains("EIO"), "{summary}");
    wait_until("the daemon to exit", 20, || daemons_of(&mnt).is_empty());
}
