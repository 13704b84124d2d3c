//! Real-mount tests of the mmap path (issue 45): what a loader that maps
//! the file costs the daemon. torch's `safe_open(..., "pt")` maps the file
//! privately, advises sequential access and touches the first page of
//! every tensor as it lists them; transformers then copies the tensors
//! into the model in its parameter order, which is not the file's order.
//! Whatever the order of the page faults, a cold load must decode each
//! block once: the daemon's counters (`user.ckptfs.stats` on the mount's
//! root) say how many blocks it decoded and how many more than once.

use crate::common;

use common::{daemon_stats, pack, Mount, Rng};
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::Path;

const MIB: u64 = 1 << 20;

/// A llama-like bf16 model of two layers (260 MiB): (name, bytes), in the
/// file's order (safetensors writes names sorted), and the order a model's
/// modules list them (embedding, then each layer's attention, MLP, norms).
/// Tensors are as large as a 1B model's (8 and 22 MiB, a 64 MiB
/// embedding), so that they are larger than the kernel's read-around.
fn model() -> (Vec<(String, u64)>, Vec<String>) {
    let mut params = vec![("model.embed_tokens.weight".to_string(), 64 * MIB)];
    for l in 0..2 {
        let p = format!("model.layers.{l}.");
        for n in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            params.push((format!("{p}self_attn.{n}.weight"), 8 * MIB));
        }
        for n in ["gate_proj", "up_proj", "down_proj"] {
            params.push((format!("{p}mlp.{n}.weight"), 22 * MIB));
        }
        params.push((format!("{p}input_layernorm.weight"), 1024));
        params.push((format!("{p}post_attention_layernorm.weight"), 1024));
    }
    params.push(("model.norm.weight".to_string(), 1024));
    let order = params.iter().map(|(n, _)| n.clone()).collect();
    let mut file = params;
    file.sort();
    (file, order)
}

/// Writes the model as one safetensors file; returns each tensor's byte
/// range in the file, by name.
fn write_model(path: &Path) -> Vec<(String, std::ops::Range<u64>)> {
    let (tensors, _) = model();
    let mut header = String::from("{");
    let mut off = 0;
    let mut data_ranges = Vec::new();
    for (i, (name, len)) in tensors.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"{name}\":{{\"dtype\":\"BF16\",\"shape\":[{}],\"data_offsets\":[{off},{}]}}",
            len / 2,
            off + len
        ));
        data_ranges.push((name.clone(), off..off + len));
        off += len;
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
    f.write_all(header.as_bytes()).unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut buf = vec![0u8; 4096];
    let mut left = off as usize;
    while left > 0 {
        for c in buf.chunks_exact_mut(8) {
            let r = rng.next();
            for k in 0..4 {
                // Roughly N(0, 0.02) in bf16, as trained weights.
                let x = (r >> (16 * k)) as u16;
                let v = (x & 0x8000) | ((0x76 + (x >> 7) % 5) << 7) | (x & 0x7f);
                c[2 * k..2 * k + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        let n = left.min(buf.len());
        f.write_all(&buf[..n]).unwrap();
        left -= n;
    }
    f.flush().unwrap();
    let start = 8 + header.len() as u64;
    data_ranges
        .into_iter()
        .map(|(n, r)| (n, r.start + start..r.end + start))
        .collect()
}

/// A private writable mapping of the whole file, as torch's
/// `UntypedStorage.from_file(shared=False)` makes, with the sequential
/// advice it gives.
struct Private {
    ptr: *mut u8,
    len: usize,
}

impl Private {
    fn map(f: &std::fs::File) -> Private {
        let len = f.metadata().unwrap().len() as usize;
        // SAFETY: a fresh mapping of `len` bytes of an open file; nothing
        // else uses the address range.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        // SAFETY: advice only.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, len as i64, libc::POSIX_FADV_SEQUENTIAL) };
        Private {
            ptr: ptr as *mut u8,
            len,
        }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is `len` bytes, readable, alive with `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, not used after this.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

#[test]
fn an_mmap_load_in_model_order_decodes_every_block_once() {
    let orig = std::sync::Mutex::new(None);
    let mut m = Mount::new(
        |store| {
            let src = store.join("../model.safetensors");
            *orig.lock().unwrap() = Some(write_model(&src));
            pack(&src, &store.join("model.zstn"));
        },
        &["--cache-size", "64M"],
    );
    let ranges = orig.into_inner().unwrap().unwrap();
    let want = std::fs::read(m.store.join("../model.safetensors")).unwrap();
    let archive = ckptfs::archive::open(&m.store.join("model.zstn")).unwrap();
    let stored = ckptfs::archive::blocks_of(&*archive, 0).unwrap().len() as u64;
    assert!(
        stored >= 100,
        "{stored} blocks: the model spans many blocks"
    );
    let (_, order) = model();
    let range_of = |name: &str| ranges.iter().find(|(n, _)| n == name).unwrap().1.clone();

    // numpy's loader: each tensor copied out of a read-only mapping, in
    // the file's order. Then torch's and transformers': a private
    // mapping, the first page of every tensor touched in the file's order
    // (`get_tensor`), then each tensor copied in the model's order.
    for torch in [false, true] {
        let f = std::fs::File::open(m.path("model.safetensors")).unwrap();
        let mut got = want[..ranges[0].1.start as usize].to_vec();
        got.resize(want.len(), 0);
        if torch {
            let map = Private::map(&f);
            let b = map.bytes();
            let mut first = 0u8;
            for (_, r) in &ranges {
                // SAFETY: inside the mapping.
                first ^= unsafe { std::ptr::read_volatile(&b[r.start as usize]) };
            }
            std::hint::black_box(first);
            for name in &order {
                let r = range_of(name);
                let r = r.start as usize..r.end as usize;
                got[r.clone()].copy_from_slice(&b[r]);
            }
        } else {
            // SAFETY: the file is not changed while mapped.
            let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
            for (_, r) in &ranges {
                let r = r.start as usize..r.end as usize;
                got[r.clone()].copy_from_slice(&map[r]);
            }
        }
        assert!(got == want, "torch={torch}: the bytes differ");
        let s = daemon_stats(&m.mnt);
        eprintln!("torch={torch}: {stored} blocks stored; {s:?}");
        assert_eq!(
            s["decoded_again"], 0,
            "torch={torch}: blocks decoded more than once: {s:?}"
        );
        assert_eq!(
            s["blocks_decoded"], stored,
            "torch={torch}: every block decoded, once: {s:?}"
        );
        drop(f);
        m.unmount();
        m.remount(&["--cache-size", "64M"]);
    }
}
