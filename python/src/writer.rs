//! Writing an archive from tensors in memory: the safetensors file they
//! make (laid out as the `safetensors` package lays it out: tensors by
//! decreasing alignment then name, the header padded to 8 bytes), packed
//! as `ckptfs pack` packs a file, written atomically (a sibling temporary
//! file, fsync, rename, fsync of the directory).

use crate::errors::{io, NativeError, Result};
use ckptfs::format::safetensors::Dtype;
use ckptfs::pack::{pack, PackOptions};
use rayon::prelude::*;
use serde_json::{json, Map, Value};
use std::path::Path;

/// Copies are cut into pieces of this size, in parallel.
const COPY_PIECE: usize = 4 << 20;

/// One tensor: `len` bytes of contiguous little-endian memory at `addr`,
/// kept alive by the caller for the duration of the call.
pub struct Item {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    pub addr: usize,
    pub len: u64,
}

fn bad(msg: String) -> NativeError {
    NativeError::Format(msg)
}

/// The safetensors file of `items`.
fn serialize(items: &[Item], metadata: Option<&[(String, String)]>) -> Result<Vec<u8>> {
    let mut order: Vec<(&Item, Dtype)> = Vec::with_capacity(items.len());
    for it in items {
        let dtype = Dtype::parse(&it.dtype).ok_or_else(|| {
            bad(format!(
                "tensor {:?}: unknown dtype {:?}",
                it.name, it.dtype
            ))
        })?;
        let elems = it
            .shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .and_then(|n| n.checked_mul(dtype.bits()))
            .map(|bits| bits.div_ceil(8));
        if elems != Some(it.len) {
            return Err(bad(format!(
                "tensor {:?}: {} bytes for shape {:?} of {}",
                it.name, it.len, it.shape, it.dtype
            )));
        }
        order.push((it, dtype));
    }
    order.sort_by(|(a, da), (b, db)| db.bits().cmp(&da.bits()).then(a.name.cmp(&b.name)));
    if let Some(w) = order.windows(2).find(|w| w[0].0.name == w[1].0.name) {
        return Err(bad(format!("tensor {:?} given twice", w[0].0.name)));
    }
    let mut header = Map::new();
    if let Some(m) = metadata {
        let m: Map<String, Value> = m
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        header.insert("__metadata__".into(), Value::Object(m));
    }
    let mut at = 0u64;
    for (it, dtype) in &order {
        header.insert(
            it.name.clone(),
            json!({"dtype": dtype.name(), "shape": it.shape, "data_offsets": [at, at + it.len]}),
        );
        at += it.len;
    }
    let mut text =
        serde_json::to_string(&Value::Object(header)).map_err(|e| bad(format!("header: {e}")))?;
    while text.len() % 8 != 0 {
        text.push(' ');
    }
    let data_start = 8 + text.len();
    let total = data_start + at as usize;
    // Zeroed by the allocator (fresh pages), then every data byte written.
    let mut file = vec![0u8; total];
    file[..8].copy_from_slice(&(text.len() as u64).to_le_bytes());
    file[8..data_start].copy_from_slice(text.as_bytes());
    let mut pieces: Vec<(&mut [u8], usize)> = Vec::new();
    let mut rest = &mut file[data_start..];
    for (it, _) in &order {
        let (mine, after) = rest.split_at_mut(it.len as usize);
        rest = after;
        for (k, chunk) in mine.chunks_mut(COPY_PIECE).enumerate() {
            pieces.push((chunk, it.addr + k * COPY_PIECE));
        }
    }
    pieces.into_par_iter().for_each(|(dst, addr)| {
        // SAFETY: `Item`'s contract: `len` readable bytes at `addr`, of
        // which this piece is a part.
        let src = unsafe { std::slice::from_raw_parts(addr as *const u8, dst.len()) };
        dst.copy_from_slice(src);
    });
    Ok(file)
}

/// Packs `items` into `path` (atomically), or into bytes returned when
/// `path` is None.
pub fn save(
    items: &[Item],
    metadata: Option<&[(String, String)]>,
    level: i32,
    compat: &str,
    path: Option<&str>,
) -> Result<Option<Vec<u8>>> {
    if !(1..=19).contains(&level) {
        return Err(bad(format!("level {level}: not in 1..=19")));
    }
    // As `ckptfs pack --compat`: split-float frames by default, only what
    // z4ai 0.2.0 reads with "z4ai".
    let compat = match compat {
        "ckptfs" => ckptfs::pack::Compat::Ckptfs,
        "z4ai" => ckptfs::pack::Compat::Z4ai,
        c => return Err(bad(format!("compat {c:?}: not \"ckptfs\" or \"z4ai\""))),
    };
    let file = serialize(items, metadata)?;
    let opts = PackOptions { level, compat };
    let Some(path) = path else {
        let mut out = Vec::new();
        pack(&file, &mut out, opts, &|_| {}).map_err(|e| io("pack", std::io::Error::other(e)))?;
        return Ok(Some(out));
    };
    ckptfs::fsutil::write_atomic(Path::new(path), true, |w| {
        pack(&file, w, opts, &|_| {})
            .map(|_| ())
            .map_err(std::io::Error::other)
    })
    .map_err(|e| io(path, e))?;
    Ok(None)
}
