// Q5_1: 32 values, 24 bytes = f16 d, f16 m, 4 bytes qh, 16 bytes of nibbles;
// bits as Q5_0, v = d * q + m.
// #include quant_common

const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 24u;

fn block_dot(wb: u32, xo: u32) -> f32 {
    let qh = rd_u32(wb + 4u);
    var s = 0.0;
    var sx = 0.0;
    for (var k = 0u; k < 4u; k++) {
        let q = rd_u32(wb + 8u + 4u * k);
        let hl = vec4<f32>((vec4<u32>(qh >> (4u * k)) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u));
        let hh = vec4<f32>((vec4<u32>(qh >> (16u + 4u * k)) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u));
        let a = x4(xo + 4u * k);
        let b = x4(xo + 16u + 4u * k);
        s += dot(lo4(q) + 16.0 * hl, a) + dot(hi4(q) + 16.0 * hh, b);
        sx += sum4(a + b);
    }
    return rd_f16(wb) * s + rd_f16(wb + 2u) * sx;
}

fn block_value(wb: u32, i: u32) -> f32 {
    let b = (rd_u8(wb + 8u + (i & 15u)) >> (4u * (i >> 4u))) & 0xFu;
    let h = (rd_u32(wb + 4u) >> i) & 1u;
    return rd_f16(wb) * f32(b | (h << 4u)) + rd_f16(wb + 2u);
}

// Values i .. i+3 of the block (i % 4 == 0), for tile staging (gemm).
fn block_value4(wb: u32, i: u32) -> vec4<f32> {
    let q = bits4(rd_u32(wb + 8u + (i & 15u)), 4u * (i >> 4u), 0xFu);
    let h = vec4<f32>((vec4<u32>(rd_u32(wb + 4u) >> i) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u));
    return rd_f16(wb) * (q + 16.0 * h) + rd_f16(wb + 2u);
}
