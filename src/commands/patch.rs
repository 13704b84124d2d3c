//! `ckptfs diff` and `ckptfs apply`: BLAZE-X `.blzdiff` patches between
//! BLAZE-X `.blz` archives (`pack::blzdiff` does the work).

use super::{Global, Result};
use crate::archive::BlazexArchive;
use crate::cli::{ApplyArgs, DiffArgs};
use anyhow::Context as _;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

fn open(path: &Path) -> Result<BlazexArchive> {
    Ok(BlazexArchive::open(path)?)
}

pub fn diff(g: Global, a: DiffArgs) -> Result<ExitCode> {
    let t = Instant::now();
    let base = open(&a.base)?;
    let target = open(&a.target)?;
    let s = crate::pack::blzdiff::diff(&base, &target, &a.output, a.force)?;
    let secs = t.elapsed().as_secs_f64();
    if !g.quiet {
        eprintln!(
            "{} -> {}: {} unchanged, {} modified, {} added, {} removed; patch {} bytes, {:.1}% of the full model ({} bytes); {:.0} MB/s",
            a.base.display(),
            a.target.display(),
            s.unchanged,
            s.modified,
            s.added,
            s.removed,
            s.patch_bytes,
            100.0 * s.patch_bytes as f64 / s.target_data_bytes.max(1) as f64,
            s.target_data_bytes,
            s.target_data_bytes as f64 / 1e6 / secs.max(1e-9)
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub fn apply(g: Global, a: ApplyArgs) -> Result<ExitCode> {
    let t = Instant::now();
    let base = open(&a.base)?;
    let f = std::fs::File::open(&a.patch).with_context(|| a.patch.display().to_string())?;
    // SAFETY: read-only private map of a file we only read.
    let map = unsafe { memmap2::Mmap::map(&f) }.with_context(|| a.patch.display().to_string())?;
    let s = crate::pack::blzdiff::apply(&base, &a.patch, &map, &a.output, a.force)?;
    if !g.quiet {
        let secs = t.elapsed().as_secs_f64();
        eprintln!(
            "{} + {} -> {}: {} tensors from the base, {} from the patch, {} bytes, {:.0} MB/s",
            a.base.display(),
            a.patch.display(),
            a.output.display(),
            s.from_base,
            s.from_patch,
            s.output_bytes,
            s.output_bytes as f64 / 1e6 / secs.max(1e-9)
        );
    }
    Ok(ExitCode::SUCCESS)
}
