use super::pipeline::each_decoded;
use super::*;
use ckptfs_pack::{pack, PackOptions};

/// A packed safetensors file of several bf16 tensors (about 6 MiB,
/// several blocks each) and its bytes.
fn packed() -> (Vec<u8>, Vec<u8>) {
    let mut header = String::from("{");
    let mut data = Vec::new();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for t in 0..3 {
        let n = (1 << 20) + 4099 * t;
        let start = data.len();
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.04;
            data.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
        }
        if t > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"t{t}\":{{\"dtype\":\"BF16\",\"shape\":[{n}],\"data_offsets\":[{start},{}]}}",
            data.len()
        ));
    }
    header.push('}');
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend_from_slice(&data);
    let mut out = Vec::new();
    pack(&file, &mut out, PackOptions::default(), &|_| {}).unwrap();
    (file, out)
}

/// Blocks reach the sink whole and in order however far ahead the pool
/// may decode (one block, several, everything) and whether or not it
/// decodes meanwhile (a one-thread pool does not pipeline).
#[test]
fn each_decoded_hands_every_block_in_order() {
    let (file, packed) = packed();
    let a = ZstnArchive::from_bytes(packed, Path::new("t.zstn")).unwrap();
    let keys = blocks_of(&a, 0).unwrap();
    assert!(keys.len() > 6, "{} blocks", keys.len());
    let prefix = a.prefix(0).unwrap().to_vec();
    for threads in [1, 2, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        // From one of the pool's threads (windows) and from this
        // thread, outside any pool (the continuous pipeline, on the
        // global pool).
        for (ahead, inside) in [1, 1 << 20, 3 << 20, u64::MAX]
            .into_iter()
            .flat_map(|a| [(a, false), (a, true)])
        {
            let mut got = prefix.clone();
            let mut calls = 0;
            let mut run = || {
                each_decoded(&a, &keys, ahead, &mut |d| {
                    got.extend_from_slice(d);
                    calls += 1;
                    Ok::<(), ArchiveError>(())
                })
            };
            if inside { pool.install(run) } else { run() }.unwrap();
            assert_eq!(calls, keys.len(), "threads {threads} ahead {ahead}");
            assert!(got == file, "threads {threads} ahead {ahead}");
        }
    }
}

/// A sink that fails stops the stream with its error, after the
/// blocks decoding meanwhile have finished (nothing is left running).
#[test]
fn each_decoded_stops_at_the_sinks_error() {
    let (_, packed) = packed();
    let a = ZstnArchive::from_bytes(packed, Path::new("t.zstn")).unwrap();
    let keys = blocks_of(&a, 0).unwrap();
    let mut calls = 0;
    let r = each_decoded(&a, &keys, 1 << 20, &mut |_| {
        calls += 1;
        if calls == 3 {
            return Err(WriteError::Write(std::io::Error::other("disk full")));
        }
        Ok(())
    });
    assert!(matches!(r, Err(WriteError::Write(e)) if e.to_string() == "disk full"));
    assert_eq!(calls, 3);
}

/// A block that fails to decode ends the stream with its error and no
/// block after it reaches the sink; outside a pool, and in a pool of
/// one thread, every block before it does.
#[test]
fn each_decoded_stops_at_a_damaged_block() {
    let (_, mut packed) = packed();
    let mid = packed.len() / 2;
    packed[mid] ^= 0x40;
    let a = ZstnArchive::from_bytes(packed, Path::new("t.zstn")).unwrap();
    let keys = blocks_of(&a, 0).unwrap();
    let bad = (0..keys.len())
        .find(|&i| a.decode_block(keys[i]).is_err())
        .expect("the flipped byte damages a block");
    // 0: this thread, outside any pool (the continuous pipeline).
    for threads in [0, 1, 2, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .build()
            .unwrap();
        let mut calls = 0;
        let mut run = || {
            each_decoded(&a, &keys, 2 << 20, &mut |_| {
                calls += 1;
                Ok::<(), ArchiveError>(())
            })
        };
        let r = if threads == 0 {
            run()
        } else {
            pool.install(run)
        };
        assert!(matches!(r, Err(ArchiveError::Integrity { .. })), "{r:?}");
        // Windows fail whole: a window's blocks before the damaged one
        // may not be handed over.
        if threads <= 1 {
            assert_eq!(calls, bad, "threads {threads}");
        } else {
            assert!(calls <= bad, "threads {threads}: {calls} > {bad}");
        }
    }
}
