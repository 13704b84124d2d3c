//! A GGUF export presented as an archive ([`ArchiveView`]), so the mount
//! serves `NAME.<cast>.gguf` through its ordinary read path (block cache,
//! prefetch, EIO for a block that cannot be made) without writing it
//! anywhere.
//!
//! The whole layout is computed up front by [`Layout::new`] (header,
//! metadata, tensor infos and every tensor's aligned offset: no tensor data
//! is read), which fixes the file's size. The file is then the header (the
//! view's in-memory prefix) followed by one unit per tensor (its data padded
//! to the alignment), each cut into blocks that read about
//! [`BLOCK_SOURCE`] bytes of the source tensor: whole quantisation blocks,
//! and whole heads of a q/k tensor whose rows llama.cpp wants permuted.
//! Decoding a block reads only its source elements from the model (an
//! archive decodes only the blocks they lie in) and casts or quantises
//! them with the same code `export --to gguf` uses ([`Layout::tensor_bytes`]),
//! so the view's bytes are the exported file's.
//!
//! Memory: the header, plus per block in flight about `BLOCK_SOURCE` of
//! source and its output. Nothing here knows about the mount.

use super::gguf::Layout;
use super::{Cast, Result};
use crate::model::{Model, ModelError};
use ckptfs_archive::{ArchiveError, ArchiveView, BlockKey, Grid, Kind, Segment};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Source bytes each block of the view reads (about: whole units).
pub const BLOCK_SOURCE: u64 = 4 << 20;

pub struct GgufView {
    path: PathBuf,
    model: Model,
    layout: Layout,
    segments: Vec<Segment>,
    grids: Vec<Arc<Grid>>,
    source_len: u64,
}

impl GgufView {
    /// The GGUF of `model` with `cast`, as `export --to gguf` writes it;
    /// `path` names the view in messages.
    pub fn new(model: Model, cast: Option<Cast>, path: PathBuf) -> Result<GgufView> {
        let layout = Layout::new(&model, cast)?;
        let mut segments = Vec::new();
        let mut grids = Vec::new();
        for i in 0..layout.tensors() {
            let span = layout.tensor_span(i);
            let len = span.end - span.start;
            let step = layout.piece_len(&model, i, BLOCK_SOURCE).max(1);
            let mut bounds: Vec<u64> = (0..len.div_ceil(step)).map(|b| b * step).collect();
            bounds.push(len);
            if bounds.len() == 1 {
                bounds.insert(0, 0);
            }
            grids.push(Arc::new(Grid::plain(bounds)));
            if len > 0 {
                segments.push(Segment {
                    start: span.start,
                    len,
                    unit: i as u32,
                });
            }
        }
        let source_len = model.files().iter().map(|f| f.len).sum();
        Ok(GgufView {
            path,
            model,
            layout,
            segments,
            grids,
            source_len,
        })
    }

    fn model_error(&self, e: ModelError) -> ArchiveError {
        match e {
            ModelError::Archive(e) => e,
            ModelError::Io { path, source } => ArchiveError::Io {
                path: path.into(),
                source,
            },
            e => self.integrity(e.to_string()),
        }
    }
}

impl ArchiveView for GgufView {
    fn kind(&self) -> Kind {
        Kind::GgufView
    }
    fn path(&self) -> &Path {
        &self.path
    }
    /// The model's bytes (the view itself takes no space).
    fn stored_len(&self) -> u64 {
        self.source_len
    }
    /// The view's bytes are computed; the source's own checks apply as
    /// they are read.
    fn checksums(&self) -> Option<&'static str> {
        None
    }
    fn files(&self) -> usize {
        1
    }
    fn file_path(&self, _file: usize) -> &str {
        ""
    }
    fn logical_len(&self, _file: usize) -> u64 {
        self.layout.len()
    }
    fn prefix(&self, _file: usize) -> ckptfs_archive::Result<&[u8]> {
        Ok(self.layout.head())
    }
    fn prefix_len(&self, _file: usize) -> u64 {
        self.layout.head().len() as u64
    }
    fn segments(&self, _file: usize) -> &[Segment] {
        &self.segments
    }
    fn units(&self) -> usize {
        self.layout.tensors()
    }
    fn unit_name(&self, unit: u32) -> &str {
        if (unit as usize) < self.layout.tensors() {
            self.layout.tensor_name(unit as usize)
        } else {
            "?"
        }
    }
    fn grid(&self, unit: u32) -> ckptfs_archive::Result<Arc<Grid>> {
        self.grids
            .get(unit as usize)
            .cloned()
            .ok_or_else(|| self.integrity(format!("no unit {unit}")))
    }
    fn decode_block(&self, key: BlockKey) -> ckptfs_archive::Result<Vec<u8>> {
        let g = self.grid(key.unit)?;
        if key.block as usize >= g.blocks() {
            return Err(self.integrity(format!("no block {} in unit {}", key.block, key.unit)));
        }
        self.layout
            .tensor_bytes(&self.model, key.unit as usize, g.span(key.block as usize))
            .map_err(|e| self.model_error(e))
    }
    fn verify_structure(&self) -> ckptfs_archive::Result<()> {
        Ok(())
    }
    fn verify_unit(&self, _unit: u32, _digest: u64) -> ckptfs_archive::Result<()> {
        Ok(())
    }
    fn verify_finish(&self, _unit_digests: &[u64]) -> ckptfs_archive::Result<String> {
        Ok(format!("GGUF view of {}", self.model.path().display()))
    }
}
