// Rounding activations to 8 bits per 32 values, shared by quantize_q8.wgsl
// and rmsnorm_q8.wgsl (the layout is in quantize_q8.wgsl's header). The
// including kernel declares `xq: array<u32>` (read_write) and runs 256
// invocations; each owns 4 consecutive values, 8 invocations one block.
// #include q8_head_{{Q8_ROUND}}
// #include q8_layout
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
        xq[q8_word_at(row, v)] = q8_word(q);
        if (tid % 8u == 0u) {
            var s = 0;
            for (var k = 0u; k < 8u; k++) {
                s += q8_isum[tid + k];
            }
            let so = q8_scale_at(row, K, v);
            xq[so] = bitcast<u32>(d);
            xq[so + 1u] = bitcast<u32>(d * f32(s));
        }
    }
    workgroupBarrier();  // the arrays are reused by the next call
}
