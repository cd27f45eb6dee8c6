// gemma4's small ops (infr/gpu/kernels_gemma4.py), over n values, one per invocation; dispatch as
// elementwise.wgsl (ceil(n / 256) groups, folded into y past the per-dimension limit).
// gated_gelu_f16: y[i] = gelu_f16(g[i]) * u[(i / width) * stride + off + i % width]: the gated
//   activation (width = stride = n, off = 0) and the per-layer-input gate (u one layer's slice of
//   the per-layer inputs). gelu_f16 (gelu_f16.wgsl) is llama.cpp CPU's table GELU, read from the
//   CPU reference's table (numerics.gelu_f16_table) at the f16 bits of g: bit for bit the CPU's.
// mul: x[i] = (x[i] * scale) * w[i % width] in place (width 1: one value for every element).
// add_scaled: y[i] = (a[i] + b[i]) * scale.

struct Params {
    n: u32,
    width: u32,
    stride: u32,
    off: u32,
    scale: f32,
}

const WG: u32 = 256u;

// #include gelu_f16

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> g: array<f32>;
@group(0) @binding(2) var<storage, read> u: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> gelu_table: array<f32>;
// the in-place entry (mul): x, and w (a vector, or one value)
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;

fn index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

@compute @workgroup_size(WG)
fn gated_gelu_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    let r = i / params.width;
    y[i] = gelu_f16(g[i]) * u[r * params.stride + params.off + (i - r * params.width)];
}

@compute @workgroup_size(WG)
fn mul(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    x[i] = (x[i] * params.scale) * w[i % params.width];
}

@compute @workgroup_size(WG)
fn add_scaled(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    y[i] = (g[i] + u[i]) * params.scale;
}
