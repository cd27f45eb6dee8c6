// The chunked gated delta rule (qwen35's DeltaNet; CPU reference infr/cpu/deltanet.py, derivation
// in tests/test_deltanet_chunk.py), pass 1 of 2: everything inside a chunk, in parallel over
// (chunk, V-head, slot). A chunk is C consecutive rows of one slot (deltanet_chunk_index.wgsl's
// idx), n <= C of them. With gamma_i = g_0 + .. + g_i (g = softplus(alpha + dt_bias) * a) and
// beta' = sigmoid(beta):
//   A = strictly-lower(beta'_i exp(gamma_i - gamma_j) k_i.k_j), X = (I + A)^-1 (forward substitution),
//   W = X (beta' exp(gamma) * K), U = X (beta' * V), M = scale lower-incl-diag(exp(gamma_i - gamma_j) q_i.k_j),
// into the scratch cs by row: W, U [cap, H_v, DK], M [cap, H_v, C], gamma [cap, H_v]. Pass 2
// (deltanet_chunk_state.wgsl) walks the chunks with the state. q and k come normalised
// (deltanet_qknorm.wgsl). Only exp of gamma_i - gamma_j, i >= j, is taken: every factor <= 1.
// Rows past n load as zeros with beta' = 0, so they change nothing. Tiles of C x TK in workgroup
// memory (rows padded to P floats: no bank conflicts on column walks), 3 of them: 12.4 KiB.
// Dispatch (ceil(cap / C), H_v, n_slots).

struct Params {
    h_k: u32,
    h_v: u32,
    conv_dim: u32,
    cap: u32,
    n_slots: u32,
    scale: f32,  // 1 / sqrt(d_k)
}

const DK: u32 = {{DK}}u;  // d_k = d_v
const C: u32 = 32u;  // rows a chunk
const TK: u32 = 32u;  // columns a tile
const P: u32 = TK + 1u;
const WG: u32 = 256u;
const RG: u32 = WG / TK;  // row groups: invocation tid holds rows tid / TK + RG m, column tid % TK

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> u: array<f32>;  // [T, conv_dim]: q | k | v
@group(0) @binding(2) var<storage, read> beta: array<f32>;  // [T, H_v]
@group(0) @binding(3) var<storage, read> alpha: array<f32>;  // [T, H_v]
@group(0) @binding(4) var<storage, read> consts: array<f32>;  // [dt_bias (H_v) | a (H_v) | norm]
@group(0) @binding(5) var<storage, read> idx: array<u32>;
@group(0) @binding(6) var<storage, read_write> cs: array<f32>;

var<workgroup> ta: array<f32, C * P>;  // K tile; then A; then beta' exp(gamma) K tile
var<workgroup> tb: array<f32, C * P>;  // Q tile; then beta' V tile
var<workgroup> tx: array<f32, C * P>;  // X
var<workgroup> gam: array<f32, C>;
var<workgroup> bet: array<f32, C>;
var<workgroup> rid: array<u32, C>;

fn log1p_(y: f32) -> f32 {  // as deltanet_rule.wgsl's
    let s = 1.0 + y;
    if (s == 1.0) {
        return y;
    }
    return log(s) * (y / (s - 1.0));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let h = wid.y;
    let slot = wid.z;
    let H = params.h_v;
    let kh = h % params.h_k;
    let cnt = idx[slot];
    let first = wid.x * C;
    if (first >= cnt) {
        return;
    }
    let nr = min(C, cnt - first);
    let cap = params.cap;
    let m_off = 2u * cap * H * DK;  // M's start in cs
    let g_off = m_off + cap * H * C;  // gamma's
    if (tid < C) {
        let ok = tid < nr;
        let t = idx[params.n_slots + slot * cap + first + min(tid, nr - 1u)];
        rid[tid] = t;
        let x = alpha[t * H + h] + consts[h];
        var sp = x;  // ggml's softplus: x itself above 20
        if (x <= 20.0) {
            sp = log1p_(exp(x));
        }
        gam[tid] = select(0.0, sp * consts[H + h], ok);
        bet[tid] = select(0.0, 1.0 / (1.0 + exp(-beta[t * H + h])), ok);
    }
    workgroupBarrier();
    var gs = 0.0;  // the inclusive prefix sum, in row order
    if (tid < C) {
        for (var j = 0u; j <= tid; j++) {
            gs += gam[j];
        }
    }
    workgroupBarrier();
    if (tid < C) {
        gam[tid] = gs;
        if (tid < nr) {
            cs[g_off + rid[tid] * H + h] = gs;
        }
    }
    // K K^T and Q K^T over tiles of TK columns; invocation: column j = tid % TK, rows i0 + RG m
    let j = tid % TK;
    let i0 = tid / TK;
    let q_base = kh * DK;
    let k_base = params.h_k * DK + kh * DK;
    var kk = vec4<f32>(0.0);
    var qk = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < DK; k0 += TK) {
        for (var m = 0u; m < C * TK / WG; m++) {
            let e = tid + m * WG;
            let r = e / TK;
            let cc = e % TK;
            let ok = r < nr && k0 + cc < DK;
            let at = rid[r] * params.conv_dim + min(k0 + cc, DK - 1u);
            tb[r * P + cc] = select(0.0, u[at + q_base], ok);
            ta[r * P + cc] = select(0.0, u[at + k_base], ok);
        }
        workgroupBarrier();
        for (var c = 0u; c < TK; c++) {
            let kj = ta[j * P + c];
            let kv = vec4<f32>(ta[i0 * P + c], ta[(i0 + RG) * P + c], ta[(i0 + 2u * RG) * P + c], ta[(i0 + 3u * RG) * P + c]);
            let qv = vec4<f32>(tb[i0 * P + c], tb[(i0 + RG) * P + c], tb[(i0 + 2u * RG) * P + c], tb[(i0 + 3u * RG) * P + c]);
            kk += kv * kj;
            qk += qv * kj;
        }
        workgroupBarrier();
    }
    // A into ta; M (scaled, causal incl. the diagonal) straight to cs
    for (var m = 0u; m < 4u; m++) {
        let i = i0 + m * RG;
        let d = exp(min(gam[i] - gam[j], 0.0));
        ta[i * P + j] = select(0.0, bet[i] * d * kk[m], j < i);
        if (i < nr) {
            cs[m_off + (rid[i] * H + h) * C + j] = select(0.0, params.scale * d * qk[m], j <= i);
        }
    }
    workgroupBarrier();
    // X = (I + A)^-1, a row at a time: X_i = e_i - sum_{j<i} A_ij X_j (X lower triangular)
    for (var i = 0u; i < C; i++) {
        if (tid < C) {
            var x = select(0.0, 1.0, tid == i);
            for (var l = 0u; l < i; l++) {
                x -= ta[i * P + l] * tx[l * P + tid];
            }
            tx[i * P + tid] = x;
        }
        workgroupBarrier();
    }
    // W = X (beta' exp(gamma) K), U = X (beta' V), TK columns at a time
    let w_base = 0u;
    let v_base = 2u * params.h_k * DK + h * DK;
    for (var k0 = 0u; k0 < DK; k0 += TK) {
        for (var m = 0u; m < C * TK / WG; m++) {
            let e = tid + m * WG;
            let r = e / TK;
            let cc = e % TK;
            let ok = r < nr && k0 + cc < DK;
            let at = rid[r] * params.conv_dim + min(k0 + cc, DK - 1u);
            ta[r * P + cc] = select(0.0, u[at + k_base] * bet[r] * exp(gam[r]), ok);
            tb[r * P + cc] = select(0.0, u[at + v_base] * bet[r], ok);
        }
        workgroupBarrier();
        var w = vec4<f32>(0.0);
        var uu = vec4<f32>(0.0);
        for (var l = 0u; l < C; l++) {
            let x = vec4<f32>(tx[i0 * P + l], tx[(i0 + RG) * P + l], tx[(i0 + 2u * RG) * P + l], tx[(i0 + 3u * RG) * P + l]);
            w += x * ta[l * P + j];
            uu += x * tb[l * P + j];
        }
        for (var m = 0u; m < 4u; m++) {
            let i = i0 + m * RG;
            if (i < nr && k0 + j < DK) {
                let at = (rid[i] * H + h) * DK + k0 + j;
                cs[w_base + at] = w[m];
                cs[cap * H * DK + at] = uu[m];
            }
        }
        workgroupBarrier();
    }
}
