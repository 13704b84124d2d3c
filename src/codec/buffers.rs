//! Block buffers recycled from the block cache's evictions.
//!
//! A cold load decodes a block of about 1 MiB for every MiB it reads while
//! the cache evicts blocks of the same size. Zeroing each new buffer before
//! the decoder overwrites it cost 5–11% of the daemon in a cold read, so
//! evicted buffers are kept here (a few, bounded in bytes) and handed to
//! decoders that write every byte of their output ([`take`]). Their old
//! bytes are never served: such a decoder overwrites all of them, and a
//! block's bytes are checked against its digest before anyone reads them.

use super::Result;
use std::sync::Mutex;

/// Bytes of buffers kept at most.
const KEEP_BYTES: usize = 32 << 20;

static POOL: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// A buffer of `len` bytes whose contents are unspecified (zero or the
/// bytes of an evicted block): only for a decoder that writes all of it.
/// Same limits and errors as [`super::zeroed`].
pub fn take(len: u64, what: &'static str) -> Result<Vec<u8>> {
    if len > super::MAX_BLOCK_BYTES {
        return super::zeroed(len, what);
    }
    let n = len as usize;
    let reused = {
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        // A buffer at least as large, but not more than twice (the cache
        // counts a block's length, not its capacity).
        pool.iter()
            .rposition(|v| v.capacity() >= n && v.capacity() <= 2 * n.max(4096))
            .map(|i| pool.swap_remove(i))
    };
    match reused {
        Some(mut v) => {
            if v.len() >= n {
                v.truncate(n);
            } else {
                v.resize(n, 0);
            }
            Ok(v)
        }
        None => super::zeroed(len, what),
    }
}

/// Keeps `v` for a later [`take`] if the pool has room; else frees it.
pub fn recycle(v: Vec<u8>) {
    if v.capacity() == 0 || v.capacity() > KEEP_BYTES / 4 {
        return;
    }
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    let held: usize = pool.iter().map(Vec::capacity).sum();
    if held + v.capacity() <= KEEP_BYTES {
        pool.push(v);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn buffers_come_back_at_the_asked_length() {
        let mut v = super::take(1000, "t").unwrap();
        assert_eq!(v.len(), 1000);
        v.iter_mut().for_each(|b| *b = 7);
        super::recycle(v);
        // Another test may take it first; either way the length is right.
        for n in [600u64, 1000, 1500] {
            let v = super::take(n, "t").unwrap();
            assert_eq!(v.len(), n as usize);
            super::recycle(v);
        }
        assert!(super::take(super::super::MAX_BLOCK_BYTES + 1, "t").is_err());
    }
}
