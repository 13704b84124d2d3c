//! `ckptfs pack`: `.safetensors` to `.zstn`, one file or a whole tree.

use super::{progress, Global, Result};
use crate::cli::{BlzFormat, PackArgs};
use crate::fsutil::write_atomic;
use crate::pack::{pack, PackOptions, PackStats};
use anyhow::Context as _;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// `X.safetensors` -> `X.zstn`; anything else gets `.zstn` appended.
pub fn default_output(input: &Path) -> PathBuf {
    let s = input.to_string_lossy();
    match s.strip_suffix(".safetensors") {
        Some(base) => PathBuf::from(format!("{base}.zstn")),
        None => PathBuf::from(format!("{s}.zstn")),
    }
}

fn map(path: &Path) -> Result<Option<memmap2::Mmap>> {
    let f = fs::File::open(path).with_context(|| path.display().to_string())?;
    if f.metadata()
        .with_context(|| path.display().to_string())?
        .len()
        == 0
    {
        return Ok(None);
    }
    // SAFETY: read-only private map; the input must not change while packing
    // (a concurrent writer could make the output inconsistent, which the
    // checksums written from the same bytes would not catch).
    Ok(Some(
        unsafe { memmap2::Mmap::map(&f) }.with_context(|| path.display().to_string())?,
    ))
}

/// Packs one file atomically. The input is validated before the output is
/// created.
pub fn pack_file(
    g: Global,
    input: &Path,
    output: &Path,
    opts: PackOptions,
    force: bool,
) -> Result<PackStats> {
    let m = map(input)?;
    let mut bytes: &[u8] = m.as_deref().unwrap_or(&[]);
    // A .zstn is repacked (e.g. `--compat z4ai` and back): decoded in
    // memory, every block checked against its digests, then packed.
    let decoded;
    if bytes.starts_with(b"ZSTN") {
        let a = crate::archive::ZstnArchive::open(input)
            .with_context(|| input.display().to_string())?;
        let mut v = Vec::new();
        super::unpack_to(&a, &mut v).with_context(|| input.display().to_string())?;
        decoded = v;
        bytes = &decoded;
    }
    // Validate first so that nothing is written for a malformed input.
    crate::format::safetensors::split_file(bytes).with_context(|| input.display().to_string())?;
    let pb = progress(g, bytes.len() as u64, "pack");
    let mut stats = None;
    write_atomic(output, force, |w| {
        let s = pack(bytes, w as &mut dyn Write, opts, &|n| pb.inc(n))
            .map_err(std::io::Error::other)?;
        stats = Some(s);
        Ok(())
    })
    .with_context(|| output.display().to_string())?;
    pb.finish_and_clear();
    Ok(stats.expect("set on success"))
}

fn report(input: &Path, output: &Path, s: &PackStats, secs: f64) {
    eprintln!(
        "{} -> {}: {} ({} unique), {} -> {} bytes, ratio {:.4}, {:.0} MB/s",
        input.display(),
        super::s3::shown(output),
        super::plural(s.tensors, "tensor", "tensors"),
        s.unique,
        s.raw_bytes,
        s.stored_bytes,
        s.raw_bytes as f64 / s.stored_bytes.max(1) as f64,
        s.raw_bytes as f64 / 1e6 / secs.max(1e-9)
    );
}

pub fn run(g: Global, a: PackArgs) -> Result<ExitCode> {
    let opts = PackOptions {
        level: a.level,
        compat: a.compat.into(),
    };
    if let Some(base) = &a.base {
        super::delta::pack_against(g, &a.input, base, a.output.as_deref(), opts, a.force)?;
        return Ok(ExitCode::SUCCESS);
    }
    if a.standalone {
        super::delta::standalone(g, &a.input, a.output.as_deref(), opts, a.force)?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(out) = a
        .output
        .as_ref()
        .filter(|o| o.to_string_lossy().ends_with(".blz"))
    {
        if a.recursive {
            anyhow::bail!("-r packs into a store directory; an output ending in .blz is one archive (drop -r)");
        }
        if a.format == BlzFormat::Blazex {
            if a.raw {
                anyhow::bail!("--raw is for ckptfs's .blz (BLAZE-X archives are always raw)");
            }
            return super::blazex::pack(g, &a.input, out, a.force).map(|()| ExitCode::SUCCESS);
        }
        super::blz::pack(g, &a.input, out, a.raw, a.level, a.force)?;
        return Ok(ExitCode::SUCCESS);
    }
    if a.raw {
        anyhow::bail!("--raw applies to .blz archives only (-o NAME.blz)");
    }
    if a.format == BlzFormat::Blazex {
        anyhow::bail!("--format blazex writes a .blz archive (-o NAME.blz)");
    }
    if a.recursive {
        let out = a.output.clone().context("pack -r needs -o STORE_DIR")?;
        let t = Instant::now();
        let (raw, stored) = pack_tree(g, &a.input, &out, opts, a.force)?;
        eprintln!(
            "{} -> {}: {} -> {} bytes, ratio {:.4}, {:.1} s",
            a.input.display(),
            super::s3::shown(&out),
            raw,
            stored,
            raw as f64 / stored.max(1) as f64,
            t.elapsed().as_secs_f64()
        );
        return Ok(ExitCode::SUCCESS);
    }
    if a.input.is_dir() {
        return Err(anyhow::anyhow!(
            "{}: is a directory (use -r to pack a tree)",
            a.input.display()
        ));
    }
    let out = a.output.clone().unwrap_or_else(|| default_output(&a.input));
    let t = Instant::now();
    let s = pack_file(g, &a.input, &out, opts, a.force)?;
    if !g.quiet {
        report(&a.input, &out, &s, t.elapsed().as_secs_f64());
    }
    Ok(ExitCode::SUCCESS)
}

/// Packs a model directory into a store directory. Returns (raw, stored) bytes.
pub fn pack_tree(
    g: Global,
    src: &Path,
    dst: &Path,
    opts: PackOptions,
    force: bool,
) -> Result<(u64, u64)> {
    // metadata, not is_dir: a missing SRC must say so.
    let m = fs::metadata(src).with_context(|| src.display().to_string())?;
    if !m.is_dir() {
        return Err(anyhow::anyhow!(
            "{}: not a directory (-r packs a model directory)",
            src.display()
        ));
    }
    let (mut raw, mut stored) = (0u64, 0u64);
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let sdir = src.join(&rel);
        let ddir = dst.join(&rel);
        fs::create_dir_all(&ddir).with_context(|| ddir.display().to_string())?;
        let mut entries: Vec<_> = fs::read_dir(&sdir)
            .with_context(|| sdir.display().to_string())?
            .collect::<std::io::Result<_>>()
            .with_context(|| sdir.display().to_string())?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name();
            let rel_path = rel.join(&name);
            let sp = src.join(&rel_path);
            let ft = e.file_type().with_context(|| sp.display().to_string())?;
            if ft.is_dir() {
                stack.push(rel_path);
            } else if ft.is_symlink() {
                let target = fs::read_link(&sp).with_context(|| sp.display().to_string())?;
                let dp = dst.join(&rel_path);
                if force {
                    let _ = fs::remove_file(&dp);
                }
                std::os::unix::fs::symlink(&target, &dp)
                    .with_context(|| dp.display().to_string())?;
            } else if name.to_string_lossy().ends_with(".safetensors") {
                let dp = default_output(&dst.join(&rel_path));
                let t = Instant::now();
                let s = pack_file(g, &sp, &dp, opts, force)?;
                if !g.quiet {
                    report(&sp, &dp, &s, t.elapsed().as_secs_f64());
                }
                raw += s.raw_bytes;
                stored += s.stored_bytes;
            } else {
                let dp = dst.join(&rel_path);
                let n = copy_atomic(&sp, &dp, force)?;
                raw += n;
                stored += n;
            }
        }
    }
    crate::fsutil::sync_dir(dst).with_context(|| dst.display().to_string())?;
    Ok((raw, stored))
}

fn copy_atomic(src: &Path, dst: &Path, force: bool) -> Result<u64> {
    let mut n = 0;
    write_atomic(dst, force, |w| {
        let mut f = fs::File::open(src)?;
        n = std::io::copy(&mut f, w)?;
        Ok(())
    })
    .with_context(|| dst.display().to_string())?;
    if let Ok(m) = fs::metadata(src) {
        let _ = fs::set_permissions(dst, m.permissions());
    }
    Ok(n)
}
