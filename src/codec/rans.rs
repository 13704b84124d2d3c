//! TEMPORARY stub until the real rANS module lands (same API).
use super::{CodecError, Result};
pub const PROB_BITS: u32 = 14;
pub const RANS_L: u32 = 1 << 23;
pub type FreqTable = [u16; 256];
pub fn normalize_freqs(_hist: &[u64; 256]) -> FreqTable {
    unimplemented!()
}
pub fn histogram(_data: &[u8]) -> [u64; 256] {
    unimplemented!()
}
pub fn decode_method3(_payload: &[u8], _out: &mut [u8]) -> Result<()> {
    Err(CodecError::Rans("stub".into()))
}
pub struct AdaptivePayload<'a> {
    p: &'a [u8],
}
impl<'a> AdaptivePayload<'a> {
    pub fn parse(payload: &'a [u8]) -> Result<Self> {
        Ok(Self { p: payload })
    }
    pub fn len(&self) -> u64 {
        0
    }
    pub fn chunks(&self) -> usize {
        0
    }
    pub fn chunk_bounds(&self, _j: usize) -> std::ops::Range<u64> {
        0..0
    }
    pub fn chunk_payload(&self, _j: usize) -> &'a [u8] {
        self.p
    }
    pub fn freq_blob(&self) -> &'a [u8] {
        self.p
    }
    pub fn freq_tables(&self) -> Result<Vec<FreqTable>> {
        Err(CodecError::Rans("stub".into()))
    }
    pub fn decode_chunk(&self, _j: usize, _t: &FreqTable, _out: &mut [u8]) -> Result<()> {
        Err(CodecError::Rans("stub".into()))
    }
}
pub fn decode_method4(_payload: &[u8], _out: &mut [u8]) -> Result<()> {
    Err(CodecError::Rans("stub".into()))
}
pub fn encode_method4(_data: &[u8], _k: usize) -> Vec<u8> {
    unimplemented!()
}
pub fn decode_method5(_payload: &[u8], _out: &mut [u8]) -> Result<()> {
    Err(CodecError::Rans("stub".into()))
}
