//! `ckptfs seal`: add ckptfs's CKX1 checksums to z4ai-written `.zstn`
//! files in place (the work is [`crate::pack::seal`]), or ckptfs's header
//! digest to a BLAZE-X `.blz` ([`crate::pack::seal_blazex`]), told apart by
//! magic. One line per file; exit 1 if any file could not be sealed.

use super::{progress, Global, Result};
use crate::archive::ZstnArchive;
use crate::cli::SealArgs;
use crate::pack::seal::{seal_file, SealOptions, SealOutcome};
use std::process::ExitCode;

pub fn run(g: Global, a: SealArgs) -> Result<ExitCode> {
    if a.sha256.is_some() && a.files.len() > 1 {
        eprintln!("ckptfs: --sha256 names the content of one file: give a single FILE with it");
        return Ok(ExitCode::from(2));
    }
    let opts = SealOptions {
        expect_sha256: a.sha256,
        force: a.force,
    };
    let mut failed = false;
    for path in &a.files {
        if is_blazex(path) {
            failed |= !seal_blazex(g, path, &a);
            continue;
        }
        // Progress counts presented bytes; opening reads only the index.
        let total = ZstnArchive::open(path).map_or(0, |z| z.len());
        let pb = progress(g, total, "seal");
        let r = seal_file(path, opts, &|n| pb.inc(n));
        pb.finish_and_clear();
        match r {
            Ok(SealOutcome::AlreadySealed { sealed }) => println!(
                "{}: already sealed (ckx1, {})",
                path.display(),
                if sealed { "sealed" } else { "ckptfs-written" }
            ),
            Ok(SealOutcome::Sealed(s)) => println!(
                "{}: sealed ({} frames, {} blocks, {} bytes of checksums added{})",
                path.display(),
                s.frames,
                s.blocks,
                s.added_bytes,
                if a.sha256.is_some() {
                    ", sha256 matched"
                } else {
                    ""
                }
            ),
            Err(e) => {
                eprintln!("ckptfs: {}", super::one_line(&e));
                failed = true;
            }
        }
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// True when `path` starts with BLAZE-X's magic.
fn is_blazex(path: &std::path::Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| &head == crate::format::blazex::MAGIC)
}

/// Seals one BLAZE-X archive, printing one line; false when it failed.
fn seal_blazex(g: Global, path: &std::path::Path, a: &SealArgs) -> bool {
    use crate::pack::BlazexSealOutcome;
    if a.sha256.is_some() {
        eprintln!(
            "ckptfs: {}: --sha256 names a .zstn's presented file; a BLAZE-X archive is sealed without it",
            path.display()
        );
        return false;
    }
    let total = std::fs::metadata(path).map_or(0, |m| m.len());
    let pb = progress(g, total, "seal");
    let r = crate::pack::seal_blazex(path, a.force, &|n| pb.inc(n));
    pb.finish_and_clear();
    match r {
        Ok(BlazexSealOutcome::AlreadySealed) => {
            println!(
                "{}: already sealed (BLAZE-X header digest {})",
                path.display(),
                crate::format::blazex::DIGEST_KEY
            );
            true
        }
        Ok(BlazexSealOutcome::Sealed {
            tensors,
            added_bytes,
        }) => {
            println!(
                "{}: sealed (BLAZE-X: {tensors} tensors and the data SHA-256 checked, header digest {} added, {added_bytes} bytes)",
                path.display(),
                crate::format::blazex::DIGEST_KEY
            );
            true
        }
        Err(e) => {
            eprintln!("ckptfs: {}", super::one_line(&e));
            false
        }
    }
}
