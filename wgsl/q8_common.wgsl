// Rounding activations to 8 bits per 32 values, shared by quantize_q8.wgsl
// and rmsnorm_q8.wgsl (the layout is in quantize_q8.wgsl's header). The
// including kernel declares `xq: array<u32>` (read_write) and runs 256
// invocations; each owns 4 consecutive values, 8 invocations one block.
// #include q8_head_{{Q8_ROUND}}
var<workgroup> q8_amax: array<f32, 256>;
var<workgroup> q8_isum: array<i32, 256>;

// Call in uniform control flow (it holds barriers). `vals` are values v .. v+3
// of the token row whose xq words start at `row`; `live` is false past K.
fn q8_store(vals: vec4<f32>, v: u32, tid: u32, live: bool, row: u32, K: u32) {
    let a = abs(vals);
    q8_amax[tid] = max(max(a.x, a.y), max(a.z, a.w));
    workgroupBarrier();
    let lead = tid & ~7u;  // the block's 8 invocations read the same 8 entries
    var m = 0.0;
    for (var k = 0u; k < 8u; k++) {
        m = max(m, q8_amax[lead + k]);
    }
// #include q8_round_{{Q8_ROUND}}
    q8_isum[tid] = q.x + q.y + q.z + q.w;
    workgroupBarrier();
    if (live) {
        let word = (u32(q.x) & 0xFFu) | ((u32(q.y) & 0xFFu) << 8u) | ((u32(q.z) & 0xFFu) << 16u) | ((u32(q.w) & 0xFFu) << 24u);
        let blk = v / 256u;
        let r = v % 256u;
        let c = r / 64u;
        let hi = (r % 64u) / 32u;
        let i = r % 32u;
        let p = 2u * c + i / 16u;
        xq[row + blk * 64u + (p * 32u + hi * 16u + i % 16u) / 4u] = word;
        if (tid % 8u == 0u) {
            var s = 0;
            for (var k = 0u; k < 8u; k++) {
                s += q8_isum[tid + k];
            }
            // block b, pair c, sub-block `hi` of the pair: (d, d * sum q)
            let so = row + K / 4u + (blk * 4u + c) * 4u + 2u * hi;
            xq[so] = bitcast<u32>(d);
            xq[so + 1u] = bitcast<u32>(d * f32(s));
        }
    }
    workgroupBarrier();  // the arrays are reused by the next call
}
