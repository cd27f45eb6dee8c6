// IQ4_XS: 256 values, 136 bytes = f16 d, u16 scales_h, 4 bytes scales_l,
// 128 bytes of nibbles. Sub-block b (32 values) has the 6-bit scale
// (nibble b % 2 of scales_l[b / 2]) | (bits 2b..2b+1 of scales_h) << 4, biased
// by 32; its 16 bytes hold values l (low nibble) and l + 16 (high nibble) as
// IQ4_NL. v = d * (scale - 32) * table[q].
// #include quant_common

const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 136u;

fn iq4xs_scale(wb: u32, b: u32) -> f32 {
    let lo = (rd_u8(wb + 4u + (b >> 1u)) >> (4u * (b & 1u))) & 0xFu;
    let hi = (rd_u16(wb + 2u) >> (2u * b)) & 3u;
    return f32(lo | (hi << 4u)) - 32.0;
}

fn block_dot(wb: u32, xo: u32) -> f32 {
    var acc = 0.0;
    for (var b = 0u; b < 8u; b++) {
        var s = 0.0;
        for (var k = 0u; k < 4u; k++) {
            let q = rd_u32(wb + 8u + 16u * b + 4u * k);
            s += dot(iq4_lookup(q, 0u), x4(xo + 32u * b + 4u * k)) + dot(iq4_lookup(q, 4u), x4(xo + 32u * b + 16u + 4u * k));
        }
        acc += iq4xs_scale(wb, b) * s;
    }
    return rd_f16(wb) * acc;
}

fn block_value(wb: u32, i: u32) -> f32 {
    let b = i >> 5u;
    let j = i & 31u;
    let q = (rd_u8(wb + 8u + 16u * b + (j & 15u)) >> (4u * (j >> 4u))) & 0xFu;
    return rd_f16(wb) * iq4xs_scale(wb, b) * IQ4_TABLE[q];
}

// Values i .. i+3 of the block (i % 4 == 0; one sub-block), for tile staging (gemm).
fn block_value4(wb: u32, i: u32) -> vec4<f32> {
    let b = i >> 5u;
    let j = i & 31u;
    let q = iq4_lookup(rd_u32(wb + 8u + 16u * b + (j & 15u)), 4u * (j >> 4u));
    return rd_f16(wb) * iq4xs_scale(wb, b) * q;
}
