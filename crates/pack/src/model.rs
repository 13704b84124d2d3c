//! A model to read tensors from, whatever holds it: an archive of any kind
//! (through [`ArchiveView`], so a kind added to `ckptfs_archive` works here
//! unchanged), a plain `.safetensors` file, or a model directory (whose
//! `X.zstn` shards are presented as `X.safetensors`, as the mount shows
//! them).
//!
//! A [`Model`] is a list of files (relative `/`-separated paths, sizes) and
//! the tensors of the files that are safetensors. Tensors are found by
//! reading each such file's header through the same byte interface the
//! mount serves ([`Model::read_at`]) and validating it fully
//! ([`Header::parse`]) against the file's size, so every tensor range read
//! afterwards lies inside its file. Nothing is allocated from a length
//! before that check; tensor bytes are streamed in chunks
//! ([`Model::stream_range`]), never held whole.
//!
//! Reads of an archive decode, in parallel, only the blocks a range
//! touches ([`ckptfs_archive::plan`]). This module must not depend on
//! `commands` (no clap, no anyhow).

use ckptfs_archive::{self as archive, ArchiveError, ArchiveView, PieceSource};
use ckptfs_format::safetensors::{Header, HeaderError, MAX_HEADER_LEN};
use rayon::prelude::*;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use thiserror::Error;

/// Bytes of a tensor read (and decoded) at once when streaming.
pub const CHUNK: u64 = 16 << 20;

#[derive(Debug, Error)]
pub enum ModelError {
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path}: safetensors header: {source}")]
    Header { path: String, source: HeaderError },
    #[error("{path}: {what}")]
    Input { path: String, what: String },
    /// Writing what was read failed (the caller names the output).
    #[error("{0}")]
    Output(io::Error),
}

pub type Result<T> = std::result::Result<T, ModelError>;

/// Where the bytes come from.
enum Source {
    Archive(Arc<dyn ArchiveView>),
    /// Files, in the order of [`Model::files`]: plain ones, or (in a model
    /// directory) single-file archives presented as the `.safetensors`
    /// they hold.
    Files(Vec<FileSource>),
}

enum FileSource {
    /// An absolute path.
    Plain(PathBuf),
    Archive(Arc<dyn ArchiveView>),
}

/// One file of the model.
#[derive(Debug, Clone)]
pub struct ModelFile {
    /// Relative `/`-separated path (for a single-file input, its name).
    pub path: String,
    pub len: u64,
    /// Its parsed header, when the file is safetensors.
    pub header: Option<Header>,
    /// Where its data buffer starts (8 + header length).
    pub data_start: u64,
}

/// One tensor of one safetensors file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    /// Index into [`Model::files`].
    pub file: usize,
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    /// Absolute offset of its bytes in the file.
    pub offset: u64,
    pub len: u64,
}

pub struct Model {
    /// What the user named (for messages).
    path: PathBuf,
    source: Source,
    files: Vec<ModelFile>,
    tensors: Vec<Tensor>,
}

/// True for a path the model treats as safetensors.
fn is_safetensors(rel: &str) -> bool {
    rel.ends_with(".safetensors")
}

impl Model {
    /// Opens an archive of any kind, a `.safetensors` file or a directory.
    pub fn open(path: &Path) -> Result<Model> {
        Model::open_with(path, &archive::LocalFs)
    }

    /// [`Self::open`], its archives (and their bases) opened through `fs`
    /// (the mount's store, whose files may be remote copies).
    pub fn open_with(path: &Path, fs: &dyn archive::BaseFs) -> Result<Model> {
        let io = |source| ModelError::Io {
            path: path.display().to_string(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        if meta.is_dir() {
            let walked = crate::walk(path, None).map_err(|e| ModelError::Input {
                path: path.display().to_string(),
                what: e.to_string(),
            })?;
            let (files, sources) = dir_files(walked, fs)?;
            return Model::build(path, Source::Files(sources), files);
        }
        let mut head = [0u8; 8];
        let n = File::open(path)
            .and_then(|mut f| f.read(&mut head))
            .map_err(io)?;
        let head = &head[..n];
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if archive::Kind::detect(head).is_some() || archive::unsupported_kind(head).is_some() {
            return Model::from_archive(archive::open_with(path, fs)?, path);
        }
        let file = ModelFile {
            path: if is_safetensors(&name) {
                name
            } else {
                format!("{name}.safetensors")
            },
            len: meta.len(),
            header: None,
            data_start: 0,
        };
        Model::build(
            path,
            Source::Files(vec![FileSource::Plain(path.to_path_buf())]),
            vec![file],
        )
    }

    /// The model an already opened archive presents (`path` names it in
    /// messages and gives `general.name`-style stems).
    pub fn from_archive(a: Arc<dyn ArchiveView>, path: &Path) -> Result<Model> {
        let stem = path
            .file_stem()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let files = (0..a.files())
            .map(|i| ModelFile {
                // A single-file archive presents the .safetensors it
                // reconstructs, under the archive's own name.
                path: match a.file_path(i) {
                    "" => format!("{stem}.safetensors"),
                    p => p.to_string(),
                },
                len: a.logical_len(i),
                header: None,
                data_start: 0,
            })
            .collect();
        Model::build(path, Source::Archive(a), files)
    }

    fn build(path: &Path, source: Source, files: Vec<ModelFile>) -> Result<Model> {
        let mut m = Model {
            path: path.to_path_buf(),
            source,
            files,
            tensors: Vec::new(),
        };
        for i in 0..m.files.len() {
            if !is_safetensors(&m.files[i].path) {
                continue;
            }
            let (header, data_start) = m.read_header(i)?;
            for t in &header.tensors {
                m.tensors.push(Tensor {
                    file: i,
                    name: t.name.clone(),
                    dtype: t.dtype.clone(),
                    shape: t.shape.clone(),
                    offset: data_start + t.begin,
                    len: t.len(),
                });
            }
            m.files[i].header = Some(header);
            m.files[i].data_start = data_start;
        }
        Ok(m)
    }

    /// Reads and fully validates the safetensors header of file `i`.
    fn read_header(&self, i: usize) -> Result<(Header, u64)> {
        let f = &self.files[i];
        let herr = |source| ModelError::Header {
            path: self.file_label(i),
            source,
        };
        let mut len8 = [0u8; 8];
        let got = self.read_at(i, 0, &mut len8)?;
        let hlen = ckptfs_format::safetensors::header_len(&len8[..got], f.len).map_err(herr)?;
        debug_assert!(hlen <= MAX_HEADER_LEN);
        let mut raw = vec![0u8; hlen as usize];
        self.read_exact_at(i, 8, &mut raw)?;
        let data_start = 8 + hlen;
        let header = Header::parse(&raw, f.len - data_start).map_err(herr)?;
        Ok((header, data_start))
    }

    /// What the user named.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The archive behind the model, if it is one.
    pub fn archive(&self) -> Option<&Arc<dyn ArchiveView>> {
        match &self.source {
            Source::Archive(a) => Some(a),
            Source::Files(_) => None,
        }
    }

    pub fn files(&self) -> &[ModelFile] {
        &self.files
    }

    /// Every tensor, file by file, each file's in header order.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    /// How messages name file `i`: `MODEL/REL` (or the file itself).
    pub fn file_label(&self, i: usize) -> String {
        match &self.source {
            Source::Files(v)
                if v.len() == 1 && matches!(&v[0], FileSource::Plain(p) if *p == self.path) =>
            {
                self.path.display().to_string()
            }
            _ => format!("{}/{}", self.path.display(), self.files[i].path),
        }
    }

    /// The index of the file at relative path `rel`.
    pub fn find_file(&self, rel: &str) -> Option<usize> {
        self.files.iter().position(|f| f.path == rel)
    }

    /// The tensor named `spec`, or `FILE:NAME` when the name is in several
    /// files. The error says which.
    pub fn find_tensor(&self, spec: &str) -> Result<usize> {
        let hits = |name: &str, file: Option<&str>| -> Vec<usize> {
            (0..self.tensors.len())
                .filter(|&k| {
                    let t = &self.tensors[k];
                    t.name == name && file.is_none_or(|p| self.files[t.file].path == p)
                })
                .collect()
        };
        let mut found = hits(spec, None);
        if found.is_empty() {
            if let Some((file, name)) = spec.split_once(':') {
                found = hits(name, Some(file));
            }
        }
        let input = |what: String| ModelError::Input {
            path: self.path.display().to_string(),
            what,
        };
        match found.len() {
            0 => Err(input(format!("no tensor {spec:?}"))),
            1 => Ok(found[0]),
            _ => Err(input(format!(
                "tensor {spec:?} is in {}; name it as FILE:NAME",
                found
                    .iter()
                    .map(|&k| self.files[self.tensors[k].file].path.as_str())
                    .collect::<Vec<_>>()
                    .join(" and ")
            ))),
        }
    }

    /// Reads bytes of file `i` at `offset` (clamped to the file); returns
    /// the count. Archive blocks are decoded in parallel.
    pub fn read_at(&self, i: usize, offset: u64, buf: &mut [u8]) -> Result<usize> {
        match &self.source {
            Source::Files(v) => match &v[i] {
                FileSource::Plain(p) => self.read_plain(p, i, offset, buf),
                FileSource::Archive(a) => Ok(read_par(&**a, 0, offset, buf)?),
            },
            Source::Archive(a) => Ok(read_par(&**a, i, offset, buf)?),
        }
    }

    fn read_plain(&self, p: &Path, i: usize, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let io = |source| ModelError::Io {
            path: p.display().to_string(),
            source,
        };
        let f = File::open(p).map_err(io)?;
        let len = self.files[i].len;
        if offset >= len {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(len - offset) as usize;
        f.read_exact_at(&mut buf[..n], offset).map_err(io)?;
        Ok(n)
    }

    fn read_exact_at(&self, i: usize, offset: u64, buf: &mut [u8]) -> Result<()> {
        let n = self.read_at(i, offset, buf)?;
        if n < buf.len() {
            return Err(ModelError::Input {
                path: self.file_label(i),
                what: format!("ends at {} bytes, before {}", offset + n as u64, buf.len()),
            });
        }
        Ok(())
    }

    /// Streams bytes `[offset, offset + len)` of file `i` to `f`, in
    /// chunks of at most [`CHUNK`] bytes (and multiples of `align` bytes,
    /// so a chunk holds whole elements or quantisation blocks).
    pub fn stream_range(
        &self,
        i: usize,
        offset: u64,
        len: u64,
        align: u64,
        f: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> Result<()> {
        let align = align.max(1);
        let step = (CHUNK / align).max(1) * align;
        let mut buf = vec![0u8; step.min(len) as usize];
        let mut pos = 0;
        while pos < len {
            let n = step.min(len - pos) as usize;
            self.read_exact_at(i, offset + pos, &mut buf[..n])?;
            f(&buf[..n]).map_err(ModelError::Output)?;
            pos += n as u64;
        }
        Ok(())
    }

    /// Streams tensor `t`'s bytes (see [`Model::stream_range`]).
    pub fn stream_tensor(
        &self,
        t: usize,
        align: u64,
        f: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> Result<()> {
        let t = &self.tensors[t];
        self.stream_range(t.file, t.offset, t.len, align, f)
    }

    /// Copies file `i` into `w` byte for byte.
    pub fn copy_file(&self, i: usize, w: &mut dyn Write, progress: &dyn Fn(u64)) -> Result<()> {
        let (a, file) = match &self.source {
            Source::Archive(a) => (a, i),
            Source::Files(v) => match &v[i] {
                FileSource::Archive(a) => (a, 0),
                FileSource::Plain(_) => {
                    return self.stream_range(i, 0, self.files[i].len, 1, &mut |b| {
                        progress(b.len() as u64);
                        w.write_all(b)
                    })
                }
            },
        };
        archive::write_to(&**a, file, w, progress).map_err(|e| match e {
            archive::WriteError::Archive(e) => e.into(),
            archive::WriteError::Write(e) => ModelError::Output(e),
        })
    }

    /// Reads a small non-tensor file (config.json, tokenizer.json) whole.
    /// `limit` bounds what it may allocate.
    pub fn read_small(&self, i: usize, limit: u64) -> Result<Vec<u8>> {
        let len = self.files[i].len;
        if len > limit {
            return Err(ModelError::Input {
                path: self.file_label(i),
                what: format!("{len} bytes, more than the {limit}-byte limit for this file"),
            });
        }
        let mut v = vec![0u8; len as usize];
        self.read_exact_at(i, 0, &mut v)?;
        Ok(v)
    }
}

/// The files of a model directory walked by `pack::walk`: each plain file
/// as it is, except that a single-file archive `X.zstn` or
/// `X.safetensors.zstn` is presented as the `X.safetensors` it holds, as
/// the mount presents it (a plain `X.safetensors` wins over both, and
/// `X.safetensors.zstn` over `X.zstn`; the loser is left out).
fn dir_files(
    walked: Vec<(String, PathBuf)>,
    fs: &dyn archive::BaseFs,
) -> Result<(Vec<ModelFile>, Vec<FileSource>)> {
    let shown = |rel: &str| -> Option<String> {
        let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        let n = name.strip_suffix(".zstn")?;
        if n.is_empty() || n == ".safetensors" {
            return None;
        }
        let n = n.strip_suffix(".safetensors").unwrap_or(n);
        Some(if dir.is_empty() {
            format!("{n}.safetensors")
        } else {
            format!("{dir}/{n}.safetensors")
        })
    };
    let plain: std::collections::HashSet<&str> = walked
        .iter()
        .filter(|(r, _)| shown(r).is_none())
        .map(|(r, _)| r.as_str())
        .collect();
    // Presented name -> (rank, index into walked): the long archive name
    // ranks first.
    let mut best = std::collections::HashMap::<String, (u8, usize)>::new();
    for (k, (r, _)) in walked.iter().enumerate() {
        let Some(s) = shown(r) else { continue };
        if plain.contains(s.as_str()) {
            continue;
        }
        let rank = u8::from(!r.ends_with(".safetensors.zstn"));
        let e = best.entry(s).or_insert((rank, k));
        if rank < e.0 {
            *e = (rank, k);
        }
    }
    let mut out: Vec<(String, ModelFile, FileSource)> = Vec::new();
    for (k, (rel, p)) in walked.into_iter().enumerate() {
        let io = |source| ModelError::Io {
            path: p.display().to_string(),
            source,
        };
        match shown(&rel) {
            None => {
                let len = std::fs::metadata(&p).map_err(io)?.len();
                let f = ModelFile {
                    path: rel.clone(),
                    len,
                    header: None,
                    data_start: 0,
                };
                out.push((rel, f, FileSource::Plain(p)));
            }
            Some(s) if best.get(&s).is_some_and(|b| b.1 == k) => {
                let a = archive::open_with(&p, fs)?;
                if a.files() != 1 || !a.file_path(0).is_empty() {
                    return Err(ModelError::Input {
                        path: p.display().to_string(),
                        what: "a model-directory archive named as a single file".into(),
                    });
                }
                let f = ModelFile {
                    path: s.clone(),
                    len: a.logical_len(0),
                    header: None,
                    data_start: 0,
                };
                out.push((s, f, FileSource::Archive(a)));
            }
            Some(_) => {}
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out.into_iter().map(|(_, f, s)| (f, s)).unzip())
}

/// Reads `buf.len()` bytes of file `file` at `offset` from an archive,
/// decoding the blocks involved in parallel.
fn read_par(
    a: &dyn ArchiveView,
    file: usize,
    offset: u64,
    buf: &mut [u8],
) -> std::result::Result<usize, ArchiveError> {
    let len = a.logical_len(file);
    if offset >= len {
        return Ok(0);
    }
    let n = (buf.len() as u64).min(len - offset) as usize;
    a.check_range(file, offset..offset + n as u64)?;
    let pieces = archive::plan(a, file, offset..offset + n as u64)?;
    // Disjoint output slices, one per piece (pieces are in output order).
    let mut rest = &mut buf[..n];
    let mut jobs = Vec::with_capacity(pieces.len());
    let mut at = 0u64;
    for p in pieces {
        let skip = (p.out_offset - at) as usize;
        let width = (p.within.end - p.within.start) as usize;
        let (_, r) = std::mem::take(&mut rest).split_at_mut(skip);
        let (dst, r) = r.split_at_mut(width);
        rest = r;
        at = p.out_offset + width as u64;
        jobs.push((p, dst));
    }
    jobs.into_par_iter().try_for_each(|(p, dst)| {
        let within = p.within.start as usize..p.within.end as usize;
        match p.source {
            PieceSource::Prefix => dst.copy_from_slice(&a.prefix(file)?[within]),
            PieceSource::Block(key) => dst.copy_from_slice(&a.decode_block(key)?[within]),
        }
        Ok::<(), ArchiveError>(())
    })?;
    Ok(n)
}

/// A file name for a tensor: never a path (no `/`, no NUL, not `.`/`..`).
pub fn bin_name(tensor: &str) -> String {
    let s = tensor.replace(['/', '\0'], "_");
    match s.as_str() {
        "" | "." | ".." => format!("_{s}"),
        _ => s,
    }
}
