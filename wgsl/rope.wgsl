// Rotary position embedding, in place on x [T, n_heads * head_dim].
// STYLE norm rotates adjacent pairs (x[2i], x[2i+1]) (llama); neox rotates
// (x[i], x[i + n_rot/2]) (qwen, gemma). Dims >= n_rot are left alone.
// angle_i = pos * freq_scale * theta^(-2i/n_rot) / factor_i, pos = rows[2t] (the
// row's position; padding rows are rotated by whatever they hold, unread later).
// Dispatch (n_heads, T, 1).

struct Params {
    n_heads: u32,
    head_dim: u32,
    n_rot: u32,
    theta: f32,
    freq_scale: f32,
    has_factors: u32,
}

const WG: u32 = 64u;
// STYLE is filled with `norm` or `neox`, which name these constants.
const norm: u32 = 0u;
const neox: u32 = 1u;
const STYLE: u32 = {{STYLE}};
// #include rope_common

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> factors: array<f32>;
@group(0) @binding(3) var<storage, read> rows: array<u32>;  // [2t]: position of row t, [2t + 1]: its slot

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let pos = f32(rows[2u * wid.y]);
    let base = (wid.y * params.n_heads + wid.x) * params.head_dim;
    let half_rot = params.n_rot / 2u;
    for (var i = tid; i < half_rot; i += WG) {
        var factor = 1.0;
        if (params.has_factors != 0u) {
            factor = factors[i];
        }
        let cs = rope_cos_sin(pos, i, params.n_rot, params.theta, params.freq_scale, factor);
        let c = cs.x;
        let s = cs.y;
        var ia: u32;
        var ib: u32;
        if (STYLE == neox) {
            ia = base + i;
            ib = base + i + half_rot;
        } else {
            ia = base + 2u * i;
            ib = ia + 1u;
        }
        let a = x[ia];
        let b = x[ib];
        x[ia] = a * c - b * s;
        x[ib] = a * s + b * c;
    }
}
