// gemm_mma.wgsl's WC 3 for Q5_0 (and mma_dequant.wgsl's DIRECT form): a fetched unit (mmq_q5_0.wgsl's Raw:
// the 6 words holding one block, stage sub-block u) turned straight into f16 values of the weight tile wh at
// staged row rho, d (q - 16) each computed as weight8 does (the same bits as the staged conversion).
// The includer declares wh, LD and put4 (VW: wh a view; put4's offsets multiples of 4).

fn unit_f16(g: Raw, rb: u32, k0: u32, u: u32, rho: u32) {
    let odd = ((rb + (k0 / 32u + u) * 22u) & 2u) != 0u;
    let qh = select(al16(g.q[0], g.q[1], true), g.q[1], odd);
    let d = vec4<f32>(half_at(g.q[0], odd));
    let o = rho * LD + 32u * u;
    for (var k = 0u; k < 4u; k++) {
        let q = select(al16(g.q[k + 1u], g.q[k + 2u], true), g.q[k + 2u], odd);
        let lo = minus4((q & LO4) | (spread4(qh >> (4u * k)) << 4u), 0x10101010u);
        let hi = minus4(((q >> 4u) & LO4) | (spread4(qh >> (16u + 4u * k)) << 4u), 0x10101010u);
        put4(o + 4u * k, vec4<f16>(fma(d, vec4<f32>(unpack4xI8(lo)), vec4<f32>(0.0))));
        put4(o + 16u + 4u * k, vec4<f16>(fma(d, vec4<f32>(unpack4xI8(hi)), vec4<f32>(0.0))));
    }
}
