// gemv.wgsl's Q4_K reader (x family "std"). A Q4_K block is 144 bytes =
// 9 vec4<u32>: [d|dmin, scales0, scales1, scales2] then 8 of nibbles; part p
// = 2c + hh reads nibble vec4 p, 16 low nibbles (values 64c + 16hh .. +16)
// and 16 high (64c + 32 + 16hh ..): the order quantize_q8 put the lane's
// activations in, so
//   sum_i (d sc q_i - dmin m) (dx qx_i) = d sc dx sum_i q_i qx_i - dmin m (dx sum_i qx_i).
// Rows are 16-byte aligned (K % 256 == 0).

fn bytes6(v: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(v) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xFFu));
}

// One lane's share of a Q4_K / Q5_K block: header hd, the 32 quants as bytes
// (qa: sub-block 2c, qb: 2c + 1). Only the lanes with hh = 0 take the mins'
// term, which covers whole sub-blocks.
fn k_weights(hd: vec4<u32>, qa: vec4<u32>, qb: vec4<u32>, p: u32) -> WB {
    let dm = unpack2x16float(hd.x);
    // 6-bit scales and mins of sub-blocks 2c and 2c + 1 (k_scales layout)
    let sc_lo = bytes6(hd.y & 0x3F3F3F3Fu);
    let sc_hi = bytes6((hd.w & 0x0F0F0F0Fu) | ((hd.y >> 2u) & 0x30303030u));
    let i0 = p & 6u;
    let i1 = i0 + 1u;
    let sa = select(sc_lo[i0 & 3u], sc_hi[i0 & 3u], i0 >= 4u);
    let sb = select(sc_lo[i1 & 3u], sc_hi[i1 & 3u], i1 >= 4u);
    var mins = vec2<f32>(0.0);
    if ((p & 1u) == 0u) {
        let mn_lo = bytes6(hd.z & 0x3F3F3F3Fu);
        let mn_hi = bytes6(((hd.w >> 4u) & 0x0F0F0F0Fu) | ((hd.z >> 2u) & 0x30303030u));
        mins = -dm.y * vec2<f32>(select(mn_lo[i0 & 3u], mn_hi[i0 & 3u], i0 >= 4u),
                                 select(mn_lo[i1 & 3u], mn_hi[i1 & 3u], i1 >= 4u));
    }
    return WB(qa, qb, vec4<f32>(dm.x * sa, dm.x * sb, mins));
}

fn w_q4_k(slot: u32, rb: u32, bc: u32, p: u32) -> WB {
    let v = rb / 16u + bc * 9u;
    let q = wvec(slot, v + 1u + p);
    return k_weights(wvec(slot, v), q & vec4<u32>(LO), (q >> vec4<u32>(4u)) & vec4<u32>(LO), p);
}
