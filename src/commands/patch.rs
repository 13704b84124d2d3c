//! `ckptfs diff` and `ckptfs apply`: BLAZE-X `.blzdiff` patches between
//! BLAZE-X `.blz` archives (`pack::blzdiff` does the work).
//!
//! Either side may also be a plain model directory or a ckptfs `.blz`:
//! it is first turned into a BLAZE-X archive (a ckptfs `.blz` unpacked,
//! then packed as `pack --format blazex` does) in a temporary directory
//! beside the output, removed afterwards. The patch is the same as between
//! the BLAZE-X archives of both sides, except that a ckptfs `.blz` target
//! (or `--encodings ckptfs`) lets blobs use ckptfs's codec where smaller.

use super::{Global, Result};
use crate::archive::{BlazexArchive, Kind};
use crate::cli::{ApplyArgs, DiffArgs, PatchEncodings};
use crate::pack::blxd::Encodings;
use anyhow::Context as _;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

/// `path` as a BLAZE-X archive: itself, or (a directory, a ckptfs `.blz`)
/// converted into `tmp`; with the kind of archive `path` is (None for a
/// directory).
fn open(path: &Path, tmp: &tempfile::TempDir) -> Result<(BlazexArchive, Option<Kind>)> {
    let converted = tmp
        .path()
        .join(format!("{}.blz", tmp.path().read_dir()?.count()));
    if path.is_dir() {
        crate::pack::pack_blazex(path, &converted, false, &|_| {})?;
        return Ok((BlazexArchive::open(&converted)?, None));
    }
    let a = crate::archive::open(path)?;
    if a.kind() == Kind::Blazex {
        return Ok((BlazexArchive::open(path)?, Some(Kind::Blazex)));
    }
    if a.files() == 1 && a.file_path(0).is_empty() {
        anyhow::bail!(
            "{}: a single-file archive; diff and apply take BLAZE-X or ckptfs .blz archives or model directories",
            path.display()
        );
    }
    let dir = tmp
        .path()
        .join(format!("{}.d", tmp.path().read_dir()?.count()));
    for i in 0..a.files() {
        let p = dir.join(a.file_path(i));
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).with_context(|| d.display().to_string())?;
        }
        let mut w = std::io::BufWriter::new(
            std::fs::File::create(&p).with_context(|| p.display().to_string())?,
        );
        crate::archive::write_to(&*a, i, &mut w, &|_| {})?;
        std::io::Write::flush(&mut w)?;
    }
    crate::pack::pack_blazex(&dir, &converted, false, &|_| {})?;
    Ok((BlazexArchive::open(&converted)?, Some(a.kind())))
}

fn scratch(output: &Path) -> Result<tempfile::TempDir> {
    let parent = crate::fsutil::parent_dir(output);
    tempfile::Builder::new()
        .prefix(".ckptfs-patch-")
        .tempdir_in(&parent)
        .with_context(|| parent.display().to_string())
}

pub fn diff(g: Global, a: DiffArgs) -> Result<ExitCode> {
    let t = Instant::now();
    let tmp = scratch(&a.output)?;
    let (base, _) = open(&a.base, &tmp)?;
    let (target, target_kind) = open(&a.target, &tmp)?;
    let allowed = match a.encodings {
        PatchEncodings::Open => Encodings::Open,
        PatchEncodings::Ckptfs => Encodings::Ckptfs,
        PatchEncodings::Auto if target_kind == Some(crate::archive::Kind::Blz) => Encodings::Ckptfs,
        PatchEncodings::Auto => Encodings::Open,
    };
    let s = crate::pack::blzdiff::diff(&base, &target, &a.output, a.force, allowed)?;
    let secs = t.elapsed().as_secs_f64();
    if !g.quiet {
        eprintln!(
            "{} -> {}: {} unchanged, {} modified, {} added, {} removed; patch {} bytes, {:.1}% of the full model ({} bytes), {}; {:.0} MB/s",
            a.base.display(),
            a.target.display(),
            s.unchanged,
            s.modified,
            s.added,
            s.removed,
            s.patch_bytes,
            100.0 * s.patch_bytes as f64 / s.target_data_bytes.max(1) as f64,
            s.target_data_bytes,
            match allowed {
                Encodings::Open => "open encodings (blazex applies it)",
                Encodings::Ckptfs => "with ckptfs encodings (ckptfs applies it; --encodings open for blazex)",
            },
            s.target_data_bytes as f64 / 1e6 / secs.max(1e-9)
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub fn apply(g: Global, a: ApplyArgs) -> Result<ExitCode> {
    let t = Instant::now();
    let tmp = scratch(&a.output)?;
    let (base, _) = open(&a.base, &tmp)?;
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
