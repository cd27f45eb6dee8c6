// RMSNorm: y = x / sqrt(mean(x^2) + eps) * g, over groups of `group` values.
// One workgroup per (group, token): dispatch (width / group, T, 1). A plain
// norm has group = width; QK-norm has group = head_dim and g of length group.

struct Params {
    width: u32,
    group: u32,
    eps: f32,
    T: u32,
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> g: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

var<workgroup> partial: array<f32, WG>;

// #include rms_common

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    // The guard is uniform (params and workgroup id only), so barriers below stay legal.
    if (wid.y >= params.T) {
        return;
    }
    let base = wid.y * params.width + wid.x * params.group;
    let inv = row_inv(base, tid);
    var k = tid;
    for (; k + 3u * WG < params.group; k += 4u * WG) {
        let v = vec4<f32>(x[base + k], x[base + k + WG], x[base + k + 2u * WG], x[base + k + 3u * WG]);
        let gg = vec4<f32>(g[k], g[k + WG], g[k + 2u * WG], g[k + 3u * WG]);
        let o = v * inv * gg;
        y[base + k] = o.x;
        y[base + k + WG] = o.y;
        y[base + k + 2u * WG] = o.z;
        y[base + k + 3u * WG] = o.w;
    }
    for (; k < params.group; k += WG) {
        y[base + k] = x[base + k] * inv * g[k];
    }
}
