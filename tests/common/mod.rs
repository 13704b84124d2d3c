//! The toolkit every integration test shares (`mod common;`): running the
//! built binary, one deterministic generator, the committed test vectors,
//! generated inputs (`fixtures`) and real mounts (`mount`).
//!
//! Each integration test is a crate of its own and compiles this module
//! again, using only part of it: hence `allow(dead_code)` here, for the whole
//! module, rather than in every test file (and `allow(unused_imports)` on
//! the re-exports below, for the same reason).
#![allow(dead_code)]

mod fixtures;
mod mount;
pub mod s3;
// The same file as the library's `test_support` (unit tests use it too).
#[path = "support.rs"]
mod test_support;

#[allow(unused_imports)]
pub use fixtures::*;
#[allow(unused_imports)]
pub use mount::{spool_entries, Aligned, Mount};
pub use test_support::{vector_stems, vectors_dir};
#[allow(unused_imports)]
pub use test_support::{z4ai_opaque_frame, zstd_rle_frame, zstn_of_frames, zstn_with_header};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The ckptfs binary cargo built for this test run.
/// The Python of the test venv (`CKPTFS_VENV`, default `.venv` of the
/// checkout) that scripts/setup-test-env.sh builds: z4ai 0.2.0,
/// safetensors, numpy.
pub fn venv_python() -> std::path::PathBuf {
    let venv = std::env::var_os("CKPTFS_VENV")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv"));
    let py = venv.join("bin/python");
    assert!(
        py.exists(),
        "{} is missing: run scripts/setup-test-env.sh first",
        py.display()
    );
    py
}

/// Flips every byte of `bytes` in turn (xor 0x10) and asserts that
/// `detects` reports each damaged copy (`what` names the file in failures).
pub fn assert_every_flip_detected(what: &str, bytes: &[u8], detects: impl Fn(Vec<u8>) -> bool) {
    for at in 0..bytes.len() {
        let mut b = bytes.to_vec();
        b[at] ^= 0x10;
        assert!(
            detects(b),
            "{what}: flip at {at} of {} went unnoticed",
            bytes.len()
        );
    }
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_ckptfs")
}

/// Runs ckptfs with `args` to completion and returns what it printed.
pub fn ckptfs(args: &[&str]) -> Output {
    Command::new(bin()).args(args).output().expect("run ckptfs")
}

/// Runs ckptfs with an address-space limit, so that an attempt to allocate
/// from a lying length field fails loudly instead of succeeding lazily.
pub fn ckptfs_limited(args: &[&str], limit_bytes: u64) -> Output {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new(bin());
    c.args(args).env("RUST_BACKTRACE", "0");
    // SAFETY: setrlimit is async-signal-safe and touches only this child.
    unsafe {
        c.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: limit_bytes,
                rlim_max: limit_bytes,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    c.output().expect("run ckptfs")
}

/// Packs `src` into `dst` with `ckptfs pack --force`.
pub fn pack(src: &Path, dst: &Path) {
    let out = Command::new(bin())
        .arg("pack")
        .arg(src)
        .arg("-o")
        .arg(dst)
        .arg("--force")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pack {}: {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// (name, original .safetensors, .zstn) for every ZSTN vector in the manifest.
pub fn zstn_vectors() -> Vec<(String, PathBuf, PathBuf)> {
    let dir = vectors_dir();
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let mut v = Vec::new();
    for vec in m["vectors"].as_array().unwrap() {
        if vec["kind"] == "zstn" {
            let name = vec["name"].as_str().unwrap().to_string();
            v.push((
                name.clone(),
                dir.join(format!("{name}.safetensors")),
                dir.join(format!("{name}.zstn")),
            ));
        }
    }
    assert!(v.len() >= 16, "manifest lists {} zstn vectors", v.len());
    v
}

/// A small deterministic PRNG (xorshift64*), the only one the tests use.
/// Golden digests (tests/golden.rs, tests/blz.rs) are recorded from its
/// stream: changing it changes them. A seed must not be 0.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    /// A standard normal sample (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = (self.next() >> 11) as f64 / (1u64 << 53) as f64 + 1e-300;
        let u2 = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// Runs the Python script `tests/NAME` in the test venv with `args`, which
/// must succeed, and returns its stdout.
pub fn run_test_script(name: &str, args: &[&str]) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(name);
    let out = std::process::Command::new(venv_python())
        .arg(path)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{name}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `tests/blazex_tool.py CMD PATHS ARGS` in the test venv, which must
/// succeed: the independent BLAZE-X writer and reader (pack, export,
/// patch), written from the layout alone.
pub fn blazex_tool(cmd: &str, paths: &[&Path], args: &[&str]) -> Output {
    let tool = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/blazex_tool.py");
    let out = Command::new(venv_python())
        .arg(tool)
        .arg(cmd)
        .args(paths)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "blazex_tool.py {cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs the generator `tests/NAME` (a Python script in the test venv) with
/// `dir` as its output directory; it must succeed.
pub fn run_generator(name: &str, dir: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(name);
    let st = Command::new(venv_python())
        .arg(script)
        .arg(dir)
        .status()
        .unwrap();
    assert!(st.success(), "the generator failed");
}

/// A tool that `scripts/setup-test-env.sh` installs into `.tools/bin`.
pub fn installed_tool(name: &str) -> PathBuf {
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

/// The names in directory `dir`, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

/// Every regular file under `dir` but the spool, with its identity, size
/// and mtime: (inode, length, mtime, mtime_nsec).
pub fn stamps(dir: &Path) -> std::collections::HashMap<PathBuf, (u64, u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = std::collections::HashMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.file_name().is_some_and(|n| n == ".ckptfs-spool") {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                stack.push(p);
            } else {
                out.insert(p, (m.ino(), m.len(), m.mtime(), m.mtime_nsec()));
            }
        }
    }
    out
}

/// `ckptfs verify STORE`, which must succeed; returns what it printed.
pub fn verify_ok(store: &Path) -> String {
    let o = ckptfs(&["verify", store.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "verify STORE failed:\n{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// uid and gid of `nobody`, the unprivileged user of the permission tests.
pub const NOBODY: u32 = 65534;

/// Runs a Python program as uid/gid `NOBODY` with no supplementary groups.
pub fn run_as_nobody(program: &str, args: &[&Path]) -> String {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(program).args(args);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(NOBODY, NOBODY, NOBODY) != 0
                || libc::setresuid(NOBODY, NOBODY, NOBODY) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().expect("run python3 as nobody");
    assert!(
        out.status.success(),
        "helper failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Attribute `name` of `p` as text (up to 4 KiB), None when it has none.
pub fn getxattr(p: &Path, name: &str) -> Option<String> {
    let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str())).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: NUL-terminated path and name; `buf` writable for its length.
    let r = unsafe {
        libc::getxattr(
            c.as_ptr(),
            n.as_ptr(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
        )
    };
    (r >= 0).then(|| String::from_utf8_lossy(&buf[..r as usize]).into_owned())
}

/// The daemon's integer counters (`user.ckptfs.stats` on the mount's
/// root), by name; `decode_seconds`, not an integer, is left out.
pub fn daemon_stats(mnt: &Path) -> std::collections::HashMap<String, u64> {
    let text = getxattr(mnt, "user.ckptfs.stats").expect("user.ckptfs.stats");
    text.split_whitespace()
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}
