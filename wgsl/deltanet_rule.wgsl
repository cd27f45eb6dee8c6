// The gated delta rule and the gated RMSNorm of a DeltaNet layer (qwen35; CPU reference
// infr/cpu/deltanet.py), token-serial: one workgroup per (V-head h, sequence slot s) walks the
// live rows in batch order, taking those of slot s (in position order; the host checks). Its
// d_k x d_v state S stays in registers, invocation j holding column j; a row at position 0
// starts from zeros, else the slot's S is read from rstate once and written back at the end.
// Per row (u: the conv's silu output, [q | k | v]; V-head h reads K-head h mod H_k):
//   q, k = l2norm(u's K-head rows); S *= exp(g); delta = beta (v - S^T k); S += k delta^T;
//   o = S^T q / sqrt(d_k); dst = o / sqrt(mean(o^2) + eps) * norm * silu(z).
// DK = d_k = d_v; WG the power of two >= DK (invocations past DK add zeros to the sums).
// Dispatch (H_v, max_seqs, 1).

struct Params {
    h_k: u32,
    h_v: u32,
    conv_dim: u32,
    slot_stride: u32,
    s_base: u32,  // where a slot's matrices start in its rstate floats (after the conv state)
    eps: f32,
    scale: f32,  // 1 / sqrt(d_k)
}

const DK: u32 = {{DK}}u;
const WG: u32 = {{WG}}u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> u: array<f32>;  // [T, conv_dim]
@group(0) @binding(2) var<storage, read> gates: array<f32>;  // [T, 2 H_v]: beta', g
@group(0) @binding(3) var<storage, read> z: array<f32>;  // [T, H_v * DK]
@group(0) @binding(4) var<storage, read> consts: array<f32>;  // [dt_bias | a | norm (DK)]
@group(0) @binding(5) var<storage, read> live: array<u32>;  // [1] live rows
@group(0) @binding(6) var<storage, read> rows: array<u32>;  // [2t] position, [2t + 1] slot
@group(0) @binding(7) var<storage, read_write> rstate: array<f32>;
@group(0) @binding(8) var<storage, read_write> dst: array<f32>;  // [T, H_v * DK]

var<workgroup> qs: array<f32, WG>;
var<workgroup> ks: array<f32, WG>;
var<workgroup> red: array<f32, WG>;

// The workgroup's sum of v (every invocation calls it: uniform control flow).
fn total(v: f32, tid: u32) -> f32 {
    red[tid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (tid < s) {
            red[tid] += red[tid + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let h = wid.x;
    let slot = wid.y;
    let H = params.h_v;
    let kh = h % params.h_k;
    let on = tid < DK;
    let j = min(tid, DK - 1u);  // in range for every invocation; only `on` ones write
    let sb = slot * params.slot_stride + params.s_base + h * DK * DK;
    let k_off = params.h_k * DK;
    var S: array<f32, DK>;
    var loaded = false;
    let n = live[1];
    for (var t = 0u; t < n; t++) {
        if (rows[2u * t + 1u] != slot) {
            continue;
        }
        let p = rows[2u * t];
        if (p == 0u) {
            for (var i = 0u; i < DK; i++) {
                S[i] = 0.0;
            }
        } else if (!loaded) {
            for (var i = 0u; i < DK; i++) {
                S[i] = rstate[sb + i * DK + j];
            }
        }
        loaded = true;
        let row = t * params.conv_dim;
        var qv = 0.0;
        var kv = 0.0;
        if (on) {
            qv = u[row + kh * DK + j];
            kv = u[row + k_off + kh * DK + j];
        }
        let qss = total(qv * qv, tid);
        let kss = total(kv * kv, tid);
        qs[tid] = qv / sqrt(qss + params.eps);
        ks[tid] = kv / sqrt(kss + params.eps);
        workgroupBarrier();
        let beta = gates[t * 2u * H + h];
        let decay = exp(gates[t * 2u * H + H + h]);
        let v = u[row + 2u * k_off + h * DK + j];
        var kS = 0.0;
        for (var i = 0u; i < DK; i++) {
            S[i] *= decay;
            kS += S[i] * ks[i];
        }
        let delta = beta * (v - kS);
        var o = 0.0;
        for (var i = 0u; i < DK; i++) {
            S[i] += ks[i] * delta;
            o += S[i] * qs[i];
        }
        o *= params.scale;
        if (!on) {
            o = 0.0;
        }
        let oss = total(o * o, tid);
        if (on) {
            let y = o * (1.0 / sqrt(oss / f32(DK) + params.eps)) * consts[2u * H + j];
            let zi = t * H * DK + h * DK + j;
            let zz = z[zi];
            dst[zi] = y * (zz / (1.0 + exp(-zz)));
        }
        workgroupBarrier();  // qs and ks are rewritten by the next row
    }
    if (loaded && on) {
        for (var i = 0u; i < DK; i++) {
            rstate[sb + i * DK + j] = S[i];
        }
    }
}
