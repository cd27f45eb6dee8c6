// The MoE router's choice per token row (llama.cpp's build_moe_ffn, wave2-families.md section 0):
// p = softmax or sigmoid of the row's logits; the n_used largest of p (or of the raw logits:
// llama4) in descending order, ties to the lower expert (a stable sort's order); weights p_e,
// divided by max(their sum, 6.103515625e-5) when NORM, times `scale` when SCALE. Written as
// ids[t * n_used + s] and wts[t * n_used + s] for the expert kernels: nothing goes to the host.
//
// One workgroup per row: the row's max and sum are tree reductions, then every invocation ranks
// its experts against the row's scores in shared memory; the n_used of rank < n_used are the
// picks. (One invocation per row made a decode step's route a serial n_used x n_expert scan: 464
// µs a layer on an H100 for 128x8; n_used arg-max reductions after it, 30 µs.)
// dispatch (T, 1, 1); E <= MAX_E (the host checks).

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
const WG: u32 = 128u;
const MAX_E: u32 = 1024u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> wts: array<f32>;

var<workgroup> score: array<f32, MAX_E>;
var<workgroup> red_f: array<f32, WG>;
var<workgroup> picked: array<f32, 64>;  // the chosen weights, before NORM / SCALE (K <= 64)

// Softmax as ggml: exp(l - max) times the reciprocal of the row's sum.
fn prob(l: f32, mx: f32, inv: f32) -> f32 {
    if ((params.flags & SIGMOID) != 0u) {
        return 1.0 / (1.0 + exp(-l));
    }
    return exp(l - mx) * inv;
}

// (score a, expert ia) ranks before (b, ib): larger score, then the lower expert.
fn before(a: f32, ia: u32, b: f32, ib: u32) -> bool {
    return a > b || (a == b && ia < ib);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let t = wid.x;
    let E = params.E;
    let row = t * E;

    var mx = logits[row];  // every invocation starts from a real logit (E >= 1)
    for (var e = tid; e < E; e += WG) {
        mx = max(mx, logits[row + e]);
    }
    red_f[tid] = mx;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s /= 2u) {
        if (tid < s) {
            red_f[tid] = max(red_f[tid], red_f[tid + s]);
        }
        workgroupBarrier();
    }
    mx = red_f[0];
    workgroupBarrier();
    var part = 0.0;
    for (var e = tid; e < E; e += WG) {
        part += exp(logits[row + e] - mx);
    }
    red_f[tid] = part;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s /= 2u) {
        if (tid < s) {
            red_f[tid] += red_f[tid + s];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / red_f[0];
    let on_logits = (params.flags & ON_LOGITS) != 0u;
    for (var e = tid; e < E; e += WG) {
        let l = logits[row + e];
        let v = select(prob(l, mx, inv), l, on_logits);
        score[e] = select(v, -3e38, v != v);  // NaN (a diverged row) ranks last, so the order stays total
    }
    workgroupBarrier();

    // Each expert's rank in the selection order (score descending, ties to the lower expert) is
    // the number of experts before it; ranks 0 .. K - 1 are the picks, in order. A strict total
    // order gives distinct ranks, so every slot is written once, all in one pass: K arg-max
    // reductions cost K x log2(WG) barriers, the bulk of a decode step's route.
    let out = t * params.K;
    for (var e = tid; e < E; e += WG) {
        let s = score[e];
        var rank = 0u;
        for (var j = 0u; j < E && rank < params.K; j++) {  // past K before it: not picked
            rank += select(0u, 1u, before(score[j], j, s, e));
        }
        if (rank < params.K) {
            ids[out + rank] = e;
            picked[rank] = prob(logits[row + e], mx, inv);
        }
    }
    workgroupBarrier();

    if (tid == 0u) {
        var total = 0.0;
        for (var k = 0u; k < params.K; k++) {
            total += picked[k];
        }
        let d = max(total, 6.103515625e-5);
        for (var k = 0u; k < params.K; k++) {
            var w = picked[k];
            if ((params.flags & NORM) != 0u) {
                w = w / d;
            }
            if ((params.flags & SCALE) != 0u) {
                w = w * params.scale;
            }
            wts[out + k] = w;
        }
    }
}
