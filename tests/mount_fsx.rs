//! Real-mount test: fsx (the File System eXerciser, crates.io `fsx`) runs a
//! long, seeded, reproducible random sequence of writes, reads, mmap
//! reads and writes, truncates, close/reopen, fsync, fdatasync,
//! msync(MS_INVALIDATE), sendfile, posix_fadvise and copy_file_range on one
//! file in a writable mount, and checks every byte it reads against its own
//! model of the file. Once on a plain name (passed through to STORE), once
//! on a `.safetensors` name (staged in the spool, compressed after close).
//!
//! Needs root and /dev/fuse, as the other mount tests, and `.tools/bin/fsx`
//! (`bash scripts/setup-test-env.sh` installs it). On failure fsx writes
//! what the file should hold to `target/tmp/fsx-NAME/NAME.fsxgood`; rerun
//! one failure by hand with the command line the panic message prints.

mod common;

use common::{Aligned, Mount};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Operations per run: about 15 s on a local ext4 file.
const NUMOPS: u64 = 50_000;
const SEED: u64 = 20_260_422;
/// A run that takes longer than this is killed and fails.
const FSX_TIMEOUT: Duration = Duration::from_secs(240);

/// fsx's configuration. A 4 MiB file (several of the ~1 MiB blocks ckptfs
/// compresses in) and operations up to 256 KiB (more than the 128 KiB a
/// FUSE write request carries). posix_fallocate and hole punching stay off:
/// not every file system has them (see doc/fsx.toml in the fsx crate).
const FSX_TOML: &str = r#"
flen = 4194304

[opsize]
min = 0
max = 262144
align = 1

[weights]
close_open = 1
read = 10
write = 10
mapread = 5
mapwrite = 5
truncate = 3
invalidate = 1
fsync = 1
fdatasync = 1
sendfile = 1
posix_fadvise = 1
copy_file_range = 1
posix_fallocate = 0
punch_hole = 0
"#;

/// A tool that `scripts/setup-test-env.sh` installs into `.tools/bin`.
fn tool(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(".tools/bin")
        .join(name);
    assert!(
        p.is_file(),
        "{} is missing: run `bash scripts/setup-test-env.sh` (it installs fsx and \
         pjdfstest from crates.io into .tools/)",
        p.display()
    );
    p
}

/// The first lines (the error fsx found) and the last lines (the end of
/// its log of the operations before it) of fsx's output.
fn excerpt(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() <= 60 {
        return lines.join("\n");
    }
    let head = lines
        .iter()
        .position(|l| l.contains("LOG DUMP"))
        .map_or(20, |i| (i + 1).min(20));
    format!(
        "{}\n[... {} lines ...]\n{}",
        lines[..head].join("\n"),
        lines.len() - head - 40,
        lines[lines.len() - 40..].join("\n")
    )
}

/// Runs fsx on `file` and panics, with its output, unless it passes.
fn run_fsx(m: &Mount, file: &Path, label: &str) {
    let fsx = tool("fsx");
    let artifacts = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fsx-{label}"));
    let _ = std::fs::remove_dir_all(&artifacts);
    std::fs::create_dir_all(&artifacts).unwrap();
    let config = artifacts.join("fsx.toml");
    std::fs::write(&config, FSX_TOML).unwrap();
    let out_path = artifacts.join("output.txt");
    let out = std::fs::File::create(&out_path).unwrap();
    let mut cmd = Command::new(&fsx);
    cmd.arg("-N")
        .arg(NUMOPS.to_string())
        .arg("-S")
        .arg(SEED.to_string())
        .arg("-f")
        .arg(&config)
        .arg("-P")
        .arg(&artifacts)
        .arg(file);
    let shown = format!("{cmd:?}");
    let t = Instant::now();
    let mut child = cmd
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", fsx.display()));
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if t.elapsed() > FSX_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&out_path).unwrap_or_default();
    let daemon = m.log_text();
    let daemon_tail: Vec<&str> = daemon.lines().rev().take(20).collect();
    let daemon_tail: Vec<&str> = daemon_tail.into_iter().rev().collect();
    match status {
        Some(st) if st.success() => {
            println!(
                "fsx {label}: {NUMOPS} operations, seed {SEED}, passed in {:.1} s: {}",
                t.elapsed().as_secs_f64(),
                text.trim()
            );
        }
        other => {
            let what = match other {
                Some(st) => format!("failed ({st})"),
                None => format!("did not finish within {} s", FSX_TIMEOUT.as_secs()),
            };
            panic!(
                "fsx on {} {what} after {:.1} s\ncommand: {shown}\nartifacts: {}\n\
                 --- fsx output ---\n{}\n--- end of the daemon log ---\n{}",
                file.display(),
                t.elapsed().as_secs_f64(),
                artifacts.display(),
                excerpt(&text),
                daemon_tail.join("\n")
            );
        }
    }
}

/// Reads `path` with O_DIRECT: the daemon's answer, not the page cache.
fn read_direct(path: &Path) -> Vec<u8> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut buf = Aligned::new(1 << 20);
    let mut out = Vec::new();
    loop {
        let n = f
            .read(buf.as_mut())
            .unwrap_or_else(|e| panic!("{}: O_DIRECT read: {e}", path.display()));
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&buf.as_mut()[..n]);
    }
}

/// Regular files under `dir`, recursively (none if it does not exist).
fn empty_store_mount() -> Mount {
    Mount::new(|_| {}, &["--cache-size", "64M"])
}

#[test]
fn fsx_on_a_plain_file() {
    let m = empty_store_mount();
    let file = m.path("fsx.bin");
    run_fsx(&m, &file, "plain");
    // A plain file passes through: STORE holds what the mount shows.
    let shown = std::fs::read(&file).unwrap();
    let stored = std::fs::read(m.store.join("fsx.bin")).unwrap();
    assert!(
        shown == stored,
        "fsx.bin: the mount shows {} bytes, STORE/fsx.bin holds {} different bytes",
        shown.len(),
        stored.len()
    );
}

#[test]
fn fsx_on_a_safetensors_file_through_the_spool() {
    let m = empty_store_mount();
    let file = m.path("fsx.safetensors");
    run_fsx(&m, &file, "safetensors");
    // What fsx left, then the same bytes once the daemon has dealt with the
    // closed file in the background (its bytes are not a valid
    // safetensors file, so whether it ends up compressed is up to the
    // daemon; the content must not change either way).
    let before = std::fs::read(&file).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !m.spool_entries().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = m.spool_entries();
    println!(
        "after fsx: spool {}; STORE holds {:?}",
        if left.is_empty() {
            "empty".to_string()
        } else {
            format!("still holds {left:?} after 60 s")
        },
        std::fs::read_dir(&m.store)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect::<Vec<_>>()
    );
    let after = read_direct(&file);
    assert_eq!(before.len(), after.len(), "fsx.safetensors: size changed");
    assert!(
        before == after,
        "fsx.safetensors: bytes changed after the daemon processed the closed file"
    );
}
