//! `export`: a [`Model`] (any archive kind, a `.safetensors` file, a model
//! directory) written out as a safetensors model directory, PyTorch-loadable
//! raw files, raw `.bin` per tensor, or GGUF, optionally casting float
//! tensors on the way.
//!
//! Invariants:
//! - Streaming: one tensor chunk ([`crate::model::CHUNK`]) is read, cast
//!   and written at a time; memory does not grow with the model (GGUF
//!   tensors that llama.cpp wants permuted are the exception: one tensor).
//! - Atomic: a directory output is built in a temporary sibling, every file
//!   fsynced, then renamed into place (`--force` swaps out the old one);
//!   a file output goes through [`ckptfs_format::fsutil::write_atomic`]. A failure
//!   leaves no output.
//! - Without a cast, every file is copied byte for byte (safetensors
//!   target), so export of any archive equals the original directory.
//! - Paths written are the model's relative paths, checked to stay inside
//!   the output.

pub mod cast;
pub mod gguf;
pub mod gguf_view;
pub mod quant;
mod spm;

use crate::model::{Model, ModelError, Tensor};
use ckptfs_format::safetensors::Dtype;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ExportError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("{path}: {source}")]
    Output { path: String, source: io::Error },
    #[error("{path}: {what}")]
    Input { path: String, what: String },
}

pub type Result<T> = std::result::Result<T, ExportError>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Safetensors,
    Pytorch,
    Raw,
    Gguf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cast {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4K,
}

impl Cast {
    /// The float dtype of a float cast.
    pub fn float(self) -> Option<Dtype> {
        match self {
            Cast::F32 => Some(Dtype::F32),
            Cast::F16 => Some(Dtype::F16),
            Cast::BF16 => Some(Dtype::BF16),
            Cast::Q8_0 | Cast::Q4_0 | Cast::Q4K => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Cast::F32 => "f32",
            Cast::F16 => "f16",
            Cast::BF16 => "bf16",
            Cast::Q8_0 => "q8_0",
            Cast::Q4_0 => "q4_0",
            Cast::Q4K => "q4_k",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    pub target: Target,
    pub cast: Option<Cast>,
    pub force: bool,
}

/// What an export did, for the one-line summary.
#[derive(Debug, Default)]
pub struct Summary {
    pub files: usize,
    pub tensors: usize,
    /// Bytes of source tensors and files read.
    pub source_bytes: u64,
    pub written_bytes: u64,
    /// Per-tensor notes (a cast that fell back to another type).
    pub notes: Vec<String>,
}

/// Total bytes an export reads (for a progress bar).
pub fn source_bytes(m: &Model) -> u64 {
    m.files().iter().map(|f| f.len).sum()
}

/// Exports `m` to `out`.
pub fn export(
    m: &Model,
    out: &Path,
    opts: &Options,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Summary> {
    if let Some(c) = opts.cast {
        if c.float().is_none() && opts.target != Target::Gguf {
            return Err(ExportError::Input {
                path: out.display().to_string(),
                what: format!(
                    "--cast {} is a GGUF block type: use it with --to gguf",
                    c.name()
                ),
            });
        }
    }
    if !opts.force && out.symlink_metadata().is_ok() {
        return Err(exists(out));
    }
    match opts.target {
        Target::Gguf => gguf::export(m, out, opts, progress),
        t => {
            let dir = OutDir::new(out)?;
            let s = match t {
                Target::Safetensors => to_safetensors(m, &dir, opts.cast, progress)?,
                Target::Pytorch | Target::Raw => to_bins(m, &dir, t, opts.cast, progress)?,
                Target::Gguf => unreachable!(),
            };
            dir.commit(opts.force)?;
            Ok(s)
        }
    }
}

fn exists(out: &Path) -> ExportError {
    ExportError::Input {
        path: out.display().to_string(),
        what: "output exists (use --force to replace it)".into(),
    }
}

fn out_err(path: &Path) -> impl Fn(io::Error) -> ExportError + '_ {
    move |source| ExportError::Output {
        path: path.display().to_string(),
        source,
    }
}

/// A directory output being built in a temporary sibling.
struct OutDir {
    out: PathBuf,
    tmp: tempfile::TempDir,
}

impl OutDir {
    fn new(out: &Path) -> Result<OutDir> {
        let parent = ckptfs_format::fsutil::parent_dir(out);
        let name = out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".tmp")
            .tempdir_in(&parent)
            .map_err(out_err(&parent))?;
        Ok(OutDir {
            out: out.to_path_buf(),
            tmp,
        })
    }

    /// Writes the file at model-relative path `rel` through `fill`, then
    /// fsyncs it. `rel` must stay inside the output.
    fn write(
        &self,
        rel: &str,
        fill: impl FnOnce(&mut BufWriter<&File>) -> Result<()>,
    ) -> Result<u64> {
        let bad = rel.is_empty()
            || rel.starts_with('/')
            || rel
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == ".." || c.contains('\0'));
        if bad {
            return Err(ExportError::Input {
                path: self.out.display().to_string(),
                what: format!("refusing to write {rel:?}: not a plain relative path"),
            });
        }
        let path = self.tmp.path().join(rel);
        let shown = self.out.join(rel);
        if let Some(p) = path.parent() {
            std::fs::create_dir_all(p).map_err(out_err(&shown))?;
        }
        let f = File::create(&path).map_err(out_err(&shown))?;
        {
            let mut w = BufWriter::with_capacity(1 << 20, &f);
            fill(&mut w)?;
            w.flush().map_err(out_err(&shown))?;
        }
        f.sync_all().map_err(out_err(&shown))?;
        Ok(f.metadata().map_err(out_err(&shown))?.len())
    }

    /// fsyncs the tree's directories and renames it to the output (with
    /// `force`, swapping out an existing output, then removing it).
    fn commit(self, force: bool) -> Result<()> {
        let e = out_err(&self.out);
        sync_tree(self.tmp.path()).map_err(&e)?;
        let tmp = self.tmp.keep();
        let old = if self.out.symlink_metadata().is_ok() {
            if !force {
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(exists(&self.out));
            }
            let old = tmp.with_extension("old");
            std::fs::rename(&self.out, &old).map_err(&e)?;
            Some(old)
        } else {
            None
        };
        if let Err(err) = std::fs::rename(&tmp, &self.out) {
            let _ = std::fs::remove_dir_all(&tmp);
            if let Some(old) = &old {
                let _ = std::fs::rename(old, &self.out);
            }
            return Err(e(err));
        }
        ckptfs_format::fsutil::sync_dir(&ckptfs_format::fsutil::parent_dir(&self.out))
            .map_err(&e)?;
        if let Some(old) = old {
            if old.is_dir() {
                std::fs::remove_dir_all(&old).map_err(&e)?;
            } else {
                std::fs::remove_file(&old).map_err(&e)?;
            }
        }
        Ok(())
    }
}

fn sync_tree(dir: &Path) -> io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            sync_tree(&e.path())?;
        }
    }
    ckptfs_format::fsutil::sync_dir(dir)
}

/// The dtype tensor `t` is written with under a float cast (unchanged when
/// there is no cast or it is not a float tensor).
fn cast_dtype(t: &Tensor, cast: Option<Cast>) -> Option<(Dtype, Dtype)> {
    let from = Dtype::parse(&t.dtype)?;
    let to = cast?.float()?;
    (cast::is_float(from) && from != to).then_some((from, to))
}

/// Streams tensor `k` into `w`, cast if `cast` says so.
fn write_tensor(
    m: &Model,
    k: usize,
    cast: Option<Cast>,
    w: &mut dyn Write,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<u64> {
    let t = &m.tensors()[k];
    let mut written = 0u64;
    match cast_dtype(t, cast) {
        None => m.stream_tensor(k, 1, &mut |b| {
            progress(b.len() as u64);
            written += b.len() as u64;
            w.write_all(b)
        })?,
        Some((from, to)) => {
            let mut out = Vec::new();
            m.stream_tensor(k, cast::width(from) as u64, &mut |b| {
                progress(b.len() as u64);
                out.clear();
                cast::convert(from, to, b, &mut out);
                written += out.len() as u64;
                w.write_all(&out)
            })?
        }
    }
    Ok(written)
}

/// Size of tensor `t` once written with `cast`.
fn cast_len(t: &Tensor, cast: Option<Cast>) -> u64 {
    match cast_dtype(t, cast) {
        None => t.len,
        Some((from, to)) => t.len / cast::width(from) as u64 * cast::width(to) as u64,
    }
}

fn model_err(e: ModelError) -> ExportError {
    ExportError::Model(e)
}

/// Maps a write error inside a fill to the output path.
fn wr(path: &Path) -> impl Fn(io::Error) -> ExportError + '_ {
    out_err(path)
}

fn to_safetensors(
    m: &Model,
    dir: &OutDir,
    cast: Option<Cast>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Summary> {
    let mut s = Summary::default();
    let changes = |i: usize| {
        m.tensors()
            .iter()
            .any(|t| t.file == i && cast_dtype(t, cast).is_some())
    };
    let mut total_size = 0u64;
    let mut index = None;
    for (i, f) in m.files().iter().enumerate() {
        s.files += 1;
        s.source_bytes += f.len;
        let shown = dir.out.join(&f.path);
        if f.path.ends_with(".safetensors.index.json") && cast.is_some() {
            index = Some(i);
            continue;
        }
        if f.header.is_none() || !changes(i) {
            s.tensors += m.tensors().iter().filter(|t| t.file == i).count();
            s.written_bytes += dir.write(&f.path, |w| {
                m.copy_file(i, w, progress).map_err(|e| match e {
                    ModelError::Output(e) => wr(&shown)(e),
                    e => model_err(e),
                })
            })?;
            if let Some(h) = &f.header {
                total_size += h.tensors.iter().map(|t| t.len()).sum::<u64>();
            }
            continue;
        }
        // Tensors in data order, laid end to end with their cast sizes.
        let mut ks: Vec<usize> = (0..m.tensors().len())
            .filter(|&k| m.tensors()[k].file == i)
            .collect();
        ks.sort_by_key(|&k| m.tensors()[k].offset);
        let mut header = serde_json::Map::new();
        if let Some(meta) = f.header.as_ref().and_then(|h| h.metadata.as_ref()) {
            let meta: serde_json::Map<String, serde_json::Value> = meta
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect();
            header.insert("__metadata__".into(), meta.into());
        }
        let mut off = 0u64;
        for &k in &ks {
            let t = &m.tensors()[k];
            let len = cast_len(t, cast);
            let dtype = cast_dtype(t, cast).map_or(t.dtype.as_str(), |(_, to)| to.name());
            header.insert(
                t.name.clone(),
                serde_json::json!({"dtype": dtype, "shape": t.shape, "data_offsets": [off, off + len]}),
            );
            off += len;
        }
        total_size += off;
        let mut h = serde_json::to_vec(&header).expect("JSON of strings and numbers");
        while !h.len().is_multiple_of(8) {
            h.push(b' ');
        }
        s.tensors += ks.len();
        s.written_bytes += dir.write(&f.path, |w| {
            let e = wr(&shown);
            w.write_all(&(h.len() as u64).to_le_bytes()).map_err(&e)?;
            w.write_all(&h).map_err(&e)?;
            progress(8 + h.len() as u64);
            for &k in &ks {
                write_tensor(m, k, cast, w, progress).map_err(|err| match err {
                    ExportError::Model(ModelError::Output(x)) => e(x),
                    x => x,
                })?;
            }
            Ok(())
        })?;
    }
    if let Some(i) = index {
        // The index's total_size follows the cast; the rest is kept.
        let f = &m.files()[i];
        let raw = m.read_small(i, 64 << 20)?;
        let mut v: serde_json::Value =
            serde_json::from_slice(&raw).map_err(|e| ExportError::Input {
                path: m.file_label(i),
                what: format!("not JSON: {e}"),
            })?;
        let bytes = match v.pointer_mut("/metadata/total_size") {
            Some(ts) if ts.is_u64() => {
                *ts = total_size.into();
                let mut b = serde_json::to_vec_pretty(&v).expect("JSON value");
                b.push(b'\n');
                b
            }
            _ => raw,
        };
        let shown = dir.out.join(&f.path);
        s.written_bytes += dir.write(&f.path, |w| w.write_all(&bytes).map_err(wr(&shown)))?;
        progress(f.len);
    }
    Ok(s)
}

/// Unique `.bin` names for every tensor (a name used twice, in two shards
/// or after `/` is replaced, gets `.2`, `.3`...).
fn bin_names(m: &Model) -> Vec<String> {
    let mut seen = std::collections::HashMap::<String, usize>::new();
    m.tensors()
        .iter()
        .map(|t| {
            let base = crate::model::bin_name(&t.name);
            let n = seen.entry(base.clone()).or_default();
            *n += 1;
            if *n == 1 {
                format!("{base}.bin")
            } else {
                format!("{base}.{n}.bin")
            }
        })
        .collect()
}

/// The loader written beside `--to pytorch` output.
const LOADER: &str = include_str!("load.py");

fn to_bins(
    m: &Model,
    dir: &OutDir,
    target: Target,
    cast: Option<Cast>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Summary> {
    let mut s = Summary::default();
    let names = bin_names(m);
    let sub = if target == Target::Pytorch {
        "tensors/"
    } else {
        ""
    };
    let mut entries = Vec::new();
    for (k, t) in m.tensors().iter().enumerate() {
        let rel = format!("{sub}{}", names[k]);
        let shown = dir.out.join(&rel);
        let n = dir.write(&rel, |w| {
            write_tensor(m, k, cast, w, progress).map_err(|err| match err {
                ExportError::Model(ModelError::Output(x)) => wr(&shown)(x),
                x => x,
            })?;
            Ok(())
        })?;
        let dtype = cast_dtype(t, cast).map_or(t.dtype.as_str(), |(_, to)| to.name());
        entries.push(serde_json::json!({
            "name": t.name,
            "dtype": dtype,
            "shape": t.shape,
            "file": rel,
            "bytes": n,
            "source_file": m.files()[t.file].path,
        }));
        s.tensors += 1;
        s.source_bytes += t.len;
        s.written_bytes += n;
    }
    let (index_name, format) = match target {
        Target::Pytorch => ("manifest.json", "ckptfs-pytorch-raw/1"),
        _ => ("index.json", "ckptfs-raw/1"),
    };
    let index = serde_json::json!({
        "format": format,
        "byte_order": "little",
        "tensors": entries,
    });
    let mut b = serde_json::to_vec_pretty(&index).expect("JSON value");
    b.push(b'\n');
    let shown = dir.out.join(index_name);
    s.written_bytes += dir.write(index_name, |w| w.write_all(&b).map_err(wr(&shown)))?;
    if target == Target::Pytorch {
        let shown = dir.out.join("load.py");
        s.written_bytes += dir.write("load.py", |w| {
            w.write_all(LOADER.as_bytes()).map_err(wr(&shown))
        })?;
    }
    s.files = s.tensors;
    Ok(s)
}
