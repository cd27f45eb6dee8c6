// One 32-value block rounded to 8 bits by its 8 invocations, 4 consecutive values each, for the
// kernels that write a rounded row (q8_common.wgsl's q8_store, gemv_q8_on.wgsl): max |x| over the
// block, the rounding (q8_round_*), and the sum of the block's q. The including kernel declares the
// workgroup arrays q8_amax: array<f32, _> and q8_isum: array<i32, _>, an entry per invocation that
// holds values, the block's 8 from `lead`.
// #include q8_head_{{Q8_ROUND}}

struct Q8Block {
    q: vec4<i32>,  // this invocation's 4 values
    d: f32,        // the block's scale
    s: i32,        // the sum of the block's 32 q: at `lead` only
}

// Call in uniform control flow (it holds barriers); `mine`: this invocation has an entry.
fn q8_block(vals: vec4<f32>, tid: u32, lead: u32, mine: bool) -> Q8Block {
    let a = abs(vals);
    if (mine) {
        q8_amax[tid] = max(max(a.x, a.y), max(a.z, a.w));
    }
    workgroupBarrier();
    var m = 0.0;
    for (var k = 0u; k < 8u; k++) {
        m = max(m, q8_amax[lead + k]);
    }
    let r = q8_round(vals, m);
    let q = r.q;
    if (mine) {
        q8_isum[tid] = q.x + q.y + q.z + q.w;
    }
    workgroupBarrier();
    var s = 0;
    if (tid == lead) {
        for (var k = 0u; k < 8u; k++) {
            s += q8_isum[lead + k];
        }
    }
    return Q8Block(q, r.d, s);
}

// The rounding (q8_round_*) of 4 values of a block whose max |x| is m: their q and the block's d (s 0).
fn q8_round(vals: vec4<f32>, m: f32) -> Q8Block {
// #include q8_round_{{Q8_ROUND}}
    return Q8Block(q, d, 0);
}
