// Rounding activations to 8 bits per 32 values, shared by quantize_q8.wgsl
// and rmsnorm_q8.wgsl (the layout is in quantize_q8.wgsl's header). The
// including kernel declares `xq: array<u32>` (read_write) and runs 256
// invocations; each owns 4 consecutive values, 8 invocations one block.
// #include q8_block
// #include q8_layout
var<workgroup> q8_amax: array<f32, 256>;
var<workgroup> q8_isum: array<i32, 256>;

// Call in uniform control flow (it holds barriers). `vals` are values v .. v+3
// of the token row whose xq words start at `row`; `live` is false past K.
fn q8_store(vals: vec4<f32>, v: u32, tid: u32, live: bool, row: u32, K: u32) {
    let b = q8_block(vals, tid, tid & ~7u, true);
    if (live) {
        xq[q8_word_at(row, v)] = q8_word(b.q);
        if (tid % 8u == 0u) {
            let so = q8_scale_at(row, K, v);
            xq[so] = bitcast<u32>(b.d);
            xq[so + 1u] = bitcast<u32>(b.d * f32(b.s));
        }
    }
    workgroupBarrier();  // the arrays are reused by the next call
}
