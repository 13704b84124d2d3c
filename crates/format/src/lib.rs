//! **ckptfs-format**, the bottom layer: bytes on disk, no codec.
//!
//! Pure parsing and rendering of on-disk formats. No I/O.
//!
//! Everything here works on byte slices and checks every length against the
//! bytes that hold it before trusting it. This is the bottom layer: it uses
//! no other ckptfs crate and no thread pool. `ckptfs-codec` decodes what is
//! parsed here (through traits it implements on these types, such as
//! `DecodeFrame`), so nothing here may depend on it. Two primitives every
//! layer above uses live here too: [`memory`] (allocations sized by
//! untrusted lengths) and [`fsutil`] (durable file replacement).

pub mod blazex;
pub mod blz;
pub mod blz_prelude;
pub mod blzdiff;
pub mod ckx;
pub mod cursor;
pub mod delta;
pub mod digest;
pub mod error;
pub mod frame;
pub mod plane;
pub mod safetensors;
pub mod z4digest;
pub mod z4dl;
pub mod z4dm;
pub mod zstn;

pub mod fsutil;
pub mod memory;
#[cfg(test)]
#[path = "../../../tests/common/support.rs"]
#[allow(dead_code)] // each crate's tests use some of the helpers
mod test_support;
