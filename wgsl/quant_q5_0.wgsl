// Q5_0: 32 values, 22 bytes = f16 d, 4 bytes qh, 16 bytes of nibbles (as Q4_0).
// Bit i of qh (little-endian u32) is the fifth bit of value i; v = d * (q - 16).
// #include quant_common

const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 22u;

fn block_dot(wb: u32, xo: u32) -> f32 {
    let qh = rd_u32(wb + 2u);
    var s = 0.0;
    for (var k = 0u; k < 4u; k++) {
        let q = rd_u32(wb + 6u + 4u * k);
        let hl = vec4<f32>((vec4<u32>(qh >> (4u * k)) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u));
        let hh = vec4<f32>((vec4<u32>(qh >> (16u + 4u * k)) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u));
        s += dot(lo4(q) + 16.0 * hl - 16.0, x4(xo + 4u * k)) + dot(hi4(q) + 16.0 * hh - 16.0, x4(xo + 16u + 4u * k));
    }
    return rd_f16(wb) * s;
}

fn block_value(wb: u32, i: u32) -> f32 {
    let b = (rd_u8(wb + 6u + (i & 15u)) >> (4u * (i >> 4u))) & 0xFu;
    let h = (rd_u32(wb + 2u) >> i) & 1u;
    return rd_f16(wb) * (f32(b | (h << 4u)) - 16.0);
}

// Values i .. i+3 of the block (i % 4 == 0), for tile staging (gemm).
fn block_value4(wb: u32, i: u32) -> vec4<f32> {
    let q = bits4(rd_u32(wb + 6u + (i & 15u)), 4u * (i >> 4u), 0xFu);
    let h = vec4<f32>((vec4<u32>(rd_u32(wb + 2u) >> i) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u));
    return rd_f16(wb) * (q + 16.0 * h - 16.0);
}
