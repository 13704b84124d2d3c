//! Delta archives on the command line: `pack TARGET --base BASE` (a
//! `.z4dm` recording BASE's path relative to it; re-based when the chain
//! would grow past `format::delta::MAX_CHAIN`), `pack --standalone X.z4dm`
//! (a standalone `.zstn`), and `verify STORE` (every delta relation in a
//! store).

use super::{progress, Global, Result};
use crate::archive::{self, ArchiveView, DeltaArchive};
use crate::format::delta::MAX_CHAIN;
use crate::fsutil::{relative, write_atomic};
use crate::pack::delta::{pack_delta, DeltaBase};
use crate::pack::{pack, PackOptions};
use anyhow::Context as _;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// `X.safetensors` -> `X.z4dm`; anything else gets `.z4dm` appended.
pub fn default_delta_output(input: &Path) -> PathBuf {
    let s = input.to_string_lossy();
    match s.strip_suffix(".safetensors") {
        Some(b) => PathBuf::from(format!("{b}.z4dm")),
        None => PathBuf::from(format!("{s}.z4dm")),
    }
}

/// `X.z4dm` -> `X.zstn`.
pub fn default_standalone_output(input: &Path) -> PathBuf {
    let s = input.to_string_lossy();
    match s.strip_suffix(".z4dm") {
        Some(b) => PathBuf::from(format!("{b}.zstn")),
        None => PathBuf::from(format!("{s}.zstn")),
    }
}

fn map(path: &Path) -> Result<memmap2::Mmap> {
    let f = std::fs::File::open(path).with_context(|| path.display().to_string())?;
    // SAFETY: read-only private map; the input must not change while
    // packing (the digests written are of the bytes read).
    unsafe { memmap2::Mmap::map(&f) }.with_context(|| path.display().to_string())
}

/// The presented bytes of an archive, decoded into memory.
fn decode_all(a: &dyn ArchiveView) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    archive::write_to(a, 0, &mut v, &|_| {})?;
    Ok(v)
}

/// Bytes of the base, held for packing.
enum BaseBytes {
    Map(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl BaseBytes {
    fn bytes(&self) -> &[u8] {
        match self {
            BaseBytes::Map(m) => m,
            BaseBytes::Owned(v) => v,
        }
    }
}

/// Opens a base for packing: (its bytes, chain depth, fingerprint, path).
/// A delta at the chain limit is replaced by its own base (re-basing),
/// as often as needed.
fn open_pack_base(g: Global, base: &Path) -> Result<(BaseBytes, u32, u64, PathBuf)> {
    let mut path = base.to_path_buf();
    loop {
        let mut head = [0u8; 8];
        let n = {
            use std::io::Read;
            let mut f = std::fs::File::open(&path).with_context(|| path.display().to_string())?;
            f.read(&mut head)
                .with_context(|| path.display().to_string())?
        };
        if archive::Kind::detect(&head[..n]).is_none() {
            return Ok((BaseBytes::Map(map(&path)?), 0, 0, path));
        }
        let a = archive::open(&path)?;
        if a.files() != 1 || !a.file_path(0).is_empty() {
            anyhow::bail!(
                "{}: a model-directory archive cannot be a delta's base",
                path.display()
            );
        }
        let any = &*a as &dyn std::any::Any;
        let depth = any.downcast_ref::<DeltaArchive>().map_or(0, |d| d.depth());
        if depth >= MAX_CHAIN {
            let d = any.downcast_ref::<DeltaArchive>().expect("a delta");
            let next = d.base().path().to_path_buf();
            if !g.quiet {
                eprintln!(
                    "{}: a delta at the chain limit ({MAX_CHAIN}): re-basing against its base {}",
                    path.display(),
                    next.display()
                );
            }
            path = next;
            continue;
        }
        let fp = a.fingerprint().unwrap_or(0);
        return Ok((BaseBytes::Owned(decode_all(&*a)?), depth, fp, path));
    }
}

/// `ckptfs pack INPUT --base BASE [-o OUT]`.
pub fn pack_against(
    g: Global,
    input: &Path,
    base: &Path,
    output: Option<&Path>,
    opts: PackOptions,
    force: bool,
) -> Result<()> {
    let out = output.map_or_else(|| default_delta_output(input), Path::to_path_buf);
    let t = Instant::now();
    let target = map(input)?;
    crate::format::safetensors::split_file(&target).with_context(|| input.display().to_string())?;
    let (bytes, depth, fingerprint, base_path) = open_pack_base(g, base)?;
    crate::format::safetensors::split_file(bytes.bytes())
        .with_context(|| format!("{}: base", base_path.display()))?;
    let abs = |p: &Path| -> Result<PathBuf> {
        std::path::absolute(p).with_context(|| p.display().to_string())
    };
    let base_abs =
        std::fs::canonicalize(&base_path).with_context(|| base_path.display().to_string())?;
    let out_abs = abs(&out)?;
    let out_dir = out_abs.parent().unwrap_or(Path::new("/"));
    let out_dir = std::fs::canonicalize(out_dir).with_context(|| out_dir.display().to_string())?;
    if out_dir.join(out_abs.file_name().unwrap_or_default()) == base_abs {
        anyhow::bail!("{}: the output would replace its own base", out.display());
    }
    let rel = relative(&out_dir, &base_abs);
    let rel = rel
        .to_str()
        .with_context(|| format!("{}: base path is not UTF-8", base_abs.display()))?
        .to_string();
    let pb = progress(g, target.len() as u64, "pack");
    let mut stats = None;
    write_atomic(&out, force, |w| {
        let s = pack_delta(
            &target,
            &DeltaBase {
                bytes: bytes.bytes(),
                rel_path: rel.clone(),
                depth,
                fingerprint,
            },
            w as &mut dyn Write,
            opts,
            &|n| pb.inc(n),
        )
        .map_err(std::io::Error::other)?;
        stats = Some(s);
        Ok(())
    })
    .with_context(|| out.display().to_string())?;
    pb.finish_and_clear();
    let s = stats.expect("set on success");
    if !g.quiet {
        let secs = t.elapsed().as_secs_f64();
        eprintln!(
            "{} -> {} (base {rel}, chain depth {}): {} tensors ({} COPY, {} DELTA, {} FULL), {} -> {} bytes, ratio {:.4}, {:.0} MB/s",
            input.display(),
            out.display(),
            depth + 1,
            s.tensors,
            s.copy,
            s.delta,
            s.full,
            s.raw_bytes,
            s.stored_bytes,
            s.raw_bytes as f64 / s.stored_bytes.max(1) as f64,
            s.raw_bytes as f64 / 1e6 / secs.max(1e-9)
        );
    }
    Ok(())
}

/// `ckptfs pack --standalone X.z4dm [-o Y.zstn]`: the delta's presented
/// file (base found by its recorded path) packed alone.
pub fn standalone(
    g: Global,
    input: &Path,
    output: Option<&Path>,
    opts: PackOptions,
    force: bool,
) -> Result<()> {
    let out = output.map_or_else(|| default_standalone_output(input), Path::to_path_buf);
    let a = archive::open(input)?;
    if a.files() != 1 || !a.file_path(0).is_empty() {
        anyhow::bail!("{}: not a single-file archive", input.display());
    }
    let bytes = decode_all(&*a)?;
    let pb = progress(g, bytes.len() as u64, "pack");
    let mut stats = None;
    write_atomic(&out, force, |w| {
        let s = pack(&bytes, w as &mut dyn Write, opts, &|n| pb.inc(n))
            .map_err(std::io::Error::other)?;
        stats = Some(s);
        Ok(())
    })
    .with_context(|| out.display().to_string())?;
    pb.finish_and_clear();
    if !g.quiet {
        let s = stats.expect("set on success");
        eprintln!(
            "{} -> {}: standalone, {} -> {} bytes",
            input.display(),
            out.display(),
            s.raw_bytes,
            s.stored_bytes
        );
    }
    Ok(())
}

/// `ckptfs verify STORE`: every `.z4dm` under `store` opened (base present
/// inside the store, tensors and length as recorded, chain depth within
/// bounds) and its base's content checked against the recorded digests.
/// Returns (relations checked, failures); prints one line per delta.
pub fn verify_store(store: &Path) -> Result<(usize, usize)> {
    let root = std::fs::canonicalize(store).with_context(|| store.display().to_string())?;
    let deltas: Vec<PathBuf> = store_archives(&root)?
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".z4dm"))
        .collect();
    let fs = StoreFs { root: root.clone() };
    let mut failed = 0;
    for p in &deltas {
        let shown = p.strip_prefix(&root).unwrap_or(p).display().to_string();
        let r = (|| -> Result<String> {
            let f = std::fs::File::open(p).with_context(|| shown.clone())?;
            let a = archive::from_file_with(&f, p, &fs)?;
            let d = (&*a as &dyn std::any::Any)
                .downcast_ref::<DeltaArchive>()
                .with_context(|| format!("{shown}: not a ckptfs delta"))?;
            d.verify_structure()?;
            Ok(format!(
                "based on {} (chain depth {}), base content matches",
                d.base_rel(),
                d.depth()
            ))
        })();
        match r {
            Ok(m) => println!("OK    {shown}: {m}"),
            Err(e) => {
                failed += 1;
                println!("FAIL  {shown}: {}", super::one_line(&*e));
            }
        }
    }
    for line in family_lines(&root)? {
        println!("{line}");
    }
    Ok((deltas.len(), failed))
}

/// The `FAMILY` lines of the store `root` (canonical), from the trailer of
/// every `.z4dm` in it (`verify STORE` and `repack` print them).
pub fn family_lines(root: &Path) -> Result<Vec<String>> {
    // (delta, base), store-relative.
    let mut edges: Vec<(String, String)> = Vec::new();
    for p in store_archives(root)?
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".z4dm"))
    {
        if let Ok(Some(t)) = std::fs::read(&p)
            .map_err(|e| e.to_string())
            .and_then(|b| crate::format::delta::Trailer::find(&b))
        {
            let base = p.parent().unwrap_or(root).join(&t.base_path);
            if let Ok(b) = std::fs::canonicalize(base) {
                edges.push((
                    p.strip_prefix(root).unwrap_or(&p).display().to_string(),
                    b.strip_prefix(root).unwrap_or(&b).display().to_string(),
                ));
            }
        }
    }
    Ok(render_families(&edges))
}

/// One line per family: its standalone root, then the deltas against it,
/// each followed by those against it (`A <- B <- C`: B is a delta against
/// A, C against B; `[X | Y]` where two deltas share a base).
fn render_families(edges: &[(String, String)]) -> Vec<String> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut kids: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let deltas: BTreeSet<&str> = edges.iter().map(|e| e.0.as_str()).collect();
    for (d, b) in edges {
        kids.entry(b.as_str()).or_default().push(d.as_str());
    }
    fn render(n: &str, kids: &BTreeMap<&str, Vec<&str>>, left: u32) -> String {
        match kids.get(n).map(Vec::as_slice) {
            _ if left == 0 => format!("{n} <- ..."),
            None | Some([]) => n.to_string(),
            Some([k]) => format!("{n} <- {}", render(k, kids, left - 1)),
            Some(ks) => format!(
                "{n} <- [{}]",
                ks.iter()
                    .map(|k| render(k, kids, left - 1))
                    .collect::<Vec<_>>()
                    .join(" | ")
            ),
        }
    }
    kids.keys()
        .filter(|b| !deltas.contains(*b))
        .map(|root| format!("FAMILY {}", render(root, &kids, 16)))
        .collect()
}

/// Every regular file under the store `root` (canonical) whose name the
/// mount presents from an archive (`.zstn`, `.zsame`, `.z4dm`, `.blz`),
/// sorted; the spool is not walked (its files are not archives yet).
pub fn store_archives(root: &Path) -> Result<Vec<PathBuf>> {
    let mut stack = vec![root.to_path_buf()];
    let mut found = Vec::new();
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| d.display().to_string())? {
            let e = e.with_context(|| d.display().to_string())?;
            let ft = e
                .file_type()
                .with_context(|| e.path().display().to_string())?;
            let name = e.file_name();
            if ft.is_dir() && name != crate::fs::spool::SPOOL_DIR {
                stack.push(e.path());
            } else if ft.is_file() && crate::fs::namespace::is_archive_name(&name) {
                found.push(e.path());
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Opens the archive `path` of the store `root` (canonical), a delta's
/// base resolved inside the store as the mount resolves it.
pub fn open_in_store(root: &Path, path: &Path) -> Result<std::sync::Arc<dyn ArchiveView>> {
    let f = std::fs::File::open(path).with_context(|| path.display().to_string())?;
    let fs = StoreFs {
        root: root.to_path_buf(),
    };
    Ok(archive::from_file_with(&f, path, &fs)?)
}

/// Bases resolved inside a store root, never outside it.
struct StoreFs {
    root: PathBuf,
}

impl archive::BaseFs for StoreFs {
    fn open_base(&self, from: &Path, rel: &str) -> std::io::Result<(std::fs::File, PathBuf)> {
        let p = from.parent().unwrap_or(Path::new("")).join(rel);
        let c = std::fs::canonicalize(&p)?;
        if !c.starts_with(&self.root) {
            return Err(std::io::Error::other("outside the store"));
        }
        Ok((std::fs::File::open(&c)?, p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths() {
        let r = |a: &str, b: &str| relative(Path::new(a), Path::new(b));
        assert_eq!(
            r("/s/step-2", "/s/step-1/m.zstn"),
            Path::new("../step-1/m.zstn")
        );
        assert_eq!(r("/s", "/s/m.zstn"), Path::new("m.zstn"));
        assert_eq!(r("/s/a/b", "/s/m.zstn"), Path::new("../../m.zstn"));
    }
}
