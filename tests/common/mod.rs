//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors")
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_ckptfs")
}

pub fn ckptfs(args: &[&str]) -> Output {
    Command::new(bin()).args(args).output().expect("run ckptfs")
}

/// Runs ckptfs with an address-space limit, so that an attempt to allocate
/// from a lying length field fails loudly instead of succeeding lazily.
pub fn ckptfs_limited(args: &[&str], limit_bytes: u64) -> Output {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new(bin());
    c.args(args).env("RUST_BACKTRACE", "0");
    // SAFETY: setrlimit is async-signal-safe and touches only this child.
    unsafe {
        c.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: limit_bytes,
                rlim_max: limit_bytes,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    c.output().expect("run ckptfs")
}

/// (name, original .safetensors, .zstn) for every ZSTN vector in the manifest.
pub fn zstn_vectors() -> Vec<(String, PathBuf, PathBuf)> {
    let dir = vectors_dir();
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let mut v = Vec::new();
    for vec in m["vectors"].as_array().unwrap() {
        if vec["kind"] == "zstn" {
            let name = vec["name"].as_str().unwrap().to_string();
            v.push((
                name.clone(),
                dir.join(format!("{name}.safetensors")),
                dir.join(format!("{name}.zstn")),
            ));
        }
    }
    assert!(v.len() >= 16, "manifest lists {} zstn vectors", v.len());
    v
}

/// A small deterministic PRNG (xorshift64*).
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    /// A standard normal sample (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = (self.next() >> 11) as f64 / (1u64 << 53) as f64 + 1e-300;
        let u2 = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

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
