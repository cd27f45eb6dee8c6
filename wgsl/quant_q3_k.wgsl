// Q3_K: 256 values, 110 bytes = 32 bytes hmask, 64 bytes of 2-bit quants,
// 12 bytes of 6-bit scales, f16 d. Value i = 128n + 32j + l takes bits 2j..2j+1
// of qs[32n + l]; bit i / 32 of hmask[l] set means no offset, clear means -4.
// Scale k (= i / 16): low 4 bits from nibble k / 8 of byte k % 8, top 2 bits
// from bits 2 (k / 4) of byte 8 + k % 4; stored with a +32 bias.
// v = d * (scale - 32) * (q - 4 * !h).
// #include quant_common

const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 110u;

fn q3k_scale(wb: u32, k: u32) -> f32 {
    let lo = (rd_u8(wb + 96u + (k & 7u)) >> (4u * (k >> 3u))) & 0xFu;
    let hi = (rd_u8(wb + 104u + (k & 3u)) >> (2u * (k >> 2u))) & 3u;
    return f32(lo | (hi << 4u)) - 32.0;
}

fn block_dot(wb: u32, xo: u32) -> f32 {
    var acc = 0.0;
    for (var j = 0u; j < 16u; j++) {
        let l0 = 16u * (j & 1u);
        let qb = wb + 32u + 32u * (j >> 3u) + l0;
        let shift = 2u * ((j >> 1u) & 3u);
        let hs = j >> 1u;  // = i / 32 for the group's values
        var s = 0.0;
        for (var k = 0u; k < 4u; k++) {
            let q = bits4(rd_u32(qb + 4u * k), shift, 3u) + 4.0 * bits4(rd_u32(wb + l0 + 4u * k), hs, 1u) - 4.0;
            s += dot(q, x4(xo + 16u * j + 4u * k));
        }
        acc += q3k_scale(wb, j) * s;
    }
    return rd_f16(wb + 108u) * acc;
}

fn block_value(wb: u32, i: u32) -> f32 {
    let l = i & 31u;
    let q = (rd_u8(wb + 32u + 32u * (i >> 7u) + l) >> (2u * ((i >> 5u) & 3u))) & 3u;
    let h = (rd_u8(wb + l) >> (i >> 5u)) & 1u;
    return rd_f16(wb + 108u) * q3k_scale(wb, i >> 4u) * (f32(q) + 4.0 * f32(h) - 4.0);
}

// Values i .. i+3 of the block (i % 4 == 0; one scale group), for tile staging (gemm).
fn block_value4(wb: u32, i: u32) -> vec4<f32> {
    let l = i & 31u;
    let q = bits4(rd_u32(wb + 32u + 32u * (i >> 7u) + l), 2u * ((i >> 5u) & 3u), 3u);
    let h = bits4(rd_u32(wb + l), i >> 5u, 1u);
    return rd_f16(wb + 108u) * q3k_scale(wb, i >> 4u) * (q + 4.0 * h - 4.0);
}
