// gemm_mma.wgsl's WC 3 for Q8_0 (and mma_dequant.wgsl's DIRECT form): a fetched unit (mmq_q8_0.wgsl's Raw:
// the 9 words holding one block, stage sub-block u) turned straight into f16 values of the weight tile wh at
// staged row rho, d q each computed as weight8 does (the same bits as the staged conversion).
// The includer declares wh, LD and put4 (VW: wh a view; put4's offsets multiples of 4).

fn unit_f16(g: Raw, rb: u32, k0: u32, u: u32, rho: u32) {
    let odd = ((rb + (k0 / 32u + u) * 34u) & 2u) != 0u;
    let d = vec4<f32>(half_at(g.q[0], odd));
    let o = rho * LD + 32u * u;
    for (var k = 0u; k < 8u; k++) {
        let q = select(al16(g.q[k], g.q[k + 1u], true), g.q[k + 1u], odd);
        put4(o + 4u * k, vec4<f16>(fma(d, vec4<f32>(unpack4xI8(q)), vec4<f32>(0.0))));
    }
}
