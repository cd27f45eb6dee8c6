// IQ4_NL: 32 values, 18 bytes = f16 d, 16 bytes of nibbles laid out as Q4_0,
// each nibble indexing a fixed non-linear table; v = d * table[q].
// #include quant_common

const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 18u;

fn block_dot(wb: u32, xo: u32) -> f32 {
    var s = 0.0;
    for (var k = 0u; k < 4u; k++) {
        let q = rd_u32(wb + 2u + 4u * k);
        s += dot(iq4_lookup(q, 0u), x4(xo + 4u * k)) + dot(iq4_lookup(q, 4u), x4(xo + 16u + 4u * k));
    }
    return rd_f16(wb) * s;
}

fn block_value(wb: u32, i: u32) -> f32 {
    let b = rd_u8(wb + 2u + (i & 15u)) >> (4u * (i >> 4u));
    return rd_f16(wb) * IQ4_TABLE[b & 0xFu];
}

// Values i .. i+3 of the block (i % 4 == 0): one word of nibbles, for tile staging (gemm).
fn block_value4(wb: u32, i: u32) -> vec4<f32> {
    return rd_f16(wb) * iq4_lookup(rd_u32(wb + 2u + (i & 15u)), 4u * (i >> 4u));
}
