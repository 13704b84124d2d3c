//! Pure parsing and rendering of on-disk formats. No I/O.

pub mod blz;
pub mod ckx;
pub mod cursor;
pub mod error;
pub mod frame;
pub mod plane;
pub mod safetensors;
pub mod zstn;
