//! SentencePiece `tokenizer.model` (llama/mistral-style checkpoints without
//! a tokenizer.json): the vocabulary, scores and piece types GGUF's
//! `tokenizer.ggml.model = llama` takes, read from the model's protobuf.
//!
//! Only the few fields needed are read (field numbers from
//! sentencepiece_model.proto): `ModelProto.pieces` (1: piece string,
//! 2: score float, 3: type enum), `trainer_spec` (2: model_type 3, unk_id
//! 40, bos_id 41, eos_id 42, pad_id 43) and `normalizer_spec` (3:
//! add_dummy_prefix 3); everything else is skipped by wire type. Parsed
//! here rather than with a protobuf crate: prost needs the .proto compiled
//! at build time for five fields, and the sentencepiece crates bind the
//! C++ library. Every length is checked against the bytes left before
//! it is used, and the piece count is bounded by the caller.

use std::fmt;

/// A protobuf decoding error, with the offset it occurred at.
#[derive(Debug, PartialEq, Eq)]
pub struct SpmError {
    pub offset: usize,
    pub what: String,
}

impl fmt::Display for SpmError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "offset {}: {}", self.offset, self.what)
    }
}

/// Piece type NORMAL (sentencepiece's types equal GGUF's token types:
/// 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte).
pub const NORMAL: i32 = 1;

#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    pub text: String,
    pub score: f32,
    pub ty: i32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Spm {
    pub pieces: Vec<Piece>,
    /// TrainerSpec.model_type: 1 unigram, 2 BPE, 3 word, 4 char.
    pub model_type: u64,
    pub unk: i64,
    pub bos: i64,
    pub eos: i64,
    pub pad: i64,
    pub add_dummy_prefix: bool,
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
    /// Offset of `b` in the whole file (for messages).
    base: usize,
}

impl<'a> Reader<'a> {
    fn err(&self, what: impl Into<String>) -> SpmError {
        SpmError {
            offset: self.base + self.pos,
            what: what.into(),
        }
    }
    fn done(&self) -> bool {
        self.pos >= self.b.len()
    }
    fn varint(&mut self) -> Result<u64, SpmError> {
        let mut v = 0u64;
        for i in 0..10 {
            let Some(&x) = self.b.get(self.pos) else {
                return Err(self.err("truncated varint"));
            };
            self.pos += 1;
            v |= ((x & 0x7f) as u64) << (7 * i);
            if x & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.err("varint longer than 10 bytes"))
    }
    fn take(&mut self, n: u64) -> Result<Reader<'a>, SpmError> {
        let left = (self.b.len() - self.pos) as u64;
        if n > left {
            return Err(self.err(format!("field of {n} bytes, {left} left")));
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(Reader {
            b: &self.b[start..self.pos],
            pos: 0,
            base: self.base + start,
        })
    }
    /// The next (field number, wire type).
    fn key(&mut self) -> Result<(u64, u64), SpmError> {
        let k = self.varint()?;
        Ok((k >> 3, k & 7))
    }
    /// A field's value: varint, fixed 32/64 bits as u64, or bytes.
    fn value(&mut self, wire: u64) -> Result<Value<'a>, SpmError> {
        match wire {
            0 => Ok(Value::Int(self.varint()?)),
            1 => {
                let r = self.take(8)?;
                Ok(Value::Int(u64::from_le_bytes(r.b.try_into().unwrap())))
            }
            2 => {
                let n = self.varint()?;
                Ok(Value::Bytes(self.take(n)?))
            }
            5 => {
                let r = self.take(4)?;
                Ok(Value::Int(
                    u32::from_le_bytes(r.b.try_into().unwrap()) as u64
                ))
            }
            w => Err(self.err(format!("unsupported wire type {w}"))),
        }
    }
}

enum Value<'a> {
    Int(u64),
    Bytes(Reader<'a>),
}

/// Parses a `tokenizer.model`; at most `max_pieces` pieces.
pub fn parse(b: &[u8], max_pieces: usize) -> Result<Spm, SpmError> {
    let mut spm = Spm {
        pieces: Vec::new(),
        model_type: 1,
        unk: 0,
        bos: 1,
        eos: 2,
        pad: -1,
        add_dummy_prefix: true,
    };
    let mut r = Reader { b, pos: 0, base: 0 };
    while !r.done() {
        let at = r.pos;
        let (field, wire) = r.key()?;
        let v = r.value(wire)?;
        match (field, v) {
            (1, Value::Bytes(p)) => {
                if spm.pieces.len() >= max_pieces {
                    return Err(SpmError {
                        offset: at,
                        what: format!("more than {max_pieces} pieces"),
                    });
                }
                spm.pieces.push(piece(p)?);
            }
            (2, Value::Bytes(mut t)) => {
                while !t.done() {
                    let (f, w) = t.key()?;
                    if let (f @ (3 | 40 | 41 | 42 | 43), Value::Int(x)) = (f, t.value(w)?) {
                        // int32 fields: negative values are 10-byte varints.
                        let x = x as i64 as i32 as i64;
                        match f {
                            3 => spm.model_type = x as u64,
                            40 => spm.unk = x,
                            41 => spm.bos = x,
                            42 => spm.eos = x,
                            _ => spm.pad = x,
                        }
                    }
                }
            }
            (3, Value::Bytes(mut n)) => {
                while !n.done() {
                    let (f, w) = n.key()?;
                    if let (3, Value::Int(x)) = (f, n.value(w)?) {
                        spm.add_dummy_prefix = x != 0;
                    }
                }
            }
            (1..=3, Value::Int(_)) => {
                return Err(SpmError {
                    offset: at,
                    what: format!("field {field} is not a message"),
                })
            }
            _ => {}
        }
    }
    if spm.pieces.is_empty() {
        return Err(SpmError {
            offset: 0,
            what: "no pieces: not a SentencePiece model".into(),
        });
    }
    Ok(spm)
}

fn piece(mut p: Reader) -> Result<Piece, SpmError> {
    let mut out = Piece {
        text: String::new(),
        score: 0.0,
        ty: NORMAL,
    };
    while !p.done() {
        let at = p.pos;
        let (f, w) = p.key()?;
        match (f, p.value(w)?) {
            (1, Value::Bytes(s)) => {
                out.text = String::from_utf8(s.b.to_vec()).map_err(|_| SpmError {
                    offset: s.base,
                    what: "piece is not UTF-8".into(),
                })?;
            }
            (2, Value::Int(x)) if w == 5 => out.score = f32::from_bits(x as u32),
            (3, Value::Int(x)) if (1..=6).contains(&x) => out.ty = x as i32,
            (1..=3, _) => {
                return Err(SpmError {
                    offset: p.base + at,
                    what: format!("piece field {f} of the wrong type"),
                })
            }
            _ => {}
        }
    }
    Ok(out)
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
