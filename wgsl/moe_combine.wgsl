// The rows around the expert GEMVs (kernels_moe). Pair a = t * n_used + s is token t's s-th
// expert; wts[a] its router weight.
// combine: dst[t] = sum over s, in selection order, of src[a] * wts[a] (src[a] alone when
//   the weight was applied before the expert): the experts' sum, as the CPU reference adds it;
//   with `resid`, resid[t] + that sum (the residual add after the MoE: one dispatch fewer); with
//   `scaled` (gemma4's per-expert output scales), src[a] * scales[ids[a]] first, as expert_scale
//   (kernels_gemma4) would leave it in place.
// scale_rows: dst[a] = src[t] * wts[a]: llama4's input scaled by the weight before the expert.
// dispatch (ceil(D / 256), rows, 1): rows = T (combine) or T * n_used (scale_rows) = params.T.

struct Params {
    D: u32,         // values per row
    K: u32,         // n_used
    T: u32,         // output rows
    weighted: u32,  // combine: multiply by wts
    resid: u32,     // combine: add the sum to resid's row
    scaled: u32,    // combine: each pair's row times its expert's scale first
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> wts: array<f32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;
@group(0) @binding(4) var<storage, read> resid: array<f32>;  // combine only
@group(0) @binding(5) var<storage, read> scales: array<f32>;  // combine only: [n_expert]
@group(0) @binding(6) var<storage, read> ids: array<u32>;  // combine only: each pair's expert

// #include moe_pair_sum

@compute @workgroup_size(256)
fn combine(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let t = gid.y;
    if (c >= params.D || t >= params.T) {
        return;
    }
    var acc = pair_sum(t, c);
    if (params.resid != 0u) {
        acc = resid[t * params.D + c] + acc;
    }
    dst[t * params.D + c] = acc;
}

@compute @workgroup_size(256)
fn scale_rows(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let a = gid.y;
    if (c >= params.D || a >= params.T) {
        return;
    }
    dst[a * params.D + c] = src[(a / params.K) * params.D + c] * wts[a];
}
