//! `ckptfs unpack`: restore the original file, byte for byte, atomically.

use super::{open_input, progress, Global, Input, Result};
use crate::archive::{Archive, BlockKey};
use crate::cli::UnpackArgs;
use crate::format::frame::Frame;
use crate::fsutil::write_atomic;
use rayon::prelude::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Default output name: strip `.zstn`, add `.safetensors` unless present;
/// for a bare frame strip `.z4ai` (else append `.out`, as z4ai does).
pub fn default_output(input: &Path, frame: bool) -> PathBuf {
    let s = input.to_string_lossy();
    if frame {
        return PathBuf::from(match s.strip_suffix(".z4ai") {
            Some(base) => base.to_string(),
            None => format!("{s}.out"),
        });
    }
    let base = s.strip_suffix(".zstn").unwrap_or(&s);
    if base.ends_with(".safetensors") {
        PathBuf::from(base)
    } else {
        PathBuf::from(format!("{base}.safetensors"))
    }
}

pub fn run(g: Global, a: UnpackArgs) -> Result<ExitCode> {
    if super::blz::is_blz(&a.input) {
        return super::blz::unpack(g, &a.input, a.output, a.force);
    }
    let input = open_input(&a.input)?;
    let out = a
        .output
        .clone()
        .unwrap_or_else(|| default_output(&a.input, matches!(input, Input::Frame(_))));
    let oname = out.display().to_string();
    let werr = |e: std::io::Error| format!("{oname}: {e}");
    match input {
        Input::Zstn(archive) => {
            let pb = progress(g, archive.logical_len(), "unpack");
            write_atomic(&out, a.force, |w| {
                write_archive(&archive, w, &|n| pb.inc(n)).map_err(std::io::Error::other)
            })
            .map_err(werr)?;
            pb.finish_and_clear();
        }
        Input::Frame(map) => {
            let frame = Frame::parse(&map).map_err(|e| format!("{}: {e}", a.input.display()))?;
            let mut buf = vec![0u8; frame.decoded_len() as usize];
            frame
                .decode(&mut buf)
                .map_err(|e| format!("{}: {e}", a.input.display()))?;
            write_atomic(&out, a.force, |w| w.write_all(&buf)).map_err(werr)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Blocks in output order: every record's unit, REFs repeating their target.
pub fn blocks_in_order(archive: &Archive) -> crate::archive::Result<Vec<BlockKey>> {
    let mut keys = Vec::new();
    for (_, span, unit) in archive.segments() {
        if span.is_empty() {
            continue;
        }
        let g = archive.grid(unit)?;
        keys.extend((0..g.blocks() as u32).map(|block| BlockKey { unit, block }));
    }
    Ok(keys)
}

/// Streams the reconstructed file: blocks are decoded in parallel windows
/// of bounded size and written in order.
pub fn write_archive(
    archive: &Archive,
    w: &mut dyn Write,
    on_progress: &dyn Fn(u64),
) -> std::result::Result<(), crate::commands::Error> {
    let mut head = vec![0u8; archive.container().data_start() as usize];
    archive.read_at(0, &mut head)?;
    w.write_all(&head)?;
    let keys = blocks_in_order(archive)?;
    const WINDOW: u64 = 64 << 20;
    let mut i = 0;
    while i < keys.len() {
        let mut j = i;
        let mut bytes = 0;
        while j < keys.len() && (j == i || bytes < WINDOW) {
            bytes += archive.block_len(keys[j])?;
            j += 1;
        }
        let decoded: Vec<Vec<u8>> = keys[i..j]
            .par_iter()
            .map(|k| archive.decode_block(*k))
            .collect::<crate::archive::Result<_>>()?;
        for d in &decoded {
            w.write_all(d)?;
            on_progress(d.len() as u64);
        }
        i = j;
    }
    Ok(())
}
