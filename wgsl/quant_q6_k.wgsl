// Q6_K: 256 values, 210 bytes = 128 bytes ql (low 4 bits), 64 bytes qh (high
// 2 bits), 16 int8 scales, f16 d. Each half n (128 values) uses ql[64n..],
// qh[32n..]; value 128n + 32g + l (g = 0..3, l = 0..31) takes the low (g = 0, 1)
// or high (g = 2, 3) nibble of ql[64n + 32 (g & 1) + l] and bits 2g..2g+1 of
// qh[32n + l]; v = d * scale[i / 16] * (q - 32).
// #include quant_common

const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 210u;

fn block_dot(wb: u32, xo: u32) -> f32 {
    var acc = 0.0;
    // One group of 16 values (one scale) per step.
    for (var j = 0u; j < 16u; j++) {
        let n = j >> 3u;
        let g = (j >> 1u) & 3u;
        let l0 = 16u * (j & 1u);
        let qlb = wb + 64u * n + 32u * (g & 1u) + l0;
        let qhb = wb + 128u + 32u * n + l0;
        var s = 0.0;
        for (var k = 0u; k < 4u; k++) {
            let q = bits4(rd_u32(qlb + 4u * k), 4u * (g >> 1u), 0xFu) + 16.0 * bits4(rd_u32(qhb + 4u * k), 2u * g, 3u);
            s += dot(q - 32.0, x4(xo + 16u * j + 4u * k));
        }
        acc += rd_i8(wb + 192u + j) * s;
    }
    return rd_f16(wb + 208u) * acc;
}

fn block_value(wb: u32, i: u32) -> f32 {
    let n = i >> 7u;
    let g = (i >> 5u) & 3u;
    let l = i & 31u;
    let lo = (rd_u8(wb + 64u * n + 32u * (g & 1u) + l) >> (4u * (g >> 1u))) & 0xFu;
    let hi = (rd_u8(wb + 128u + 32u * n + l) >> (2u * g)) & 3u;
    return rd_f16(wb + 208u) * rd_i8(wb + 192u + (i >> 4u)) * (f32(lo | (hi << 4u)) - 32.0);
}

// Values i .. i+3 of the block (i % 4 == 0; one scale group), for tile staging (gemm).
fn block_value4(wb: u32, i: u32) -> vec4<f32> {
    let n = i >> 7u;
    let g = (i >> 5u) & 3u;
    let l = i & 31u;
    let lo = bits4(rd_u32(wb + 64u * n + 32u * (g & 1u) + l), 4u * (g >> 1u), 0xFu);
    let hi = bits4(rd_u32(wb + 128u + 32u * n + l), 2u * g, 3u);
    return rd_f16(wb + 208u) * rd_i8(wb + 192u + (i >> 4u)) * (lo + 16.0 * hi - 32.0);
}
