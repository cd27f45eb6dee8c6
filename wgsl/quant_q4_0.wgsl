// Q4_0: 32 values, 18 bytes = f16 d, 16 bytes of nibbles.
// Byte j holds value j (low nibble) and value j + 16 (high); v = d * (q - 8).
// #include quant_common

const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 18u;

fn block_dot(wb: u32, xo: u32) -> f32 {
    var s = 0.0;
    for (var k = 0u; k < 4u; k++) {
        let q = rd_u32(wb + 2u + 4u * k);
        s += dot(lo4(q) - 8.0, x4(xo + 4u * k)) + dot(hi4(q) - 8.0, x4(xo + 16u + 4u * k));
    }
    return rd_f16(wb) * s;
}

fn block_value(wb: u32, i: u32) -> f32 {
    let b = rd_u8(wb + 2u + (i & 15u)) >> (4u * (i >> 4u));
    return rd_f16(wb) * (f32(b & 0xFu) - 8.0);
}

// Values i .. i+3 of the block (i % 4 == 0): one word of nibbles, for tile staging (gemm).
fn block_value4(wb: u32, i: u32) -> vec4<f32> {
    let q = bits4(rd_u32(wb + 2u + (i & 15u)), 4u * (i >> 4u), 0xFu);
    return rd_f16(wb) * (q - 8.0);
}
