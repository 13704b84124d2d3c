//! SentencePiece `tokenizer.model` (llama/mistral-style checkpoints without
//! a tokenizer.json): the vocabulary, scores and piece types GGUF's
//! `tokenizer.ggml.model = llama` takes, read from the model's protobuf.
//!
//! The messages below are the part of sentencepiece_model.proto (proto2)
//! that is read, with its field numbers and defaults, decoded by prost's
//! derived `Message` (no .proto is compiled at build time):
//! `ModelProto.pieces` (1: piece 1, score 2, type 3), `trainer_spec` (2:
//! model_type 3, unk_id 40, bos_id 41, eos_id 42, pad_id 43) and
//! `normalizer_spec` (3: add_dummy_prefix 3). prost skips every other
//! field. Enum fields are read as their int32 wire values.
//!
//! The file is untrusted. prost checks every length against the bytes
//! left, wire types against the fields, strings for UTF-8 and nesting
//! depth; a piece type outside the enum is refused here. The pieces are
//! counted before any is built (the same message with empty pieces, which
//! take no memory), so a file of millions of tiny pieces is refused by the
//! caller's bound instead of first growing a vector of them.

use prost::Message;
use std::fmt;

/// Why a `tokenizer.model` was refused, with the offset decoding stopped
/// at when the protobuf itself is malformed.
#[derive(Debug, PartialEq, Eq)]
pub struct SpmError {
    pub offset: Option<usize>,
    pub what: String,
}

impl fmt::Display for SpmError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self.offset {
            Some(o) => write!(f, "offset {o}: {}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    pub text: String,
    pub score: f32,
    /// sentencepiece's piece type, which equals GGUF's token type: 1
    /// normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte.
    pub ty: i32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Spm {
    pub pieces: Vec<Piece>,
    /// TrainerSpec.model_type: 1 unigram, 2 BPE, 3 word, 4 char.
    pub model_type: i32,
    pub unk: i32,
    pub bos: i32,
    pub eos: i32,
    pub pad: i32,
    pub add_dummy_prefix: bool,
}

/// `ModelProto`, the fields read.
#[derive(Clone, PartialEq, Message)]
struct ModelProto {
    #[prost(message, repeated, tag = "1")]
    pieces: Vec<SentencePiece>,
    #[prost(message, optional, tag = "2")]
    trainer_spec: Option<TrainerSpec>,
    #[prost(message, optional, tag = "3")]
    normalizer_spec: Option<NormalizerSpec>,
}

/// `ModelProto` with each piece decoded as an empty message: the pieces
/// counted without being stored.
#[derive(Clone, PartialEq, Message)]
struct PieceCount {
    #[prost(message, repeated, tag = "1")]
    pieces: Vec<()>,
}

/// `ModelProto.SentencePiece`.
#[derive(Clone, PartialEq, Message)]
struct SentencePiece {
    #[prost(string, optional, tag = "1")]
    piece: Option<String>,
    #[prost(float, optional, tag = "2")]
    score: Option<f32>,
    /// `Type`, NORMAL (1) by default.
    #[prost(int32, optional, tag = "3", default = "1")]
    kind: Option<i32>,
}

/// `TrainerSpec`, the fields read.
#[derive(Clone, PartialEq, Message)]
struct TrainerSpec {
    /// `ModelType`, UNIGRAM (1) by default.
    #[prost(int32, optional, tag = "3", default = "1")]
    model_type: Option<i32>,
    #[prost(int32, optional, tag = "40", default = "0")]
    unk_id: Option<i32>,
    #[prost(int32, optional, tag = "41", default = "1")]
    bos_id: Option<i32>,
    #[prost(int32, optional, tag = "42", default = "2")]
    eos_id: Option<i32>,
    #[prost(int32, optional, tag = "43", default = "-1")]
    pad_id: Option<i32>,
}

/// `NormalizerSpec`, the field read.
#[derive(Clone, PartialEq, Message)]
struct NormalizerSpec {
    #[prost(bool, optional, tag = "3", default = "true")]
    add_dummy_prefix: Option<bool>,
}

/// Decodes `b` as `M`; an error names the offset decoding stopped at.
fn decode<M: Message + Default>(b: &[u8]) -> Result<M, SpmError> {
    let mut rest = b;
    let mut m = M::default();
    m.merge(&mut rest).map_err(|e| SpmError {
        offset: Some(b.len() - rest.len()),
        what: e.to_string(),
    })?;
    Ok(m)
}

/// Parses a `tokenizer.model`; at most `max_pieces` pieces.
pub fn parse(b: &[u8], max_pieces: usize) -> Result<Spm, SpmError> {
    let refused = |what: String| SpmError { offset: None, what };
    if decode::<PieceCount>(b)?.pieces.len() > max_pieces {
        return Err(refused(format!("more than {max_pieces} pieces")));
    }
    let m: ModelProto = decode(b)?;
    if m.pieces.is_empty() {
        return Err(refused("no pieces: not a SentencePiece model".into()));
    }
    let pieces = m
        .pieces
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let ty = p.kind();
            if !(1..=6).contains(&ty) {
                return Err(refused(format!(
                    "piece {i}: type {ty} is not a SentencePiece piece type (1 to 6)"
                )));
            }
            Ok(Piece {
                score: p.score(),
                text: p.piece.unwrap_or_default(),
                ty,
            })
        })
        .collect::<Result<_, _>>()?;
    let t = m.trainer_spec.unwrap_or_default();
    let n = m.normalizer_spec.unwrap_or_default();
    Ok(Spm {
        pieces,
        model_type: t.model_type(),
        unk: t.unk_id(),
        bos: t.bos_id(),
        eos: t.eos_id(),
        pad: t.pad_id(),
        add_dummy_prefix: n.add_dummy_prefix(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }
    fn bytes(field: u64, b: &[u8], out: &mut Vec<u8>) {
        varint(field << 3 | 2, out);
        varint(b.len() as u64, out);
        out.extend_from_slice(b);
    }

    fn model() -> Vec<u8> {
        let mut m = Vec::new();
        for (t, s, ty) in [("<unk>", 0.0f32, 2u64), ("▁a", -1.5, 1), ("<0x41>", 0.0, 6)] {
            let mut p = Vec::new();
            bytes(1, t.as_bytes(), &mut p);
            p.push(2 << 3 | 5);
            p.extend_from_slice(&s.to_le_bytes());
            varint(3 << 3, &mut p);
            varint(ty, &mut p);
            bytes(1, &p, &mut m);
        }
        let mut t = Vec::new();
        varint(3 << 3, &mut t);
        varint(2, &mut t);
        varint(43 << 3, &mut t);
        varint(-1i64 as u64, &mut t);
        bytes(2, &t, &mut m);
        let mut n = Vec::new();
        varint(3 << 3, &mut n);
        varint(0, &mut n);
        bytes(3, &n, &mut m);
        m
    }

    #[test]
    fn reads_pieces_and_specs() {
        let s = parse(&model(), 10).unwrap();
        assert_eq!(s.pieces.len(), 3);
        assert_eq!(s.pieces[1].text, "▁a");
        assert_eq!(s.pieces[1].score, -1.5);
        assert_eq!(s.pieces[2].ty, 6);
        assert_eq!((s.model_type, s.unk, s.bos, s.eos, s.pad), (2, 0, 1, 2, -1));
        assert!(!s.add_dummy_prefix);
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let m = model();
        for n in 0..m.len() {
            // Every truncation either parses (at a field boundary) or fails.
            let _ = parse(&m[..n], 10);
        }
        assert!(parse(&m[..m.len() - 1], 10).is_err());
        assert!(parse(&m, 2).unwrap_err().what.contains("more than 2"));
        assert!(parse(&[0x0a, 0xff, 0xff, 0xff, 0x0f], 10).is_err());
        assert!(parse(b"", 10).is_err());
    }
}
