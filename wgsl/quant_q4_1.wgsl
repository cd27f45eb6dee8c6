// Q4_1: 32 values, 20 bytes = f16 d, f16 m, 16 bytes of nibbles (as Q4_0);
// v = d * q + m.
// #include quant_common

const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 20u;

fn block_dot(wb: u32, xo: u32) -> f32 {
    var s = 0.0;
    var sx = 0.0;
    for (var k = 0u; k < 4u; k++) {
        let q = rd_u32(wb + 4u + 4u * k);
        let a = x4(xo + 4u * k);
        let b = x4(xo + 16u + 4u * k);
        s += dot(lo4(q), a) + dot(hi4(q), b);
        sx += sum4(a + b);
    }
    return rd_f16(wb) * s + rd_f16(wb + 2u) * sx;
}

fn block_value(wb: u32, i: u32) -> f32 {
    let b = rd_u8(wb + 4u + (i & 15u)) >> (4u * (i >> 4u));
    return rd_f16(wb) * f32(b & 0xFu) + rd_f16(wb + 2u);
}

// Values i .. i+3 of the block (i % 4 == 0): one word of nibbles, for tile staging (gemm).
fn block_value4(wb: u32, i: u32) -> vec4<f32> {
    let q = bits4(rd_u32(wb + 4u + (i & 15u)), 4u * (i >> 4u), 0xFu);
    return rd_f16(wb) * q + rd_f16(wb + 2u);
}
