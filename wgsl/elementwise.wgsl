// Elementwise ops over n = T * width values, one value per invocation.
// Dispatch (ceil(n / 256), 1, 1); when that exceeds the per-dimension limit
// (65535 groups, n > 16.7M) the host spreads groups over y as well, so the
// index is linearised over the whole grid.
// gated_silu / gated_gelu: y = act(g) * u;  add: y = a + b;  softcap: x = tanh(x / c) * c.
// All entries share one Params layout: {n} packed alone pads `cap` to zero.

struct Params {
    n: u32,
    cap: f32,
}

const WG: u32 = 256u;

// #include activations

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;  // g for the gated entries
@group(0) @binding(2) var<storage, read> b: array<f32>;  // u for the gated entries
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
// softcap works in place on binding 1; bindings may alias across entry points.
@group(0) @binding(1) var<storage, read_write> xio: array<f32>;

fn index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

@compute @workgroup_size(WG)
fn gated_silu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    y[i] = silu(a[i]) * b[i];
}

@compute @workgroup_size(WG)
fn gated_gelu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    y[i] = gelu(a[i]) * b[i];
}

@compute @workgroup_size(WG)
fn add(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    y[i] = a[i] + b[i];
}

@compute @workgroup_size(WG)
fn softcap(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    xio[i] = tanh_safe(xio[i] / params.cap) * params.cap;
}
