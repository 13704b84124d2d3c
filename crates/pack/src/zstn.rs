//! The `.zstn` writer: a validated `.safetensors` in, a z4ai-readable
//! `.zstn` with sub-tensor random access and CKX1 checksums out.
//!
//! Tensors with the same bytes as an earlier one become REF records; every
//! other tensor is a frame from the per-tensor encoder ([`super::tensor`]).
//!
//! The output is assembled in record order: head, frames, the CKX1 block,
//! index, footer. Frames are compressed in parallel in bounded windows and
//! written as they complete, so memory stays bounded for any input size.

use super::tensor::{dedup, digests, encode_tensor, opaque_frame};
use super::{PackError, PackOptions, PackStats};
use ckptfs_format::ckx;
use ckptfs_format::digest::xxh3_64;
use ckptfs_format::safetensors::{self, Header};
use ckptfs_format::zstn::{self, Record, RecordKind};
use rayon::prelude::*;
use std::collections::HashMap;
use std::io::Write;

/// Packs a whole safetensors file into `out`. The input is validated before
/// the first byte is written. `progress` receives raw bytes as they are done.
pub fn pack(
    file: &[u8],
    out: &mut dyn Write,
    opts: PackOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<PackStats, PackError> {
    let (header, data) = safetensors::split_file(file)?;
    let data_len = data.len() as u64;
    let mut stats = PackStats {
        tensors: header.tensors.len(),
        raw_bytes: file.len() as u64,
        ..Default::default()
    };
    if !header.tiles(data_len) {
        return pack_opaque(&header, data, out, opts, stats);
    }
    let order = header.data_order();
    let refs = dedup(&order, data);
    let head = zstn::render_head(&header.raw, data_len, true);
    out.write_all(&head)?;
    let mut offset = head.len() as u64;

    // Compress unique tensors in windows of about 256 MiB of input.
    let uniques: Vec<usize> = (0..order.len()).filter(|&i| refs[i].is_none()).collect();
    stats.unique = uniques.len();
    let mut frame_at: HashMap<usize, (u64, u64)> = HashMap::new();
    let mut units = Vec::with_capacity(uniques.len());
    let mut i = 0;
    while i < uniques.len() {
        let mut j = i;
        let mut bytes = 0u64;
        while j < uniques.len() && (j == i || bytes < 256 << 20) {
            bytes += order[uniques[j]].len();
            j += 1;
        }
        let done: Vec<(Vec<u8>, ckx::UnitDigests)> = uniques[i..j]
            .par_iter()
            .map(|&t| {
                let e = order[t];
                let raw = &data[e.begin as usize..e.end as usize];
                let f = encode_tensor(e.known_dtype(), raw, opts);
                let d = digests(&f, raw)?;
                progress(raw.len() as u64);
                Ok((f, d))
            })
            .collect::<Result<_, PackError>>()?;
        for (k, (f, d)) in done.into_iter().enumerate() {
            out.write_all(&f)?;
            frame_at.insert(uniques[i + k], (offset, f.len() as u64));
            offset += f.len() as u64;
            units.push(d);
        }
        i = j;
    }
    let records: Vec<Record> = order
        .iter()
        .enumerate()
        .map(|(i, t)| Record {
            name: t.name.clone(),
            begin: t.begin,
            end: t.end,
            kind: match refs[i] {
                Some(j) => RecordKind::Ref(j as u32),
                None => {
                    let (offset, len) = frame_at[&i];
                    RecordKind::Frame { offset, len }
                }
            },
        })
        .collect();
    let counts: Vec<usize> = units.iter().map(|u| u.blocks.len()).collect();
    let ext_len = ckx::encoded_len(&counts) as u64;
    let index_offset = offset + ext_len;
    let index = zstn::render_index(&records);
    let footer = zstn::render_footer(index_offset, index.len() as u64);
    let mut tail = index.clone();
    tail.extend_from_slice(&footer);
    let ext = ckx::render(xxh3_64(&head), xxh3_64(&tail), &units);
    debug_assert_eq!(ext.len() as u64, ext_len);
    out.write_all(&ext)?;
    out.write_all(&tail)?;
    stats.stored_bytes = index_offset + tail.len() as u64;
    Ok(stats)
}

/// Files whose tensors do not tile the data buffer (holes, aliasing) are
/// stored as one opaque frame of the whole buffer (`contiguous = 0`), as
/// z4ai does. z4ai ignores bytes after that frame, so the CKX1 block
/// follows it.
fn pack_opaque(
    header: &Header,
    data: &[u8],
    out: &mut dyn Write,
    opts: PackOptions,
    mut stats: PackStats,
) -> Result<PackStats, PackError> {
    let mut head = zstn::render_head(&header.raw, data.len() as u64, false);
    let f = opaque_frame(data, opts);
    head.extend_from_slice(&(f.len() as u64).to_le_bytes());
    let d = digests(&f, data)?;
    let ext = ckx::render(xxh3_64(&head), xxh3_64(&[]), &[d]);
    out.write_all(&head)?;
    out.write_all(&f)?;
    out.write_all(&ext)?;
    stats.unique = 1;
    stats.stored_bytes = (head.len() + f.len() + ext.len()) as u64;
    Ok(stats)
}
