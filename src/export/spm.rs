//! SentencePiece `tokenizer.model` to GGUF tokenizer keys.

use super::gguf::Kv;
use super::{ExportError, Result};
use crate::model::Model;

pub(super) fn to_gguf(m: &Model, file: usize, _n: u64, _kv: &mut Kv) -> Result<()> {
    Err(ExportError::Input {
        path: m.file_label(file),
        what: "SentencePiece tokenizer.model is not read yet".into(),
    })
}
