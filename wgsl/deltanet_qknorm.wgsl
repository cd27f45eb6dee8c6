// The DeltaNet's L2 norms of q and k (qwen35; CPU reference infr/cpu/deltanet.py), in place in
// the conv's output u = [q | k | v]: x / sqrt(sum(x^2) + eps) per row and K-head. A parallel pass
// before the token-serial delta rule of a prompt batch (deltanet_rule.wgsl with PRE), which then
// needs no reductions per row. One workgroup per (q or k, K-head, row); rows past live[1] are
// padding. Dispatch (2 H_k, T, 1).

struct Params {
    h_k: u32,
    conv_dim: u32,
    eps: f32,
}

const DK: u32 = {{DK}}u;
const WG: u32 = {{WG}}u;  // a power of two

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> live: array<u32>;
@group(0) @binding(2) var<storage, read_write> u: array<f32>;  // [T, conv_dim]

var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let t = wid.y;
    if (t >= live[1]) {
        return;
    }
    let base = t * params.conv_dim + wid.x * DK;  // q heads, then k heads: K-head wid.x mod H_k
    var acc = 0.0;
    for (var i = tid; i < DK; i += WG) {
        let v = u[base + i];
        acc += v * v;
    }
    red[tid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (tid < s) {
            red[tid] += red[tid + s];
        }
        workgroupBarrier();
    }
    let norm = sqrt(red[0] + params.eps);
    for (var i = tid; i < DK; i += WG) {
        u[base + i] = u[base + i] / norm;
    }
}
