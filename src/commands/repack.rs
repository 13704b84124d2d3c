//! `ckptfs repack STORE [--dry-run]`: converts an unmounted store to the
//! layout `mount --delta auto` keeps (doc/SEMANTICS.md, "Checkpoint
//! families"), with the daemon's own policy code (`crate::fs::repack`).
//! This is the command around it: the store's writer lock (a writable
//! mount and a repack never run together), the plan, the progress and the
//! summary, whose `FAMILY` lines are `verify STORE`'s.

use super::daemon_state::WriterLock;
use super::{plural, Global, Result};
use crate::cli::RepackArgs;
use crate::fs::repack::{Plan, Step};
use crate::fs::{CheckpointFs, FsConfig};
use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::HashMap;
use std::io::IsTerminal;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Archives by path: (identity, size).
type Archives = HashMap<PathBuf, ((u64, u64), u64)>;

/// Every archive of the store `root` (canonical): its identity and size.
fn archives(root: &Path) -> Result<Archives> {
    super::delta::store_archives(root)?
        .into_iter()
        .map(|p| {
            let m = std::fs::symlink_metadata(&p).with_context(|| p.display().to_string())?;
            Ok((p, ((m.dev(), m.ino()), m.len())))
        })
        .collect()
}

/// Files written through a mount and not yet committed (`ID.data` in the
/// spool): a repack would work on the versions they replace.
fn staged(root: &Path) -> usize {
    std::fs::read_dir(root.join(crate::fs::spool::SPOOL_DIR))
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".data"))
                .count()
        })
        .unwrap_or(0)
}

/// A bar counting steps, shown only on a terminal.
fn step_bar(g: Global, steps: usize) -> ProgressBar {
    if g.quiet || !std::io::stderr().is_terminal() || steps == 0 {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(steps as u64);
    pb.set_style(
        ProgressStyle::with_template("repack [{bar:30}] {pos}/{len} steps, {elapsed} {msg}")
            .expect("static template")
            .progress_chars("=> "),
    );
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

fn shown(p: &Path) -> String {
    p.display().to_string()
}

/// One line per family (oldest first, with each checkpoint's backing and
/// its base), then the steps.
fn print_plan(fs: &CheckpointFs, plan: &Plan) {
    for f in &plan.families {
        let l = fs.family_layout(f);
        println!(
            "family of {}: {}, oldest first",
            shown(&f.members[0]),
            plural(f.members.len(), "checkpoint", "checkpoints")
        );
        for (_, b, base) in &l.members {
            match base {
                Some(base) => println!("  {}  delta against {}", shown(b), shown(base)),
                None => println!("  {}  standalone", shown(b)),
            }
        }
    }
    for (i, s) in plan.steps.iter().enumerate() {
        match s {
            Step::Standalone { delta, why } => {
                println!("step {}: {} made standalone: {why}", i + 1, shown(delta))
            }
            Step::Settle { family, index } => println!(
                "step {}: the commit of {} replayed: its most alike older standalone \
                 checkpoint becomes a delta against it (or stays a keyframe, or standalone)",
                i + 1,
                shown(&plan.families[*family].members[*index])
            ),
        }
    }
}

pub fn run(g: Global, a: RepackArgs) -> Result<ExitCode> {
    let t0 = Instant::now();
    let name = a.store.display().to_string();
    let m = std::fs::metadata(&a.store).with_context(|| name.clone())?;
    if !m.is_dir() {
        anyhow::bail!("{name}: not a directory (repack rewrites a store directory)");
    }
    let root = a.store.canonicalize().with_context(|| name.clone())?;
    // Warnings of the rewrites (and the test hooks) on stderr.
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format_timestamp(None)
        .try_init();
    let _lock = WriterLock::acquire_for_repack(&root)?;
    let n = staged(&root);
    if n > 0 {
        anyhow::bail!(
            "{name}: {} through a mount and not committed yet (in {}); \
             mount the store once to commit them, then repack",
            plural(n, "file written", "files written"),
            crate::fs::spool::SPOOL_DIR
        );
    }
    let fs = CheckpointFs::new(FsConfig {
        store: root.clone(),
        cache_bytes: 64 << 20,
        ttl: Duration::from_secs(1),
        read_only: a.dry_run,
        require_checksums: false,
        allow_other: false,
    })
    .with_context(|| name.clone())?;
    let fs = match a.family_depth {
        Some(d) => fs.with_family_depth(d),
        None => fs,
    };
    let plan = fs.repack_plan();
    let members: usize = plan.families.iter().map(|f| f.members.len()).sum();
    if a.dry_run {
        print_plan(&fs, &plan);
        println!(
            "{name}: {} ({members} checkpoints), {}; dry run, nothing changed",
            plural(plan.families.len(), "family", "families"),
            plural(plan.steps.len(), "step", "steps")
        );
        return Ok(ExitCode::SUCCESS);
    }
    let before = archives(&root)?;
    let pb = step_bar(g, plan.steps.len());
    let r = fs.repack_run(&plan, &mut |i, file, line| match line {
        None => {
            pb.set_position(i as u64);
            pb.set_message(shown(file));
        }
        Some(line) => {
            pb.set_position(i as u64 + 1);
            pb.suspend(|| println!("{line}"));
        }
    });
    pb.finish_and_clear();
    if let Err(e) = r {
        anyhow::bail!(
            "{name}: repack stopped: {}; every file is exact, run it again to finish",
            super::one_line(&e)
        );
    }
    let after = archives(&root)?;
    let written = after
        .iter()
        .filter(|(p, v)| before.get(*p).is_none_or(|b| b.0 != v.0))
        .count();
    let removed = before.keys().filter(|p| !after.contains_key(*p)).count();
    let size = |m: &Archives| m.values().map(|v| v.1).sum::<u64>();
    let (b, z) = (size(&before), size(&after));
    let secs = t0.elapsed().as_secs_f64();
    if written == 0 && removed == 0 {
        println!(
            "{name}: nothing to do: {} ({members} checkpoints) already as --delta auto keeps them ({secs:.1} s)",
            plural(plan.families.len(), "family", "families"),
        );
    } else {
        println!(
            "{name}: repacked in {secs:.1} s: {} new or rewritten, {} removed; archives {b} -> {z} bytes ({:+.1}%)",
            plural(written, "file", "files"),
            plural(removed, "file", "files"),
            (z as f64 - b as f64) * 100.0 / b.max(1) as f64
        );
    }
    for f in &plan.families {
        let l = fs.family_layout(f);
        let standalone = l.members.len() - l.deltas();
        println!(
            "family of {}: {}: {standalone} standalone, {}",
            shown(&f.members[0]),
            plural(f.members.len(), "checkpoint", "checkpoints"),
            plural(l.deltas(), "delta", "deltas"),
        );
    }
    for line in super::delta::family_lines(&root)? {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}
