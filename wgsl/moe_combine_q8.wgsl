// A MoE block's end and the next norm in one dispatch (fusion.py's moe_residual_norm): the experts' sum
// added to the stream, y[t] = resid[t] + combine(ys)[t] (moe_combine.wgsl's combine, the same floats),
// then the RMSNorm of that new row, z[t] = y[t] / rms(y[t]) * g, written and rounded for the int8 GEMV
// that reads it next (rmsnorm_q8.wgsl's sum in its order: the same bits as the two kernels one after
// another). Workgroup j of a row writes values [1024 j, 1024 j + 1024), each summing the whole row's
// squares itself (every pair row is read once per workgroup for that). D % 256 == 0; y never aliases
// resid. Dispatch (ceil(D / 1024), T, 1).

struct Params {
    D: u32,
    K: u32,         // n_used
    T: u32,
    weighted: u32,  // each pair's row times its router weight
    scaled: u32,    // each pair's row times its expert's scale first
    eps: f32,
    q_stride: u32,  // xq words between tokens
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> wts: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> resid: array<f32>;
@group(0) @binding(5) var<storage, read> scales: array<f32>;
@group(0) @binding(6) var<storage, read> ids: array<u32>;
@group(0) @binding(7) var<storage, read> g: array<f32>;
@group(0) @binding(8) var<storage, read_write> z: array<f32>;
@group(0) @binding(9) var<storage, read_write> xq: array<u32>;

// #include moe_pair_sum
// #include q8_common
// #include rms_tree

var<workgroup> partial: array<f32, WG>;

// Values c .. c + 3 of token t's new stream row (combine's resid + sum).
fn row4(t: u32, c: u32) -> vec4<f32> {
    let b = t * params.D + c;
    return vec4<f32>(resid[b] + pair_sum(t, c), resid[b + 1u] + pair_sum(t, c + 1u),
                     resid[b + 2u] + pair_sum(t, c + 2u), resid[b + 3u] + pair_sum(t, c + 3u));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let t = wid.y;
    if (t >= params.T) {
        return;
    }
    let base = t * params.D;
    var s4 = vec4<f32>(0.0);  // rmsnorm_q8's: invocation tid owns words tid, tid + 256, ... of 4 values
    for (var w = tid; 4u * w < params.D; w += WG) {
        let v = row4(t, 4u * w);
        s4 += v * v;
    }
    let inv = rms_tree((s4.x + s4.y) + (s4.z + s4.w), tid, params.D, params.eps);
    let i = 4u * (wid.x * WG + tid);
    let live = i < params.D;
    var o = vec4<f32>(0.0);
    if (live) {
        let v = row4(t, i);
        y[base + i] = v.x;
        y[base + i + 1u] = v.y;
        y[base + i + 2u] = v.z;
        y[base + i + 3u] = v.w;
        o = v * inv * vec4<f32>(g[i], g[i + 1u], g[i + 2u], g[i + 3u]);
        z[base + i] = o.x;
        z[base + i + 1u] = o.y;
        z[base + i + 2u] = o.z;
        z[base + i + 3u] = o.w;
    }
    q8_store(o, i, tid, live, t * params.q_stride, params.D);
}
