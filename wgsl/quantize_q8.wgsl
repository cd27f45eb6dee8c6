// Activations rounded to 8 bits per 32 values, the input of the int8 GEMV
// (gemv.wgsl multiplies them with dot4I8Packed). Per 32 values:
// d = max|x| / 127, q = round(x / d), and the block keeps d and d * sum(q).
//
// Layout of one token's row (x_stride vec4 = 5K/64): K bytes of q, then K/16
// words of scales. The q bytes are permuted so that each GEMV lane finds its
// 32 bytes together and neighbouring lanes read neighbouring bytes: in block b
// (256 values), lane part p (c = p / 2, h = 16 (p % 2)) owns bytes
// [256 b + 32 p, +32): q of values 64c + h .. +16 then 64c + 32 + h .. +16,
// the order of the Q4_K nibbles it multiplies; the other types' readers
// pick their 16-value runs (one vec4 each) from it. The scales of block b,
// pair c (sub-blocks 2c and 2c + 1) are one vec4 (d_a, s_a, d_b, s_b).
//
// One invocation per 4 values (one word), 8 per 32-value block; dispatch
// (ceil(K / 1024), T, 1). K % 64 == 0: the permutation stays inside each 64
// values (c = value / 64), so a last partial block of 256 fills its first K % 256 bytes.

struct Params {
    K: u32,
    T: u32,
    x_stride: u32,  // floats between tokens of x
    q_stride: u32,  // words between tokens of xq (5K/16)
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> xq: array<u32>;

// #include q8_common

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    if (wid.y >= params.T) {
        return;
    }
    let v = 4u * (wid.x * 256u + tid);  // first of this invocation's 4 values
    let live = v < params.K;
    var vals = vec4<f32>(0.0);
    if (live) {
        let xo = wid.y * params.x_stride + v;
        vals = vec4<f32>(x[xo], x[xo + 1u], x[xo + 2u], x[xo + 3u]);
    }
    q8_store(vals, v, tid, live, wid.y * params.q_stride, params.K);
}
