// The 6-bit scales and mins of Q4_K and Q5_K blocks (mmq_q4_k.wgsl, mmq_q5_k.wgsl): the
// block's first 16 bytes as a vec4 (d and dmin, then the 12 bytes quant_common's k_scales reads).

// (scale, min) of sub-block j from the header's 12 bytes (k_scales: 6 bits each).
fn k_scale_min(hd: vec4<u32>, j: u32) -> vec2<f32> {
    let sh = 8u * (j & 3u);
    let a = (hd.y >> sh) & 0xFFu;
    let m = (hd.z >> sh) & 0xFFu;
    if (j < 4u) {
        return vec2<f32>(f32(a & 63u), f32(m & 63u));
    }
    let b = (hd.w >> sh) & 0xFFu;
    return vec2<f32>(f32((b & 15u) | ((a >> 6u) << 4u)), f32((b >> 4u) | ((m >> 6u) << 4u)));
}
