// gemm_mma.wgsl's WC 3 for Q6_K (and mma_dequant.wgsl's DIRECT form, which checks it on any adapter):
// a fetched unit (mmq_q6_k.wgsl's Raw, with the word pair s0, s1 holding the block's scales 4c .. 4c + 3,
// fetched where DIRECT) turned straight into f16 values of the weight tile wh at staged row rho:
// values [16 hf, 16 hf + 16) of the stage's sub-blocks 2 cl and 2 cl + 1, d scale q each computed as
// weight8 does (the same bits as the staged conversion). The includer declares wh, LD and put4 (VW: wh a view;
// put4's offsets multiples of 4).

fn unit_f16(g: Raw, rb: u32, k0: u32, u: u32, rho: u32) {
    let bb = rb + (k0 / 256u) * 210u;
    let odd = (bb & 2u) != 0u;
    let c = (k0 % 256u) / 64u + u / 2u;
    let cl = u / 2u;
    let hf = u % 2u;
    let ns = 4u * (c % 2u);
    let sc = al16(g.s0, g.s1, odd);  // scales 4c .. 4c + 3: sub-block 2c's halves, then 2c + 1's
    let d = half_at(g.d, ((bb + 208u) & 2u) != 0u);
    let a0 = vec4<f32>(d * f32(bitcast<i32>(sc << (24u - 8u * hf)) >> 24u));  // scale 4c + hf
    let a1 = vec4<f32>(d * f32(bitcast<i32>(sc << (8u - 8u * hf)) >> 24u));   // scale 4c + 2 + hf
    let o = rho * LD + 64u * cl + 16u * hf;
    for (var k = 0u; k < 4u; k++) {
        let a = al16(g.a[k], g.a[k + 1u], odd);
        let b = al16(g.b[k], g.b[k + 1u], odd);
        let h = al16(g.h[k], g.h[k + 1u], odd) >> ns;
        let qa = minus4(((a >> ns) & LO4) | ((h << 4u) & 0x30303030u), 0x20202020u);
        let qb = minus4(((b >> ns) & LO4) | ((h << 2u) & 0x30303030u), 0x20202020u);
        put4(o + 4u * k, vec4<f16>(fma(a0, vec4<f32>(unpack4xI8(qa)), vec4<f32>(0.0))));
        put4(o + 32u + 4u * k, vec4<f16>(fma(a1, vec4<f32>(unpack4xI8(qb)), vec4<f32>(0.0))));
    }
}
