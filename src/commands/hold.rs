//! `ckptfs hold STORE -- COMMAND...`: runs COMMAND while the daemon of
//! STORE commits nothing into STORE (see `crate::fs::hold`), for a backup
//! of a live store. Waits for a commit in progress first (`--timeout` gives
//! up), then runs COMMAND and exits with its exit code.

use super::{Global, Result};
use crate::cli::HoldArgs;
use crate::fs::hold;
use anyhow::{bail, Context as _};
use std::process::ExitCode;
use std::time::{Duration, Instant};

pub fn run(g: Global, a: HoldArgs) -> Result<ExitCode> {
    let store = a.store.display().to_string();
    if !a.store.is_dir() {
        bail!("{store}: not a directory");
    }
    let dir = hold::open_dir(&a.store).with_context(|| store.clone())?;
    let deadline = a
        .timeout
        .map(|t| Instant::now() + Duration::from_secs_f64(t.max(0.0)));
    let mut said = false;
    let _held = loop {
        if let Some(l) = hold::lock(&dir, hold::Mode::Exclusive, deadline.is_none(), || {
            if !g.quiet {
                eprintln!("{store}: waiting for the commit in progress");
            }
        })
        .with_context(|| format!("{store}: cannot lock"))?
        {
            break l;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            bail!("{store}: a commit is still in progress after the timeout; nothing was run");
        }
        if !said && !g.quiet {
            eprintln!("{store}: waiting for the commit in progress");
            said = true;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (cmd, args) = a.command.split_first().expect("clap requires a command");
    let status = std::process::Command::new(cmd)
        .args(args)
        .status()
        .with_context(|| format!("cannot run {}", cmd.to_string_lossy()))?;
    Ok(match status.code() {
        Some(c) => ExitCode::from(c.clamp(0, 255) as u8),
        // Killed by a signal: what a shell reports, 128 + the signal.
        None => {
            use std::os::unix::process::ExitStatusExt;
            ExitCode::from((128 + status.signal().unwrap_or(0)).clamp(0, 255) as u8)
        }
    })
}
