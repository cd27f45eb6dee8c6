// Q5_K: 256 values, 176 bytes = f16 d, f16 dmin, 12 bytes of scales and mins
// (see k_scales), 32 bytes qh, 128 bytes of nibbles laid out as Q4_K. The
// fifth bit of value i is bit s = i / 32 of qh[i % 32];
// v = d * scale[s] * q - dmin * min[s].
// #include quant_common

const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 176u;

fn block_dot(wb: u32, xo: u32) -> f32 {
    let ks = k_scales(wb + 4u);
    var acc = 0.0;
    var accm = 0.0;
    for (var c = 0u; c < 4u; c++) {
        var qa = 0.0;
        var qb = 0.0;
        var sa = 0.0;
        var sb = 0.0;
        for (var k = 0u; k < 8u; k++) {
            let q = rd_u32(wb + 48u + 32u * c + 4u * k);
            let h = rd_u32(wb + 16u + 4u * k);
            let a = x4(xo + 64u * c + 4u * k);
            let b = x4(xo + 64u * c + 32u + 4u * k);
            qa += dot(lo4(q) + 16.0 * bits4(h, 2u * c, 1u), a);
            qb += dot(hi4(q) + 16.0 * bits4(h, 2u * c + 1u, 1u), b);
            sa += sum4(a);
            sb += sum4(b);
        }
        acc += k_scale(ks, 2u * c) * qa + k_scale(ks, 2u * c + 1u) * qb;
        accm += k_min(ks, 2u * c) * sa + k_min(ks, 2u * c + 1u) * sb;
    }
    return rd_f16(wb) * acc - rd_f16(wb + 2u) * accm;
}

fn block_value(wb: u32, i: u32) -> f32 {
    let s = i >> 5u;
    let ks = k_scales(wb + 4u);
    let q = (rd_u8(wb + 48u + 32u * (i >> 6u) + (i & 31u)) >> (4u * (s & 1u))) & 0xFu;
    let h = (rd_u8(wb + 16u + (i & 31u)) >> s) & 1u;
    return rd_f16(wb) * k_scale(ks, s) * f32(q | (h << 4u)) - rd_f16(wb + 2u) * k_min(ks, s);
}

// Values i .. i+3 of the block (i % 4 == 0; one sub-block), for tile staging (gemm).
fn block_value4(wb: u32, i: u32) -> vec4<f32> {
    let s = i >> 5u;
    let ks = k_scales(wb + 4u);
    let q = bits4(rd_u32(wb + 48u + 32u * (i >> 6u) + (i & 31u)), 4u * (s & 1u), 0xFu);
    let h = bits4(rd_u32(wb + 16u + (i & 31u)), s, 1u);
    return rd_f16(wb) * k_scale(ks, s) * (q + 16.0 * h) - rd_f16(wb + 2u) * k_min(ks, s);
}
