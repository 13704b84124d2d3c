//! Inputs the tests generate: safetensors files of deterministic tensors, a
//! model directory for `.blz`, and a mount store of the vectors. Everything
//! is a function of its arguments (values come from `Rng`), so a fixture
//! written twice is byte-identical: golden tests depend on that.

use super::{pack, vector_stems, vectors_dir, Rng};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// f32 -> bf16 bits with round-to-nearest-even.
pub fn bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    let round = 0x7fff + ((u >> 16) & 1);
    ((u + round) >> 16) as u16
}

/// Builds a safetensors file from (name, dtype, shape, bytes) in order.
pub fn safetensors_file(
    tensors: &[(&str, &str, Vec<u64>, Vec<u8>)],
    metadata: Option<&str>,
) -> Vec<u8> {
    let mut header = String::from("{");
    if let Some(m) = metadata {
        header.push_str(&format!("\"__metadata__\":{m}"));
        if !tensors.is_empty() {
            header.push(',');
        }
    }
    let mut off = 0u64;
    let mut data = Vec::new();
    for (i, (name, dtype, shape, bytes)) in tensors.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        let shape: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        header.push_str(&format!(
            "\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{off},{}]}}",
            shape.join(","),
            off + bytes.len() as u64
        ));
        off += bytes.len() as u64;
        data.extend_from_slice(bytes);
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut f = (header.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(header.as_bytes());
    f.extend_from_slice(&data);
    f
}

/// The tensors of safetensors file `bytes` in the order its header lists
/// them, as (name, dtype, shape, bytes): what `safetensors_file` takes.
pub fn tensors_in(bytes: &[u8]) -> Vec<(String, String, Vec<u64>, Vec<u8>)> {
    let (h, data) = ckptfs::format::safetensors::split_file(bytes).unwrap();
    h.tensors
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                t.dtype.clone(),
                t.shape.clone(),
                data[t.begin as usize..t.end as usize].to_vec(),
            )
        })
        .collect()
}

/// N(0, sigma) bf16 bytes.
pub fn gauss_bf16(rng: &mut Rng, n: usize, sigma: f64) -> Vec<u8> {
    let mut v = Vec::with_capacity(n * 2);
    for _ in 0..n {
        v.extend_from_slice(&bf16_bits((rng.normal() * sigma) as f32).to_le_bytes());
    }
    v
}

pub fn gauss_f32(rng: &mut Rng, n: usize, sigma: f64) -> Vec<u8> {
    let mut v = Vec::with_capacity(n * 4);
    for _ in 0..n {
        v.extend_from_slice(&((rng.normal() * sigma) as f32).to_le_bytes());
    }
    v
}

pub fn gauss_f16(rng: &mut Rng, n: usize, sigma: f64) -> Vec<u8> {
    let mut v = Vec::with_capacity(n * 2);
    for _ in 0..n {
        v.extend_from_slice(&f32_to_f16((rng.normal() * sigma) as f32).to_le_bytes());
    }
    v
}

/// f32 -> IEEE half with round-to-nearest-even (finite inputs of small magnitude).
pub fn f32_to_f16(x: f32) -> u16 {
    let u = x.to_bits();
    let sign = ((u >> 16) & 0x8000) as u16;
    let exp = ((u >> 23) & 0xff) as i32;
    let mant = u & 0x7fffff;
    let e = exp - 127 + 15;
    if e >= 31 {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = mant | 0x800000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rem = m & ((1 << shift) - 1);
        let mut r = m >> shift;
        if rem > half || (rem == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (mant >> 13);
    let rem = mant & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
        r += 1;
    }
    sign | r as u16
}

/// The first shard of a `ModelDir`.
pub const SHARD1: &str = "model-00001-of-00002.safetensors";
/// The second shard of a `ModelDir`.
pub const SHARD2: &str = "model-00002-of-00002.safetensors";

/// A training run of four bf16 tensors (4 MiB each by default): the first
/// stays frozen, the others move by a low mantissa bit on a third of their
/// elements at each step. The checkpoints of the delta and family tests.
pub struct TrainingRun {
    rng: Rng,
    /// The bytes of `embed`, `l0.w`, `l1.w` and `head`, in that order.
    pub tensors: Vec<Vec<u8>>,
}

impl TrainingRun {
    pub fn new(seed: u64) -> TrainingRun {
        TrainingRun::sized(seed, 2 << 20)
    }

    /// Tensors of `elems` elements (a multiple of 1024).
    pub fn sized(seed: u64, elems: usize) -> TrainingRun {
        let mut rng = Rng(seed | 1);
        let tensors = (0..4).map(|_| gauss_bf16(&mut rng, elems, 0.02)).collect();
        TrainingRun { rng, tensors }
    }

    /// This step's checkpoint, as a safetensors file.
    pub fn bytes(&self) -> Vec<u8> {
        let names = ["embed", "l0.w", "l1.w", "head"];
        let t: Vec<(&str, &str, Vec<u64>, Vec<u8>)> = self
            .tensors
            .iter()
            .zip(names)
            .map(|(b, n)| (n, "BF16", vec![b.len() as u64 / 2048, 1024], b.clone()))
            .collect();
        safetensors_file(&t, None)
    }

    /// The next step.
    pub fn advance(&mut self) {
        for t in &mut self.tensors[1..] {
            for e in t.chunks_mut(2) {
                if self.rng.below(3) == 0 {
                    e[0] ^= 1 << self.rng.below(3);
                }
            }
        }
    }
}

/// A Hugging Face style model directory, as `ckptfs pack DIR -o X.blz`
/// takes it: shards `SHARD1` (`model.embed_tokens.weight` BF16,
/// `model.layers.0.w` F32 256x256, `model.layers.0.b` F32, `model.pos_ids`
/// I64) and `SHARD2` (`lm_head.weight` tied to the embedding,
/// `model.layers.1.w` F16 300x301, `model.norm.weight` BF16), both with
/// `__metadata__`; `model.safetensors.index.json`, `config.json`, a binary
/// `tokenizer.model` (not UTF-8), `1_Pooling/config.json` and a file in
/// `1_Pooling/nested/`. The fields choose the variant a test relies on.
pub struct ModelDir {
    /// Seed of the `Rng` every tensor value and tokenizer byte comes from.
    pub seed: u64,
    /// Shape of the tied embedding; `model.norm.weight` has `embed[1]`
    /// elements.
    pub embed: [u64; 2],
    /// Adds `model.layers.0.v` to `SHARD1`: same dtype and shape as
    /// `model.layers.0.w`, other values. Without it no two blobs of the
    /// packed archive have the same length.
    pub twin: bool,
    /// Adds what is awkward to store: an empty tensor (`model.empty`, in
    /// `SHARD1`), an empty file (`empty.txt`), and a nested file whose name
    /// and text need escaping (`1_Pooling/nested/notes ü.txt`: tab, quotes,
    /// backslash, a control character). Without it the nested file is a
    /// plain `notes.txt`.
    pub edge_cases: bool,
}

impl ModelDir {
    /// Writes the directory's files into `dir`, which must exist.
    pub fn write(&self, dir: &Path) {
        let mut rng = Rng(self.seed);
        let [rows, hidden] = self.embed;
        let embed = gauss_bf16(&mut rng, (rows * hidden) as usize, 0.02);
        let mut s1 = vec![
            (
                "model.embed_tokens.weight",
                "BF16",
                vec![rows, hidden],
                embed.clone(),
            ),
            (
                "model.layers.0.w",
                "F32",
                vec![256, 256],
                gauss_f32(&mut rng, 65536, 0.02),
            ),
            (
                "model.layers.0.b",
                "F32",
                vec![256],
                gauss_f32(&mut rng, 256, 0.02),
            ),
        ];
        if self.twin {
            s1.push((
                "model.layers.0.v",
                "F32",
                vec![256, 256],
                gauss_f32(&mut rng, 65536, 0.02),
            ));
        }
        s1.push((
            "model.pos_ids",
            "I64",
            vec![100],
            (0..100u64).flat_map(|i| i.to_le_bytes()).collect(),
        ));
        if self.edge_cases {
            s1.push(("model.empty", "F32", vec![0], vec![]));
        }
        let s2 = vec![
            ("lm_head.weight", "BF16", vec![rows, hidden], embed),
            (
                "model.layers.1.w",
                "F16",
                vec![300, 301],
                gauss_f16(&mut rng, 300 * 301, 0.02),
            ),
            (
                "model.norm.weight",
                "BF16",
                vec![hidden],
                gauss_bf16(&mut rng, hidden as usize, 1.0),
            ),
        ];
        let meta = Some(r#"{"format":"pt"}"#);
        fs::write(dir.join(SHARD1), safetensors_file(&s1, meta)).unwrap();
        fs::write(dir.join(SHARD2), safetensors_file(&s2, meta)).unwrap();
        let mut map = BTreeMap::new();
        for (shard, tensors) in [(SHARD1, &s1), (SHARD2, &s2)] {
            for (name, ..) in tensors {
                map.insert(*name, shard);
            }
        }
        let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
        fs::write(
            dir.join("model.safetensors.index.json"),
            serde_json::to_string_pretty(&index).unwrap(),
        )
        .unwrap();
        fs::write(
            dir.join("config.json"),
            "{\n  \"model_type\": \"llama\",\n  \"tie_word_embeddings\": true\n}\n",
        )
        .unwrap();
        // Protobuf-like bytes, not UTF-8.
        let tok: Vec<u8> = (0..5000u64)
            .map(|i| (rng.next() as u8) | ((i % 2) as u8) << 7)
            .collect();
        fs::write(dir.join("tokenizer.model"), tok).unwrap();
        fs::create_dir_all(dir.join("1_Pooling/nested")).unwrap();
        fs::write(
            dir.join("1_Pooling/config.json"),
            "{\"pooling_mode_mean_tokens\": true}",
        )
        .unwrap();
        if self.edge_cases {
            fs::write(
                dir.join("1_Pooling/nested/notes ü.txt"),
                "tabs\tand \"quotes\" \\ \u{1}\n",
            )
            .unwrap();
            fs::write(dir.join("empty.txt"), "").unwrap();
        } else {
            fs::write(dir.join("1_Pooling/nested/notes.txt"), "nested\n").unwrap();
        }
    }
}

/// Fills a mount store: every vector archive, ckptfs-packed copies of some
/// originals, a config.json, a symlink and a subdirectory. Returns the
/// (presented name, original path) pairs.
pub fn populate_store(store: &Path) -> Vec<(String, PathBuf)> {
    let vectors = vectors_dir();
    let mut pairs = Vec::new();
    for s in vector_stems() {
        fs::copy(
            vectors.join(format!("{s}.zstn")),
            store.join(format!("{s}.zstn")),
        )
        .unwrap();
        pairs.push((
            format!("{s}.safetensors"),
            vectors.join(format!("{s}.safetensors")),
        ));
    }
    for s in [
        "bf16_dense",
        "fp32_dense",
        "tied",
        "structured",
        "ints",
        "empty_file",
    ] {
        let orig = vectors.join(format!("{s}.safetensors"));
        pack(&orig, &store.join(format!("packed_{s}.safetensors.zstn")));
        pairs.push((format!("packed_{s}.safetensors"), orig));
    }
    fs::write(
        store.join("config.json"),
        b"{\"architectures\": [\"Test\"]}\n",
    )
    .unwrap();
    std::os::unix::fs::symlink("config.json", store.join("config-link.json")).unwrap();
    fs::create_dir(store.join("sub")).unwrap();
    fs::copy(vectors.join("tiny.zstn"), store.join("sub/tiny.zstn")).unwrap();
    pairs.push((
        "sub/tiny.safetensors".into(),
        vectors.join("tiny.safetensors"),
    ));
    pairs
}

/// bf16 bits back to f32.
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// A base checkpoint and a target derived from it, as a training step or
/// fine-tune would: of `n` bf16 and f32 layers (`scale` elements each)
/// every third gets a small update (a learning-rate-sized step on every
/// element), the rest are unchanged; one tensor is renamed, one added, one
/// removed and one reshaped (same byte length, other shape). Returns
/// (base, target) `.safetensors` bytes.
pub fn delta_pair(seed: u64, n: usize, scale: usize) -> (Vec<u8>, Vec<u8>) {
    let mut rng = Rng(seed | 1);
    let mut base: Vec<(String, &str, Vec<u64>, Vec<u8>)> = Vec::new();
    for i in 0..n {
        if i % 2 == 0 {
            let v = gauss_bf16(&mut rng, scale, 0.02);
            base.push((
                format!("layers.{i}.weight"),
                "BF16",
                vec![(scale / 64) as u64, 64],
                v,
            ));
        } else {
            let v = gauss_f32(&mut rng, scale / 2, 0.02);
            base.push((
                format!("layers.{i}.weight"),
                "F32",
                vec![(scale / 128) as u64, 64],
                v,
            ));
        }
    }
    // A token embedding after a step that saw a few tokens: three rows
    // moved, the rest equal (a sparse XOR, which the delta writer stores as
    // z4ai's ZSP1 frame).
    base.push((
        "embed.weight".into(),
        "BF16",
        vec![2048, 64],
        gauss_bf16(&mut rng, 2048 * 64, 0.02),
    ));
    base.push((
        "old_name".into(),
        "BF16",
        vec![64, 64],
        gauss_bf16(&mut rng, 4096, 1.0),
    ));
    base.push((
        "removed".into(),
        "F32",
        vec![100],
        gauss_f32(&mut rng, 100, 1.0),
    ));
    base.push((
        "reshaped".into(),
        "BF16",
        vec![64, 64],
        gauss_bf16(&mut rng, 4096, 1.0),
    ));
    let mut target = Vec::new();
    for (i, (name, dtype, shape, bytes)) in base.iter().enumerate() {
        let mut b = bytes.clone();
        match name.as_str() {
            "removed" => continue,
            "old_name" => {
                target.push(("new_name".to_string(), *dtype, shape.clone(), b));
                continue;
            }
            "reshaped" => {
                target.push((name.clone(), *dtype, vec![32, 128], b));
                continue;
            }
            "embed.weight" => {
                for row in [5usize, 300, 1201] {
                    for c in b[row * 128..(row + 1) * 128].chunks_mut(2) {
                        let x = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
                        let y = x + (rng.normal() * 2e-3) as f32;
                        c.copy_from_slice(&bf16_bits(y).to_le_bytes());
                    }
                }
                target.push((name.clone(), *dtype, shape.clone(), b));
                continue;
            }
            _ => {}
        }
        if i % 3 == 0 {
            if *dtype == "BF16" {
                for c in b.chunks_mut(2) {
                    let x = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
                    let y = x + (rng.normal() * 2e-4) as f32;
                    c.copy_from_slice(&bf16_bits(y).to_le_bytes());
                }
            } else {
                for c in b.chunks_mut(4) {
                    let x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    let y = x + (rng.normal() * 2e-5) as f32;
                    c.copy_from_slice(&y.to_le_bytes());
                }
            }
        }
        target.push((name.clone(), *dtype, shape.clone(), b));
    }
    target.push((
        "added".into(),
        "BF16",
        vec![128],
        gauss_bf16(&mut rng, 128, 1.0),
    ));
    let file = |t: &[(String, &str, Vec<u64>, Vec<u8>)]| {
        let v: Vec<(&str, &str, Vec<u64>, Vec<u8>)> = t
            .iter()
            .map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.clone()))
            .collect();
        safetensors_file(&v, None)
    };
    (file(&base), file(&target))
}
