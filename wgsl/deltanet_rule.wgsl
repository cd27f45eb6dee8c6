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
// one dispatch fewer). A row's loads are issued a row ahead, and a row has one barrier of its own
// (main). Invocation tid holds column b * WC + tid % WC (b = the workgroup's block) and rows
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
var<workgroup> part_k: array<f32, 2u * WG>;  // two halves: rows alternate (main)
var<workgroup> part_o: array<f32, 2u * WG>;

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

// One row's inputs for an invocation: the raw gates and its column's v (gates: beta, alpha, v),
// and (FAST and PRE) its rows of the normalised k and q. Loads past the batch are never made:
// the caller clamps t.
struct RowIn {
    gates: vec3<f32>,
    k0: vec4<f32>,
    k1: vec4<f32>,
    k2: vec4<f32>,
    k3: vec4<f32>,
    q0: vec4<f32>,
    q1: vec4<f32>,
    q2: vec4<f32>,
    q3: vec4<f32>,
}

fn fetch(t: u32, h: u32, kh: u32, k_off: u32, i0: u32, j: u32) -> RowIn {
    let H = params.h_v;
    let row = t * params.conv_dim;
    var x: RowIn;
    x.gates = vec3<f32>(beta[t * H + h], alpha[t * H + h], u[row + 2u * k_off + h * DK + j]);
    if (FAST && PRE) {
        let kb = row + k_off + kh * DK + i0;
        let qb = row + kh * DK + i0;
        x.k0 = u4(kb);
        x.k1 = u4(kb + 4u);
        x.k2 = u4(kb + 8u);
        x.k3 = u4(kb + 12u);
        x.q0 = u4(qb);
        x.q1 = u4(qb + 4u);
        x.q2 = u4(qb + 8u);
        x.q3 = u4(qb + 12u);
    }
    return x;
}

// An invocation's NI rows of row t's normalised k (off = k_off) or q (off = 0) (PRE, not FAST).
fn fetch_k(t: u32, kh: u32, off: u32, i0: u32) -> array<f32, NI> {
    var x: array<f32, NI>;
    let b = t * params.conv_dim + off + kh * DK + i0;
    for (var i = 0u; i < NI; i++) {
        x[i] = u[b + i];
    }
    return x;
}

// Row t's output at column j: the R partial sums of its column in part_o's half at `half`.
fn write_out(t: u32, h: u32, j: u32, c: u32, half: u32) {
    var ot = 0.0;
    for (var q = 0u; q < R; q++) {
        ot += part_o[half + q * WC + c];
    }
    o[t * params.h_v * DK + h * DK + j] = ot * params.scale;
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
    // Row t + 1's inputs are loaded while row t computes (software pipelining): a row's math is
    // short, so a row cost the latency of its loads (the slot tag, then the gates, v, k and q)
    // plus its barriers. `cur` holds row t's, `nxt` row t + 1's (the last row again at the end).
    var cur_pos = rows[0];
    var cur_slot = rows[1];
    var cur = fetch(0u, h, kh, k_off, i0, j);
    var cur_k: array<f32, NI>;
    var cur_q: array<f32, NI>;
    if (PRE && !FAST) {
        cur_k = fetch_k(0u, kh, k_off, i0);
        cur_q = fetch_k(0u, kh, 0u, i0);
    }
    // One barrier a row: part_k and part_o alternate between two halves (par), and a row's
    // output is summed and written after the next row's barrier (pend_t), when every part_o of it
    // is in. A half is rewritten two rows later, past a barrier every reader of it has reached.
    var par = 0u;
    var pend = false;
    var pend_t = 0u;
    for (var t = 0u; t < n; t++) {
        let tn = min(t + 1u, n - 1u);
        let nxt_pos = rows[2u * tn];
        let nxt_slot = rows[2u * tn + 1u];
        let nxt = fetch(tn, h, kh, k_off, i0, j);
        var nxt_k: array<f32, NI>;
        var nxt_q: array<f32, NI>;
        if (PRE && !FAST) {
            nxt_k = fetch_k(tn, kh, k_off, i0);
            nxt_q = fetch_k(tn, kh, 0u, i0);
        }
        if (cur_slot == slot) {
            if (cur_pos == 0u) {
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
            let b = 1.0 / (1.0 + exp(-cur.gates.x));
            let x = cur.gates.y + dt_bias;
            var sp = x;  // ggml's softplus: x itself above 20
            if (x <= 20.0) {
                sp = log1p_(exp(x));
            }
            let decay = exp(sp * a);
            let v = cur.gates.z;
            let pk = par * WG;
            var kr: array<f32, NI>;  // this invocation's rows of the normalised k and q
            var qr: array<f32, NI>;
            var k0 = cur.k0;
            var k1 = cur.k1;
            var k2 = cur.k2;
            var k3 = cur.k3;
            var q0 = cur.q0;
            var q1 = cur.q1;
            var q2 = cur.q2;
            var q3 = cur.q3;
            if (!PRE) {  // decode: q and k normalised here (one dispatch fewer)
                normalise_qk(t * params.conv_dim, kh, k_off, tid);
                if (FAST) {
                    k0 = vec4<f32>(ks[i0], ks[i0 + 1u], ks[i0 + 2u], ks[i0 + 3u]);
                    k1 = vec4<f32>(ks[i0 + 4u], ks[i0 + 5u], ks[i0 + 6u], ks[i0 + 7u]);
                    k2 = vec4<f32>(ks[i0 + 8u], ks[i0 + 9u], ks[i0 + 10u], ks[i0 + 11u]);
                    k3 = vec4<f32>(ks[i0 + 12u], ks[i0 + 13u], ks[i0 + 14u], ks[i0 + 15u]);
                    q0 = vec4<f32>(qs[i0], qs[i0 + 1u], qs[i0 + 2u], qs[i0 + 3u]);
                    q1 = vec4<f32>(qs[i0 + 4u], qs[i0 + 5u], qs[i0 + 6u], qs[i0 + 7u]);
                    q2 = vec4<f32>(qs[i0 + 8u], qs[i0 + 9u], qs[i0 + 10u], qs[i0 + 11u]);
                    q3 = vec4<f32>(qs[i0 + 12u], qs[i0 + 13u], qs[i0 + 14u], qs[i0 + 15u]);
                } else {
                    for (var i = 0u; i < NI; i++) {
                        kr[i] = ks[i0 + i];
                        qr[i] = qs[i0 + i];
                    }
                }
            } else if (!FAST) {
                kr = cur_k;
                qr = cur_q;
            }
            if (FAST) {
                S0 *= decay;
                S1 *= decay;
                S2 *= decay;
                S3 *= decay;
                part_k[pk + tid] = dot(S0, k0) + dot(S1, k1) + dot(S2, k2) + dot(S3, k3);
            } else {
                var kS = 0.0;
                for (var i = 0u; i < NI; i++) {
                    S[i] *= decay;
                    kS += S[i] * kr[i];
                }
                part_k[pk + tid] = kS;
            }
            workgroupBarrier();
            if (pend && r == 0u && on) {
                write_out(pend_t, h, j, c, (par ^ 1u) * WG);
            }
            var kS = 0.0;
            for (var q = 0u; q < R; q++) {
                kS += part_k[pk + q * WC + c];
            }
            let delta = b * (v - kS);
            if (FAST) {
                S0 += k0 * delta;
                S1 += k1 * delta;
                S2 += k2 * delta;
                S3 += k3 * delta;
                part_o[pk + tid] = dot(S0, q0) + dot(S1, q1) + dot(S2, q2) + dot(S3, q3);
            } else {
                var ov = 0.0;
                for (var i = 0u; i < NI; i++) {
                    S[i] += kr[i] * delta;
                    ov += S[i] * qr[i];
                }
                part_o[pk + tid] = ov;
            }
            pend = true;
            pend_t = t;
            par ^= 1u;
        }
        cur_pos = nxt_pos;
        cur_slot = nxt_slot;
        cur = nxt;
        if (PRE && !FAST) {
            cur_k = nxt_k;
            cur_q = nxt_q;
        }
    }
    workgroupBarrier();
    if (pend && r == 0u && on) {
        write_out(pend_t, h, j, c, (par ^ 1u) * WG);
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
