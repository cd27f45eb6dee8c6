// The gated delta rule of a DeltaNet layer (qwen35; CPU reference infr/cpu/deltanet.py),
// token-serial: each workgroup walks the live rows in batch order, taking those of its sequence
// slot s (in position order; the host checks). A V-head's d_k x d_v state S is split over NB
// workgroups by columns (WC each) and, inside one, over R invocations by rows (NI each), so S
// stays in registers (NI floats an invocation, a loop the compiler unrolls) and a decode step has
// NB * H_v workgroups loading it at once: one workgroup a head kept d_k floats an invocation,
// which spilled, and left most of the GPU idle. A row at position 0 starts from zeros, else the
// slot's S is read from rstate once and written back at the end.
// Per row (u: the conv's silu output, [q | k | v]; V-head h reads K-head h mod H_k):
//   q, k = l2norm(u's K-head rows); S *= exp(g); delta = beta (v - S^T k); S += k delta^T;
//   o = S^T q / sqrt(d_k), into o (the gated RMSNorm over a head's columns is deltanet_norm.wgsl).
// The gates come from the row's beta and alpha here (no dispatch of their own):
//   beta' = sigmoid(beta), g = softplus(alpha + dt_bias) * a (<= 0: a = -exp(A_log)).
// Prompt batches (PRE) take q and k normalised by deltanet_qknorm.wgsl, a parallel pass over
// every row, so a row costs two barriers here instead of a dozen (decode keeps the sums here:
// one dispatch fewer). Invocation tid holds column b * WC + tid % WC (b = the workgroup's block) and rows
// (tid / WC) * NI .. + NI. Dispatch (NB * H_v, max_seqs, 1).

struct Params {
    h_k: u32,
    h_v: u32,
    conv_dim: u32,
    slot_stride: u32,
    s_base: u32,  // where a slot's matrices start in its rstate floats (after the conv state)
    eps: f32,
    scale: f32,  // 1 / sqrt(d_k)
}

const DK: u32 = {{DK}}u;  // d_k = d_v
const WC: u32 = {{WC}}u;  // columns a workgroup
const R: u32 = {{R}}u;  // invocations a column; R divides DK
const NI: u32 = DK / R;  // rows of S an invocation
const WG: u32 = WC * R;
const NB: u32 = (DK + WC - 1u) / WC;  // workgroups a head
const PRE: bool = {{PRE}};
// NI == 16 (d_k 128 with R 8: the real shapes): an invocation's rows of S, k and q are four named
// vec4s each, not arrays, so they are registers whatever the compiler does with arrays.
const FAST: bool = NI == 16u;  // q and k come normalised (deltanet_qknorm.wgsl: prompt batches)

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> u: array<f32>;  // [T, conv_dim]
@group(0) @binding(2) var<storage, read> beta: array<f32>;  // [T, H_v]
@group(0) @binding(3) var<storage, read> alpha: array<f32>;  // [T, H_v]
@group(0) @binding(4) var<storage, read> consts: array<f32>;  // [dt_bias (H_v) | a (H_v) | norm]
@group(0) @binding(5) var<storage, read> live: array<u32>;  // [1] live rows
@group(0) @binding(6) var<storage, read> rows: array<u32>;  // [2t] position, [2t + 1] slot
@group(0) @binding(7) var<storage, read_write> rstate: array<f32>;
@group(0) @binding(8) var<storage, read_write> o: array<f32>;  // [T, H_v * DK]

var<workgroup> qs: array<f32, DK>;
var<workgroup> ks: array<f32, DK>;
var<workgroup> red: array<vec2<f32>, WG>;
var<workgroup> part_k: array<f32, WG>;
var<workgroup> part_o: array<f32, WG>;

// log(1 + y) accurate for small y (WGSL has no log1p): the rounding of 1 + y divided out.
fn log1p_(y: f32) -> f32 {
    let s = 1.0 + y;
    if (s == 1.0) {
        return y;
    }
    return log(s) * (y / (s - 1.0));
}

// Rows i .. i + 3 of column j of S (sj: row i's float), and u's values b .. b + 3.
fn state4(sj: u32) -> vec4<f32> {
    return vec4<f32>(rstate[sj], rstate[sj + DK], rstate[sj + 2u * DK], rstate[sj + 3u * DK]);
}

fn u4(b: u32) -> vec4<f32> {
    return vec4<f32>(u[b], u[b + 1u], u[b + 2u], u[b + 3u]);
}

// q and k of the row's K-head into workgroup memory (qs, ks), L2-normalised: one tree sum of
// both. Every invocation calls it (uniform control flow: barriers).
fn normalise_qk(row: u32, kh: u32, k_off: u32, tid: u32) {
    var acc = vec2<f32>(0.0);
    for (var i = tid; i < DK; i += WG) {
        let qv = u[row + kh * DK + i];
        let kv = u[row + k_off + kh * DK + i];
        qs[i] = qv;
        ks[i] = kv;
        acc += vec2<f32>(qv * qv, kv * kv);
    }
    red[tid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (tid < s) {
            red[tid] += red[tid + s];
        }
        workgroupBarrier();
    }
    let norms = sqrt(red[0] + vec2<f32>(params.eps));
    for (var i = tid; i < DK; i += WG) {
        qs[i] = qs[i] / norms.x;
        ks[i] = ks[i] / norms.y;
    }
    workgroupBarrier();
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let h = wid.x / NB;
    let slot = wid.y;
    let H = params.h_v;
    let kh = h % params.h_k;
    let c = tid % WC;
    let r = tid / WC;
    let jc = (wid.x % NB) * WC + c;
    let on = jc < DK;
    let j = min(jc, DK - 1u);  // in range for every invocation; only `on` ones write
    let i0 = r * NI;
    let sb = slot * params.slot_stride + params.s_base + h * DK * DK;
    let k_off = params.h_k * DK;
    let dt_bias = consts[h];
    let a = consts[H + h];
    var S: array<f32, NI>;
    var S0 = vec4<f32>(0.0);
    var S1 = vec4<f32>(0.0);
    var S2 = vec4<f32>(0.0);
    var S3 = vec4<f32>(0.0);
    var loaded = false;
    let n = live[1];
    for (var t = 0u; t < n; t++) {
        if (rows[2u * t + 1u] != slot) {
            continue;
        }
        let p = rows[2u * t];
        if (p == 0u) {
            for (var i = 0u; i < NI; i++) {
                S[i] = 0.0;
            }
            S0 = vec4<f32>(0.0);
            S1 = S0;
            S2 = S0;
            S3 = S0;
        } else if (!loaded) {
            if (FAST) {
                let sj = sb + i0 * DK + j;
                S0 = state4(sj);
                S1 = state4(sj + 4u * DK);
                S2 = state4(sj + 8u * DK);
                S3 = state4(sj + 12u * DK);
            } else {
                for (var i = 0u; i < NI; i++) {
                    S[i] = rstate[sb + (i0 + i) * DK + j];
                }
            }
        }
        loaded = true;
        // the row's loads issued together (their latencies overlap); q and k of its K-head go
        // into workgroup memory, with their sums of squares
        let row = t * params.conv_dim;
        let b = 1.0 / (1.0 + exp(-beta[t * H + h]));
        let x = alpha[t * H + h] + dt_bias;
        var sp = x;  // ggml's softplus: x itself above 20
        if (x <= 20.0) {
            sp = log1p_(exp(x));
        }
        let decay = exp(sp * a);
        let v = u[row + 2u * k_off + h * DK + j];
        var kr: array<f32, NI>;  // this invocation's rows of the normalised k and q
        var qr: array<f32, NI>;
        if (FAST) {
            var k0: vec4<f32>;
            var k1: vec4<f32>;
            var k2: vec4<f32>;
            var k3: vec4<f32>;
            var q0: vec4<f32>;
            var q1: vec4<f32>;
            var q2: vec4<f32>;
            var q3: vec4<f32>;
            if (PRE) {
                let kb = row + k_off + kh * DK + i0;
                let qb = row + kh * DK + i0;
                k0 = u4(kb);
                k1 = u4(kb + 4u);
                k2 = u4(kb + 8u);
                k3 = u4(kb + 12u);
                q0 = u4(qb);
                q1 = u4(qb + 4u);
                q2 = u4(qb + 8u);
                q3 = u4(qb + 12u);
            } else {
                normalise_qk(row, kh, k_off, tid);
                k0 = vec4<f32>(ks[i0], ks[i0 + 1u], ks[i0 + 2u], ks[i0 + 3u]);
                k1 = vec4<f32>(ks[i0 + 4u], ks[i0 + 5u], ks[i0 + 6u], ks[i0 + 7u]);
                k2 = vec4<f32>(ks[i0 + 8u], ks[i0 + 9u], ks[i0 + 10u], ks[i0 + 11u]);
                k3 = vec4<f32>(ks[i0 + 12u], ks[i0 + 13u], ks[i0 + 14u], ks[i0 + 15u]);
                q0 = vec4<f32>(qs[i0], qs[i0 + 1u], qs[i0 + 2u], qs[i0 + 3u]);
                q1 = vec4<f32>(qs[i0 + 4u], qs[i0 + 5u], qs[i0 + 6u], qs[i0 + 7u]);
                q2 = vec4<f32>(qs[i0 + 8u], qs[i0 + 9u], qs[i0 + 10u], qs[i0 + 11u]);
                q3 = vec4<f32>(qs[i0 + 12u], qs[i0 + 13u], qs[i0 + 14u], qs[i0 + 15u]);
            }
            S0 *= decay;
            S1 *= decay;
            S2 *= decay;
            S3 *= decay;
            part_k[tid] = dot(S0, k0) + dot(S1, k1) + dot(S2, k2) + dot(S3, k3);
            workgroupBarrier();
            var kS4 = 0.0;
            for (var q = 0u; q < R; q++) {
                kS4 += part_k[q * WC + c];
            }
            let d4 = b * (v - kS4);
            S0 += k0 * d4;
            S1 += k1 * d4;
            S2 += k2 * d4;
            S3 += k3 * d4;
            part_o[tid] = dot(S0, q0) + dot(S1, q1) + dot(S2, q2) + dot(S3, q3);
        } else {
            if (PRE) {  // deltanet_qknorm normalised them in u: no reduction, no barrier
                for (var i = 0u; i < NI; i++) {
                    kr[i] = u[row + k_off + kh * DK + i0 + i];
                    qr[i] = u[row + kh * DK + i0 + i];
                }
            } else {
                normalise_qk(row, kh, k_off, tid);
                for (var i = 0u; i < NI; i++) {
                    kr[i] = ks[i0 + i];
                    qr[i] = qs[i0 + i];
                }
            }
            var kS = 0.0;
            for (var i = 0u; i < NI; i++) {
                S[i] *= decay;
                kS += S[i] * kr[i];
            }
            part_k[tid] = kS;
            workgroupBarrier();
            kS = 0.0;
            for (var q = 0u; q < R; q++) {
                kS += part_k[q * WC + c];
            }
            let delta = b * (v - kS);
            var ov = 0.0;
            for (var i = 0u; i < NI; i++) {
                S[i] += kr[i] * delta;
                ov += S[i] * qr[i];
            }
            part_o[tid] = ov;
        }
        workgroupBarrier();  // also: every read of qs, ks, red[0] and part_k is done before the next row
        if (r == 0u && on) {
            var ot = 0.0;
            for (var q = 0u; q < R; q++) {
                ot += part_o[q * WC + c];
            }
            o[t * H * DK + h * DK + j] = ot * params.scale;
        }
    }
    if (loaded && on) {
        if (FAST) {
            let sj = sb + i0 * DK + j;
            for (var i = 0u; i < 4u; i++) {
                rstate[sj + i * DK] = S0[i];
                rstate[sj + (4u + i) * DK] = S1[i];
                rstate[sj + (8u + i) * DK] = S2[i];
                rstate[sj + (12u + i) * DK] = S3[i];
            }
        } else {
            for (var i = 0u; i < NI; i++) {
                rstate[sb + (i0 + i) * DK + j] = S[i];
            }
        }
    }
}
