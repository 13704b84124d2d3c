//! Real-mount test: pjdfstest (crates.io `pjdfstest`, the POSIX file system
//! test suite) on a directory inside a writable mount. It prints a table of
//! passed, failed and skipped tests per group, and fails unless every entry
//! of `tests/pjdfstest-expected-pass.txt` fully passes.
//!
//! Needs root (pjdfstest switches to the users `nobody` and `daemon`, so
//! the mount has `--allow-other`), /dev/fuse, and `.tools/bin/pjdfstest`
//! (`bash scripts/setup-test-env.sh` installs it).

use crate::common;

use common::{installed_tool, Mount};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A run that takes longer than this is killed and fails (a full run takes
/// about 5 s on ext4).
const TIMEOUT: Duration = Duration::from_secs(270);

/// pjdfstest's configuration. Features are the Linux ones (`-l` lists
/// them all; chflags, NFSv4 ACLs and st_birthtime are FreeBSD's). naptime
/// (the pause before checking that a timestamp changed) is above the
/// kernel's coarse timestamp tick: 0.001 fails `*::changed_time_fields_success`
/// even on ext4. Remount (EROFS) tests stay off.
const CONFIG: &str = r#"
[features]
utimensat = {}
utime_now = {}
posix_fallocate = {}
rename_ctime = {}

[settings]
naptime = 0.05
allow_remount = false

[dummy_auth]
entries = [["nobody", "nogroup"], ["daemon", "daemon"]]
"#;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Ok,
    Failed,
    Skipped,
}

#[derive(Debug)]
struct TestResult {
    name: String,
    outcome: Outcome,
    /// The first lines pjdfstest printed under a failure.
    message: Vec<String>,
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC [ params final-byte
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Parses pjdfstest's output: one line per test, `NAME <spaces> STATUS`,
/// where a failure is followed by tab-indented lines saying why.
fn parse(output: &str) -> Vec<TestResult> {
    const STATUSES: [(&str, Outcome); 5] = [
        ("PASSED UNEXPECTEDLY", Outcome::Failed),
        ("failed as expected", Outcome::Ok),
        ("FAILED", Outcome::Failed),
        ("skipped", Outcome::Skipped),
        ("ok", Outcome::Ok),
    ];
    let mut results: Vec<TestResult> = Vec::new();
    let mut in_message = false;
    for raw in output.lines() {
        let line = strip_ansi(raw);
        let line = line.trim_end();
        let name = line.split_whitespace().next().unwrap_or("");
        let status = STATUSES.iter().find(|(s, _)| {
            line.strip_suffix(s)
                .is_some_and(|rest| rest.ends_with(' ') && rest.trim() == name)
        });
        match status {
            Some(&(_, outcome)) if name.contains("::") => {
                in_message = outcome == Outcome::Failed;
                results.push(TestResult {
                    name: name.to_string(),
                    outcome,
                    message: Vec::new(),
                });
            }
            _ => {
                if line.starts_with("Backtrace:") || line.is_empty() {
                    in_message = false;
                }
                if in_message {
                    let r = results.last_mut().unwrap();
                    if r.message.len() < 4 {
                        r.message.push(line.trim().to_string());
                    }
                }
            }
        }
    }
    results
}

fn group(name: &str) -> &str {
    name.split("::").next().unwrap_or(name)
}

/// True when `entry` (a group, a `::` prefix or a whole name) covers `name`.
fn covers(entry: &str, name: &str) -> bool {
    name == entry
        || name
            .strip_prefix(entry)
            .is_some_and(|rest| rest.starts_with("::"))
}

fn expected_entries() -> Vec<String> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pjdfstest-expected-pass.txt");
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .lines()
        .map(|l| l.split('#').next().unwrap().trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
}

/// Runs pjdfstest in `dir`, with `secondary` (another file system) for the
/// EXDEV tests; returns its output.
fn run_pjdfstest(dir: &Path, secondary: &Path, scratch: &Path) -> String {
    let pjdfstest = installed_tool("pjdfstest");
    let config = scratch.join("pjdfstest.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let out_path = scratch.join("pjdfstest-output.txt");
    let out = std::fs::File::create(&out_path).unwrap();
    let mut cmd = Command::new(&pjdfstest);
    cmd.arg("-c")
        .arg(&config)
        .arg("-p")
        .arg(dir)
        .arg("-s")
        .arg(secondary);
    let shown = format!("{cmd:?}");
    println!("running {shown}");
    let t = Instant::now();
    let mut child = cmd
        .env("NO_COLOR", "1")
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", pjdfstest.display()));
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if t.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            let text = std::fs::read_to_string(&out_path).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!(
                "{shown} did not finish within {} s; last output:\n{}",
                TIMEOUT.as_secs(),
                tail.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("pjdfstest ran in {:.1} s", t.elapsed().as_secs_f64());
    std::fs::read_to_string(&out_path).unwrap()
}

#[test]
fn pjdfstest_expected_groups_pass() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "pjdfstest needs root (it switches users and creates device nodes)"
    );
    let m = Mount::new(|_| {}, &["--allow-other"]);
    // The users pjdfstest switches to must reach the mountpoint.
    chmod(m.dir.path(), 0o755);
    let dir = m.path("pjdfstest");
    std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    chmod(&dir, 0o755);
    let secondary = m.dir.path().join("secondary-fs");
    std::fs::create_dir(&secondary).unwrap();
    chmod(&secondary, 0o755);

    let output = run_pjdfstest(&dir, &secondary, m.dir.path());
    let summary = output
        .lines()
        .map(strip_ansi)
        .find(|l| l.starts_with("Summary:"))
        .unwrap_or_else(|| panic!("pjdfstest did not finish (no Summary line); output:\n{output}"));
    let results = parse(&output);
    assert!(!results.is_empty(), "no test results in:\n{output}");

    // Per group: ok, failed, skipped.
    let mut groups: BTreeMap<&str, [usize; 3]> = BTreeMap::new();
    for r in &results {
        let g = groups.entry(group(&r.name)).or_default();
        g[match r.outcome {
            Outcome::Ok => 0,
            Outcome::Failed => 1,
            Outcome::Skipped => 2,
        }] += 1;
    }
    let expected = expected_entries();
    println!("\n{summary}\n");
    println!("| group | ok | failed | skipped | in expected-pass |");
    println!("| --- | --- | --- | --- | --- |");
    for (g, [ok, failed, skipped]) in &groups {
        let listed = if expected.iter().any(|e| e == g) {
            "yes"
        } else if expected.iter().any(|e| covers(g, e)) {
            "partly"
        } else {
            ""
        };
        println!("| {g} | {ok} | {failed} | {skipped} | {listed} |");
    }
    let failed: Vec<&TestResult> = results
        .iter()
        .filter(|r| r.outcome == Outcome::Failed)
        .collect();
    if !failed.is_empty() {
        println!("\nfailed tests:");
        for r in &failed {
            println!("  {}: {}", r.name, r.message.join(" / "));
        }
    }

    let mut problems = Vec::new();
    for e in &expected {
        let covered: Vec<&TestResult> = results.iter().filter(|r| covers(e, &r.name)).collect();
        let bad: Vec<&str> = covered
            .iter()
            .filter(|r| r.outcome == Outcome::Failed)
            .map(|r| r.name.as_str())
            .collect();
        if covered.iter().all(|r| r.outcome != Outcome::Ok) {
            problems.push(format!("{e}: no test of it passed ({} ran)", covered.len()));
        } else if !bad.is_empty() {
            problems.push(format!("{e}: {} failed: {}", bad.len(), bad.join(", ")));
        }
    }
    assert!(
        problems.is_empty(),
        "pjdfstest: entries of tests/pjdfstest-expected-pass.txt do not fully pass:\n  {}",
        problems.join("\n  ")
    );
}
