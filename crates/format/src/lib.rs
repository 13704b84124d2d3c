//! Pure parsing and rendering of on-disk formats. No I/O.
//!
//! Everything here works on byte slices and checks every length against the
//! bytes that hold it before trusting it. This is the bottom layer: it uses
//! no other ckptfs module and no thread pool. `codec` decodes what is parsed
//! here (it adds the `decode*` methods of frames and plane payloads), so
//! nothing here may depend on `codec`.

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
