// gemm_mma.wgsl's WC 3 for Q4_K (and mma_dequant.wgsl's DIRECT form, which checks it on any adapter):
// a fetched unit (mmq_q4_k.wgsl's Raw: one vec4 of nibbles and the block's header) turned straight
// into f16 values of the weight tile wh at staged row rho, with no int8 lanes or scales staged in
// workgroup memory between: values [16 hf, 16 hf + 16) of the stage's sub-blocks 2 cl (low nibbles)
// and 2 cl + 1 (high), a q + b each computed as weight8 does (the same bits as the staged conversion).
// The includer declares wh, LD and put4 (VW: wh a view; put4's offsets multiples of 4).

fn unit_f16(g: Raw, rb: u32, k0: u32, u: u32, rho: u32) {
    let cl = u / 2u;
    let hf = u % 2u;
    let dm = unpack2x16float(g.hd.x);
    let j = (k0 % 256u) / 32u + 2u * cl;  // the block's sub-block of the low nibbles
    let s0 = k_scale_min(g.hd, j);
    let s1 = k_scale_min(g.hd, j + 1u);
    let a0 = vec4<f32>(dm.x * s0.x);
    let b0 = vec4<f32>(-dm.y * s0.y);
    let a1 = vec4<f32>(dm.x * s1.x);
    let b1 = vec4<f32>(-dm.y * s1.y);
    let o = rho * LD + 64u * cl + 16u * hf;
    for (var w = 0u; w < 4u; w++) {
        put4(o + 4u * w, vec4<f16>(fma(a0, vec4<f32>(unpack4xI8(g.q[w] & LO4)), b0)));
        put4(o + 32u + 4u * w, vec4<f16>(fma(a1, vec4<f32>(unpack4xI8((g.q[w] >> 4u) & LO4)), b1)));
    }
}
