//! `ckptfs unpack`: restore the original file, byte for byte, atomically.

use super::{open_input, progress, Global, Input, Result};
use crate::archive::{write_frame, write_to, ArchiveView};
use crate::cli::UnpackArgs;
use crate::format::frame::Frame;
use crate::fsutil::write_atomic;
use anyhow::Context as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Default output name: strip `.zstn` (or a delta's `.z4dm`), add `.safetensors` unless present;
/// for a bare frame strip `.z4ai` (else append `.out`, as z4ai does).
pub fn default_output(input: &Path, frame: bool) -> PathBuf {
    let s = input.to_string_lossy();
    if frame {
        return PathBuf::from(match s.strip_suffix(".z4ai") {
            Some(base) => base.to_string(),
            None => format!("{s}.out"),
        });
    }
    let base = s
        .strip_suffix(".zstn")
        .or_else(|| s.strip_suffix(".z4dm"))
        .or_else(|| s.strip_suffix(".z4ai.safetensors"))
        .unwrap_or(&s);
    let out = if base.ends_with(".safetensors") {
        PathBuf::from(base)
    } else {
        PathBuf::from(format!("{base}.safetensors"))
    };
    // The default output is never the input (an archive named .safetensors
    // would be replaced by its decoded bytes with --force).
    if out == input {
        let stem = s.strip_suffix(".safetensors").unwrap_or(&s);
        PathBuf::from(format!("{stem}.unpacked.safetensors"))
    } else {
        out
    }
}

/// Default output directory of a model-directory archive: its name
/// without `.blz`.
pub fn default_dir(input: &Path) -> PathBuf {
    let s = input.to_string_lossy();
    match s.strip_suffix(".blz") {
        Some(base) => PathBuf::from(base),
        None => PathBuf::from(format!("{s}.d")),
    }
}

pub fn run(g: Global, a: UnpackArgs) -> Result<ExitCode> {
    if let Some(kind) = super::z4delta::peek(&a.input) {
        let Some(base) = &a.base else {
            return Err(super::z4delta::needs_base(&a.input, kind));
        };
        super::z4delta::unpack(g, &a.input, kind, base, a.output, a.force)?;
        return Ok(ExitCode::SUCCESS);
    }
    if a.base.is_some() {
        return Err(super::z4delta::base_not_applicable(&a.input));
    }
    let input = open_input(&a.input)?;
    let to_stdout = a.output.as_deref() == Some(Path::new("-"));
    match input {
        Input::Archive(archive) if !is_single_file(&*archive) && to_stdout => {
            return Err(anyhow::anyhow!(
                "{}: holds a model directory ({} files), which cannot go to standard output \
                 (-o -): give -o DIR",
                a.input.display(),
                archive.files()
            ));
        }
        Input::Archive(archive) if !is_single_file(&*archive) => {
            let out = a.output.unwrap_or_else(|| default_dir(&a.input));
            unpack_dir(g, &*archive, &out, a.force)?;
        }
        Input::Archive(archive) if to_stdout => {
            let pb = progress(g, archive.logical_len(0), "unpack");
            to_standard_output(|w| {
                write_to(&*archive, 0, w, &|n| pb.inc(n)).map_err(std::io::Error::other)
            })?;
            pb.finish_and_clear();
        }
        Input::Frame(map) if to_stdout => {
            Frame::parse(&map).with_context(|| a.input.display().to_string())?;
            to_standard_output(|w| {
                write_frame(&map, &a.input, w)
                    .map(|_| ())
                    .map_err(std::io::Error::other)
            })?;
        }
        Input::Archive(archive) => {
            let out = a.output.unwrap_or_else(|| default_output(&a.input, false));
            let oname = out.display().to_string();
            let pb = progress(g, archive.logical_len(0), "unpack");
            write_atomic(&out, a.force, |w| {
                write_to(&*archive, 0, w, &|n| pb.inc(n)).map_err(std::io::Error::other)
            })
            .with_context(|| oname.clone())?;
            pb.finish_and_clear();
        }
        Input::Frame(map) => {
            let out = a.output.unwrap_or_else(|| default_output(&a.input, true));
            let oname = out.display().to_string();
            // Checked before the output is created, as the archive paths do.
            Frame::parse(&map).with_context(|| a.input.display().to_string())?;
            write_atomic(&out, a.force, |w| {
                write_frame(&map, &a.input, w)
                    .map(|_| ())
                    .map_err(std::io::Error::other)
            })
            .with_context(|| oname.clone())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `-o -`: the decoded bytes to standard output, as tar and zstd do (and,
/// as zstd does, not to a terminal).
pub(super) fn to_standard_output(
    fill: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
) -> Result<()> {
    write_standard_output(fill).context("standard output")
}

/// As [`to_standard_output`], the error as `fill` gave it.
pub(super) fn write_standard_output(
    fill: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
) -> std::io::Result<()> {
    use std::io::{IsTerminal, Write};
    let out = std::io::stdout();
    if out.is_terminal() {
        return Err(std::io::Error::other(
            "-o -: standard output is a terminal; redirect it to a file or a pipe",
        ));
    }
    let mut w = std::io::BufWriter::with_capacity(1 << 20, out.lock());
    fill(&mut w).and_then(|()| w.flush())
}

/// An archive presenting one file under its own name (a `.zstn`).
fn is_single_file(a: &dyn ArchiveView) -> bool {
    a.files() == 1 && a.file_path(0).is_empty()
}

/// Recreates a model directory. Every target is checked before anything is
/// written, so without `force` a clash leaves the output untouched.
///
/// Files are written into a temporary directory beside `out` (no fsync per
/// file: an archive of 10^6 files would take hours), then made durable
/// together: one `syncfs` of the file system, and one fsync of each
/// directory after its entries are in place. A new `out` is the temporary
/// directory renamed; into an existing `out` (`--force`, or no clash) each
/// file is renamed over its target. A failure before that removes the
/// temporary directory: no output directory is left behind, and an
/// existing one is untouched.
fn unpack_dir(g: Global, a: &dyn ArchiveView, out: &Path, force: bool) -> Result<()> {
    if !force {
        for i in 0..a.files() {
            let p = out.join(a.file_path(i));
            if p.symlink_metadata().is_ok() {
                return Err(anyhow::anyhow!(
                    "{}: exists (use --force to replace it)",
                    p.display()
                ));
            }
        }
    }
    let parent = crate::fsutil::parent_dir(out);
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let staging = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .tempdir_in(&parent)
        .with_context(|| parent.display().to_string())?;
    let total = (0..a.files()).map(|i| a.logical_len(i)).sum();
    let pb = progress(g, total, "unpack");
    let mut dirs = std::collections::BTreeSet::new();
    for i in 0..a.files() {
        let rel = Path::new(a.file_path(i));
        let p = staging.path().join(rel);
        if let Some(d) = rel.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !dirs.contains(d) {
                dirs.extend(
                    d.ancestors()
                        .filter(|d| !d.as_os_str().is_empty())
                        .map(Path::to_path_buf),
                );
                let d = staging.path().join(d);
                std::fs::create_dir_all(&d).with_context(|| d.display().to_string())?;
            }
        }
        let buf = a.logical_len(i).clamp(4096, 1 << 20) as usize;
        write_new(&p, buf, |w| {
            write_to(a, i, w, &|n| pb.inc(n)).map_err(std::io::Error::other)
        })
        .with_context(|| out.join(rel).display().to_string())?;
    }
    pb.finish_and_clear();
    // Every file's data and every directory, durable in one call.
    syncfs(staging.path()).with_context(|| staging.path().display().to_string())?;
    if out.symlink_metadata().is_err() {
        let tmp = staging.keep();
        // A directory made by tempdir is 0700; a model directory is shared.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
            .and_then(|()| std::fs::rename(&tmp, out))
            .inspect_err(|_| {
                let _ = std::fs::remove_dir_all(&tmp);
            })
            .with_context(|| out.display().to_string())?;
    } else {
        for d in &dirs {
            let d = out.join(d);
            std::fs::create_dir_all(&d).with_context(|| d.display().to_string())?;
        }
        for i in 0..a.files() {
            let rel = a.file_path(i);
            let to = out.join(rel);
            std::fs::rename(staging.path().join(rel), &to)
                .with_context(|| to.display().to_string())?;
        }
        for d in &dirs {
            let d = out.join(d);
            crate::fsutil::sync_dir(&d).with_context(|| d.display().to_string())?;
        }
        crate::fsutil::sync_dir(out).with_context(|| out.display().to_string())?;
    }
    crate::fsutil::sync_dir(&parent).with_context(|| parent.display().to_string())?;
    Ok(())
}

/// Creates `path` (which must not exist) with mode 0644 and fills it; not
/// synced (see [`unpack_dir`]).
fn write_new<F>(path: &Path, buf: usize, fill: F) -> std::io::Result<()>
where
    F: FnOnce(&mut std::io::BufWriter<&std::fs::File>) -> std::io::Result<()>,
{
    use std::io::Write as _;
    use std::os::unix::fs::PermissionsExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    // A model directory is shared: 0644 whatever the umask.
    f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
    let mut w = std::io::BufWriter::with_capacity(buf, &f);
    fill(&mut w)?;
    w.flush()
}

/// `syncfs(2)` of the file system holding `dir`.
fn syncfs(dir: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let d = std::fs::File::open(dir)?;
    // SAFETY: `d` is an open file descriptor for the duration of the call.
    if unsafe { libc::syncfs(d.as_raw_fd()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
