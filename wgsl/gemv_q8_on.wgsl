// The fused gate||up pair's output (gemv.wgsl, PAIR) also written rounded to 8 bits per 32 values,
// in quantize_q8.wgsl's layout and by its rounding (q8_round_*, the same expressions on the same
// floats as y), for the int8 GEMV of the down projection: no quantize dispatch between the two.
// The workgroup is 32 teams of one output row each, so its rows are one 32-value block of each
// of its NT tokens' rounded rows; the host keeps every chunk to whole blocks (row0 and N % 32 == 0)
// and the matrix to whole 64-value groups of the layout. A token's rounded row is the whole
// output's width, y_stride values (every chunk of the matrix together).
// #include q8_block
// #include q8_layout

@group(0) @binding(7) var<storage, read_write> yq: array<u32>;

var<workgroup> q8_vals: array<f32, 32 * NT>;  // token j's row i of the block at 32 j + i
// q8_block's q8_amax and q8_isum are gemv.wgsl's (Q8_SLOTS = 8 NT entries; NORM_IN includes q8_block too)

// Team `row` (the block's row) keeps token j's output.
fn q8_keep(j: u32, row: u32, v: f32) {
    q8_vals[j * 32u + row] = v;
}

// Called by every invocation, in uniform control flow (it holds barriers), after the outputs are
// kept. As quantize_q8: 8 invocations a token, each 4 consecutive values (one word of q); `block`
// is the workgroup's 32 rows of the chunk, `t0` its first token.
fn q8_rows(tid: u32, block: u32, t0: u32) {
    workgroupBarrier();
    let j = min(tid / 8u, NT - 1u);
    let mine = tid < 8u * NT;
    let live = mine && t0 + j < params.T;
    let o = j * 32u + 4u * (tid % 8u);
    var vals = vec4<f32>(0.0);
    if (live) {
        vals = vec4<f32>(q8_vals[o], q8_vals[o + 1u], q8_vals[o + 2u], q8_vals[o + 3u]);
    }
    let b = q8_block(vals, tid, 8u * j, mine);
    if (live) {
        let width = params.y_stride;  // values of a token's rounded row
        let row = (t0 + j) * (width / 4u + width / 16u);
        let v = params.row0 + block * 32u + 4u * (tid % 8u);  // the first of the 4 values
        yq[q8_word_at(row, v)] = q8_word(b.q);
        if (tid % 8u == 0u) {
            let so = q8_scale_at(row, width, v);
            yq[so] = bitcast<u32>(b.d);
            yq[so + 1u] = bitcast<u32>(b.d * f32(b.s));
        }
    }
}
