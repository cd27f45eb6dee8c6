// The attention output also written rounded to 8 bits per 32 values, in
// quantize_q8.wgsl's layout, for the Q4_K GEMV of the o projection: that GEMV
// then needs no quantize dispatch of its own. Each invocation holds 4
// consecutive values of the token's row (Q8_K = n_heads * v_head_dim values),
// and v_head_dim % 32 == 0, so every 32-value block lies within one head and
// within one workgroup (the host checks).

@group(0) @binding({{Q8_BINDING}}) var<storage, read_write> xq: array<u32>;

const Q8_K: u32 = {{Q8_K}}u;

// #include q8_common

// Call in uniform control flow (q8_store holds barriers).
fn q8_out(vals: vec4<f32>, v: u32, tid: u32, live: bool, t: u32) {
    q8_store(vals, v, tid, live, t * (Q8_K / 4u + Q8_K / 16u), Q8_K);
}
