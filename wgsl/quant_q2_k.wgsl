// Q2_K: 256 values, 84 bytes = 16 scale bytes (low nibble scale, high nibble
// min), 64 bytes of 2-bit quants, f16 d, f16 dmin. Value 128n + 32j + l takes
// bits 2j..2j+1 of qs[32n + l]; v = d * (sc[i/16] & 15) * q - dmin * (sc[i/16] >> 4).
// #include quant_common

const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 84u;

fn block_dot(wb: u32, xo: u32) -> f32 {
    var acc = 0.0;
    var accm = 0.0;
    for (var j = 0u; j < 16u; j++) {
        let qb = wb + 16u + 32u * (j >> 3u) + 16u * (j & 1u);
        let shift = 2u * ((j >> 1u) & 3u);
        var s = 0.0;
        var sx = 0.0;
        for (var k = 0u; k < 4u; k++) {
            let a = x4(xo + 16u * j + 4u * k);
            s += dot(bits4(rd_u32(qb + 4u * k), shift, 3u), a);
            sx += sum4(a);
        }
        let sc = rd_u8(wb + j);
        acc += f32(sc & 0xFu) * s;
        accm += f32(sc >> 4u) * sx;
    }
    return rd_f16(wb + 80u) * acc - rd_f16(wb + 82u) * accm;
}

fn block_value(wb: u32, i: u32) -> f32 {
    let q = (rd_u8(wb + 16u + 32u * (i >> 7u) + (i & 31u)) >> (2u * ((i >> 5u) & 3u))) & 3u;
    let sc = rd_u8(wb + (i >> 4u));
    return rd_f16(wb + 80u) * f32(sc & 0xFu) * f32(q) - rd_f16(wb + 82u) * f32(sc >> 4u);
}

// Values i .. i+3 of the block (i % 4 == 0; one scale group), for tile staging (gemm).
fn block_value4(wb: u32, i: u32) -> vec4<f32> {
    let q = bits4(rd_u32(wb + 16u + 32u * (i >> 7u) + (i & 31u)), 2u * ((i >> 5u) & 3u), 3u);
    let sc = rd_u8(wb + (i >> 4u));
    return rd_f16(wb + 80u) * f32(sc & 0xFu) * q - rd_f16(wb + 82u) * f32(sc >> 4u);
}
