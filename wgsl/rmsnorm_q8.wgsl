// RMSNorm whose output also goes out rounded to 8 bits per 32 values
// (q8_common.wgsl), ready for the int8 GEMV that reads it next: one dispatch
// instead of a norm and a quantize. A plain norm only (group = width), width
// % 256 == 0. Workgroup j of a token writes values [1024 j, 1024 j + 1024);
// each sums the whole row's squares itself (the same sum in the same order
// in every workgroup), which is quicker than one workgroup doing every
// slice in turn: dispatch (ceil(width / 1024), T, 1). TWIN (rmsnorm_twin_on.wgsl): a second
// norm of the row, another weight, written beside it.

struct Params {
    width: u32,
    group: u32,
    eps: f32,
    T: u32,
    q_stride: u32,  // xq words between tokens
    scale: f32,     // TWIN's
    w2_width: u32,
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> g: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> xq: array<u32>;

// #include q8_common
// #include rms_tree
{{TWIN}}

var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    if (wid.y >= params.T) {
        return;
    }
    let base = wid.y * params.width;
    // Each invocation owns words tid, tid + 256, ...: 4 consecutive values each.
    var s4 = vec4<f32>(0.0);
    for (var w = tid; 4u * w < params.width; w += WG) {
        let v = vec4<f32>(x[base + 4u * w], x[base + 4u * w + 1u], x[base + 4u * w + 2u], x[base + 4u * w + 3u]);
        s4 += v * v;
    }
    let inv = rms_tree((s4.x + s4.y) + (s4.z + s4.w), tid, params.width, params.eps);
    let i = 4u * (wid.x * WG + tid);  // this invocation's 4 values
    let live = i < params.width;
    var o = vec4<f32>(0.0);
    if (live) {
        let v = vec4<f32>(x[base + i], x[base + i + 1u], x[base + i + 2u], x[base + i + 3u]);
        o = v * inv * vec4<f32>(g[i], g[i + 1u], g[i + 2u], g[i + 3u]);
        y[base + i] = o.x;
        y[base + i + 1u] = o.y;
        y[base + i + 2u] = o.z;
        y[base + i + 3u] = o.w;
        twin_store(base, i, v, inv);
    }
    q8_store(o, i, tid, live, wid.y * params.q_stride, params.width);
}
