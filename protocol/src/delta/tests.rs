use super::*;
use proptest::prelude::*;

const ALL: [DeltaCodec; 7] = [
    DeltaCodec::Fp32,
    DeltaCodec::Fp16,
    DeltaCodec::Int8 { block: 64 },
    DeltaCodec::Int8 { block: 7 },
    DeltaCodec::Int4 { block: 32 },
    DeltaCodec::TopK { permille: 50 },
    // Without shapes: one flat tensor, so int4 with the same blocks.
    DeltaCodec::LowRank { rank: 4, block: 32 },
];

/// A `rows × cols` matrix of rank 4, plus noise of relative size `noise`.
fn low_rank_matrix(rows: usize, cols: usize, noise: f32) -> Vec<f32> {
    (0..rows * cols)
        .map(|k| {
            let (i, j) = ((k / cols) as f32, (k % cols) as f32);
            let signal = (i * 0.3).sin() * (j * 0.2).cos()
                + 0.5 * (i * 0.11 + 1.0).cos() * (j * 0.07).sin()
                + 0.2 * ((i + j) * 0.013).sin();
            signal * 1e-2 + noise * 1e-2 * ((k * 7919 % 1013) as f32 / 1013.0 - 0.5)
        })
        .collect()
}

fn sq(v: &[f32]) -> f64 {
    v.iter().map(|x| (*x as f64).powi(2)).sum()
}

#[test]
fn codec_names_parse_and_print() {
    for c in ALL {
        assert_eq!(c.to_string().parse::<DeltaCodec>().unwrap(), c);
    }
    assert_eq!(
        "int8".parse::<DeltaCodec>().unwrap(),
        DeltaCodec::Int8 { block: 64 }
    );
    assert!("int8:0".parse::<DeltaCodec>().is_err());
    assert_eq!(
        "lowrank".parse::<DeltaCodec>().unwrap(),
        DeltaCodec::LowRank {
            rank: 23,
            block: 256
        }
    );
    assert_eq!(
        "lowrank:8".parse::<DeltaCodec>().unwrap(),
        DeltaCodec::LowRank {
            rank: 8,
            block: 256
        }
    );
    assert_eq!(
        "lowrank:8:64".parse::<DeltaCodec>().unwrap(),
        DeltaCodec::LowRank { rank: 8, block: 64 }
    );
    for bad in [
        "lowrank:0",
        "lowrank:8:0",
        "lowrank:5000",
        "lowrank:x:64",
        "lowrank:8:",
    ] {
        assert!(bad.parse::<DeltaCodec>().is_err(), "{bad}");
    }
    assert!("fp16:3".parse::<DeltaCodec>().is_err());
    assert!("zip".parse::<DeltaCodec>().is_err());
}

#[test]
fn fp32_is_exact() {
    let v: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin() * 1e-3).collect();
    assert_eq!(decode(&encode(DeltaCodec::Fp32, &v), v.len()).unwrap(), v);
}

#[test]
fn int8_shrinks_a_delta_about_four_times() {
    let v: Vec<f32> = (0..100_000)
        .map(|i| ((i * 7919) % 1000) as f32 * 1e-6 - 5e-4)
        .collect();
    let enc = encode(DeltaCodec::Int8 { block: 64 }, &v);
    assert!(
        enc.body.len() * 3 < dense_bytes(v.len()),
        "{} bytes",
        enc.body.len()
    );
}

#[test]
fn refuses_wrong_length_nan_and_oversized_bodies() {
    let v = vec![0.5f32; 100];
    let enc = encode(DeltaCodec::Fp32, &v);
    assert_eq!(
        decode(&enc, 99),
        Err(DeltaError::WrongLength {
            got: 100,
            expected: 99
        })
    );

    let mut nan = v.clone();
    nan[17] = f32::NAN;
    assert_eq!(
        decode(&encode(DeltaCodec::Fp32, &nan), 100),
        Err(DeltaError::NonFinite(17))
    );
    let mut inf = v.clone();
    inf[3] = f32::INFINITY;
    assert_eq!(
        decode(&encode(DeltaCodec::Fp16, &inf), 100),
        Err(DeltaError::NonFinite(3))
    );

    // A body that decompresses to more than the declared length allows.
    let mut lying = encode(DeltaCodec::Fp32, &vec![0.5f32; 200]);
    lying.len = 100;
    assert!(decode(&lying, 100).is_err());

    let bad_block = EncodedDelta {
        codec: DeltaCodec::Int8 { block: 0 },
        ..enc.clone()
    };
    assert!(matches!(
        decode(&bad_block, 100),
        Err(DeltaError::BadParameter(_))
    ));
}

#[test]
fn lowrank_sends_the_matrices_as_factors_and_the_rest_as_int4() {
    let (rows, cols) = (48, 96);
    let mut v = low_rank_matrix(rows, cols, 0.0);
    let bias: Vec<f32> = (0..40).map(|i| (i as f32 * 0.7).sin() * 1e-3).collect();
    v.extend(&bias);
    let shapes = vec![vec![rows, cols], vec![40]];
    let codec = DeltaCodec::LowRank { rank: 4, block: 64 };
    let enc = encode_shaped(codec, &v, &shapes, &mut Vec::new());
    let out = decode_shaped(&enc, v.len(), &shapes).unwrap();
    // A matrix of rank ≤ 4 comes back up to the int4 rounding of its factors (≈ 1 % of the
    // energy each, for values spread like these).
    let m = rows * cols;
    let err: Vec<f32> = v[..m].iter().zip(&out[..m]).map(|(a, b)| a - b).collect();
    assert!(
        sq(&err) < 3e-2 * sq(&v[..m]),
        "{} of {}",
        sq(&err),
        sq(&v[..m])
    );
    // The vector goes as int4 of its own.
    let mx = bias.iter().fold(0f32, |m, x| m.max(x.abs()));
    for (a, b) in bias.iter().zip(&out[m..]) {
        assert!((a - b).abs() <= mx / 14.0 + 1e-7);
    }
    // Factors: 4·(48 + 96) values instead of 4608.
    let flat = raw_body_size(DeltaCodec::Int4 { block: 64 }, v.len());
    let raw = raw_body_size_shaped(codec, v.len(), &shapes);
    assert!(raw * 7 < flat, "{raw} vs {flat}");
    assert!(
        enc.body.len() * 32 < dense_bytes(v.len()),
        "{}",
        enc.body.len()
    );
}

#[test]
fn lowrank_keeps_more_of_a_noisy_matrix_with_more_rank_and_warm_starts() {
    let (rows, cols) = (40, 64);
    let v = low_rank_matrix(rows, cols, 0.5);
    let shapes = vec![vec![rows, cols]];
    let err = |rank: u16, subspaces: &mut Vec<Vec<f32>>| {
        let codec = DeltaCodec::LowRank { rank, block: 64 };
        let out = decode_shaped(
            &encode_shaped(codec, &v, &shapes, subspaces),
            v.len(),
            &shapes,
        )
        .unwrap();
        let d: Vec<f32> = v.iter().zip(&out).map(|(a, b)| a - b).collect();
        sq(&d) / sq(&v)
    };
    let (e1, e4, e12) = (
        err(1, &mut Vec::new()),
        err(4, &mut Vec::new()),
        err(12, &mut Vec::new()),
    );
    assert!(e12 < e4 && e4 < e1 && e1 < 1.0, "{e1} {e4} {e12}");
    // The sender keeps each matrix's subspace; starting from it is as good as fresh.
    let mut subspaces = Vec::new();
    let first = err(4, &mut subspaces);
    assert_eq!(subspaces.len(), 1);
    assert_eq!(subspaces[0].len(), cols * 4);
    let again = err(4, &mut subspaces);
    assert!(again <= first * 1.05, "{first} then {again}");
}

#[test]
fn lowrank_with_other_shapes_than_the_sender_is_refused() {
    let (rows, cols) = (32, 64);
    let v = low_rank_matrix(rows, cols, 0.1);
    let codec = DeltaCodec::LowRank { rank: 4, block: 64 };
    let enc = encode_shaped(codec, &v, &[vec![rows, cols]], &mut Vec::new());
    for other in [
        vec![],
        vec![vec![cols, rows / 2], vec![cols, 2]],
        vec![vec![rows * cols]],
    ] {
        assert!(matches!(
            decode_shaped(&enc, v.len(), &other),
            Err(DeltaError::WrongBodySize { .. } | DeltaError::Decompress(_))
        ));
    }
    let bad = EncodedDelta {
        codec: DeltaCodec::LowRank { rank: 0, block: 64 },
        ..enc
    };
    assert!(matches!(
        decode_shaped(&bad, v.len(), &[vec![rows, cols]]),
        Err(DeltaError::BadParameter(_))
    ));
}

#[test]
fn topk_keeps_the_largest_values() {
    let mut v = vec![0.001f32; 1000];
    v[10] = 5.0;
    v[500] = -4.0;
    let out = decode(&encode(DeltaCodec::TopK { permille: 2 }, &v), 1000).unwrap();
    assert_eq!(out[10], 5.0);
    assert_eq!(out[500], -4.0);
    assert_eq!(out.iter().filter(|x| **x != 0.0).count(), 2);
}

proptest! {
    #[test]
    fn every_codec_round_trips_within_its_error_bound(
        v in prop::collection::vec(-1.0f32..1.0, 0..600),
    ) {
        for c in ALL {
            let out = decode(&encode(c, &v), v.len()).unwrap();
            prop_assert_eq!(out.len(), v.len());
            for (i, (a, b)) in v.iter().zip(&out).enumerate() {
                let bound = match c {
                    DeltaCodec::Fp32 => 0.0,
                    DeltaCodec::Fp16 => a.abs() * 1e-3 + 1e-7,
                    DeltaCodec::Int8 { block } => {
                        let blk = &v[(i / block as usize) * block as usize..];
                        let m = blk.iter().take(block as usize).fold(0f32, |m, x| m.max(x.abs()));
                        m / 127.0 * 0.5 + 1e-6
                    }
                    DeltaCodec::Int4 { block } | DeltaCodec::LowRank { block, .. } => {
                        let blk = &v[(i / block as usize) * block as usize..];
                        let m = blk.iter().take(block as usize).fold(0f32, |m, x| m.max(x.abs()));
                        m / 7.0 * 0.5 + 1e-6
                    }
                    // Dropped values err by themselves; kept ones by f16 rounding.
                    DeltaCodec::TopK { .. } => a.abs(),
                };
                prop_assert!((a - b).abs() <= bound, "{c}: {a} vs {b} (bound {bound})");
            }
        }
    }

    #[test]
    fn corrupted_bodies_never_panic(
        v in prop::collection::vec(-1.0f32..1.0, 1..300),
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..8),
        cut in any::<usize>(),
    ) {
        for c in ALL {
            let mut enc = encode(c, &v);
            for (pos, x) in &flips {
                if !enc.body.is_empty() {
                    let n = enc.body.len();
                    enc.body[pos % n] ^= x;
                }
            }
            let _ = decode(&enc, v.len());
            enc.body.truncate(cut % (enc.body.len() + 1));
            let _ = decode(&enc, v.len());
        }
    }

    #[test]
    fn corrupted_lowrank_bodies_never_panic(
        rows in 2usize..24,
        cols in 2usize..24,
        rank in 1u16..6,
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..8),
        cut in any::<usize>(),
    ) {
        let v = low_rank_matrix(rows, cols, 0.3);
        let mut all = v.clone();
        all.extend([0.25f32; 5]);
        let shapes = vec![vec![rows, cols], vec![5]];
        let codec = DeltaCodec::LowRank { rank, block: 16 };
        let mut enc = encode_shaped(codec, &all, &shapes, &mut Vec::new());
        prop_assert_eq!(decode_shaped(&enc, all.len(), &shapes).unwrap().len(), all.len());
        for (pos, x) in &flips {
            let n = enc.body.len();
            enc.body[pos % n] ^= x;
        }
        let _ = decode_shaped(&enc, all.len(), &shapes);
        enc.body.truncate(cut % (enc.body.len() + 1));
        let _ = decode_shaped(&enc, all.len(), &shapes);
    }
}
