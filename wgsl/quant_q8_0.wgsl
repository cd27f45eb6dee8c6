// Q8_0: 32 values, 34 bytes = f16 d, 32 int8; v = d * q.
// #include quant_common

const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 34u;

fn block_dot(wb: u32, xo: u32) -> f32 {
    var s = 0.0;
    for (var k = 0u; k < 8u; k++) {
        s += dot(i8x4(rd_u32(wb + 2u + 4u * k)), x4(xo + 4u * k));
    }
    return rd_f16(wb) * s;
}

fn block_value(wb: u32, i: u32) -> f32 {
    return rd_f16(wb) * rd_i8(wb + 2u + i);
}

// Values i .. i+3 of the block (i % 4 == 0): one word of int8, for tile staging (gemm).
fn block_value4(wb: u32, i: u32) -> vec4<f32> {
    return rd_f16(wb) * i8x4(rd_u32(wb + 2u + i));
}
