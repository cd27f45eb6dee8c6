// The MoE router's choice per token row (llama.cpp's build_moe_ffn, wave2-families.md section 0):
// p = softmax or sigmoid of the row's logits; the n_used largest of p (or of the raw logits:
// llama4) in descending order, ties to the lower expert (a stable sort's order); weights p_e,
// divided by max(their sum, 6.103515625e-5) when NORM, times `scale` when SCALE. Written as
// ids[t * n_used + s] and wts[t * n_used + s] for the expert kernels: nothing goes to the host.
// One invocation per row: n_expert * n_used compares cost little beside the experts' GEMVs.
// dispatch (ceil(T / 64), 1, 1).

struct Params {
    E: u32,      // experts
    K: u32,      // used per token
    T: u32,
    flags: u32,  // SIGMOID | ON_LOGITS | NORM | SCALE
    scale: f32,
}

const SIGMOID: u32 = 1u;
const ON_LOGITS: u32 = 2u;
const NORM: u32 = 4u;
const SCALE: u32 = 8u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> wts: array<f32>;

// Softmax as ggml: exp(l - max) times the reciprocal of the row's sum.
fn prob(l: f32, mx: f32, inv: f32) -> f32 {
    if ((params.flags & SIGMOID) != 0u) {
        return 1.0 / (1.0 + exp(-l));
    }
    return exp(l - mx) * inv;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x;
    if (t >= params.T) {
        return;
    }
    let row = t * params.E;
    var mx = logits[row];
    for (var e = 1u; e < params.E; e++) {
        mx = max(mx, logits[row + e]);
    }
    var sum = 0.0;
    for (var e = 0u; e < params.E; e++) {
        sum += exp(logits[row + e] - mx);
    }
    let inv = 1.0 / sum;
    let on_logits = (params.flags & ON_LOGITS) != 0u;
    let out = t * params.K;
    var total = 0.0;
    for (var s = 0u; s < params.K; s++) {
        var best = 0u;
        var best_score = 0.0;
        var found = false;
        for (var e = 0u; e < params.E; e++) {
            var taken = false;
            for (var j = 0u; j < s; j++) {
                taken = taken || ids[out + j] == e;
            }
            let l = logits[row + e];
            let score = select(prob(l, mx, inv), l, on_logits);
            if (!taken && (!found || score > best_score)) {
                best = e;
                best_score = score;
                found = true;
            }
        }
        let w = prob(logits[row + best], mx, inv);
        ids[out + s] = best;
        wts[out + s] = w;
        total += w;
    }
    let d = select(1.0, max(total, 6.103515625e-5), (params.flags & NORM) != 0u);
    let k = select(1.0, params.scale, (params.flags & SCALE) != 0u);
    for (var s = 0u; s < params.K; s++) {
        var w = wts[out + s];
        if ((params.flags & NORM) != 0u) {
            w = w / d;
        }
        if ((params.flags & SCALE) != 0u) {
            w = w * k;
        }
        wts[out + s] = w;
    }
}
