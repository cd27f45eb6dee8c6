// The chunked gated delta rule, pass 2 of 2 (pass 1: deltanet_chunk_intra.wgsl, whose header has
// the notation): each slot's chunks in order through the state, C rows a step instead of one.
// Per chunk of n rows (gamma_l = gamma_{n-1}), with S the state entering it:
//   D = U - W S;  o = (exp(gamma) * q) S scale + M D;  S <- exp(gamma_l) S + (exp(gamma_l - gamma) * K)^T D.
// A V-head's d_k x d_v state is split over NB workgroups by columns (WC each). The block lives in
// workgroup memory (read by every D row) and in registers (invocation tid updates column
// tid % WC, NR rows from (tid / WC) NR). Three barriers a chunk. The state starts from zeros
// where the slot's first row is at position 0, else from rstate, and goes back there at the end,
// where deltanet_rule.wgsl keeps it. o [T, H_v * DK] as the rule writes it (deltanet_norm.wgsl
// follows). Dispatch (NB * H_v, n_slots, 1).

struct Params {
    h_k: u32,
    h_v: u32,
    conv_dim: u32,
    cap: u32,
    n_slots: u32,
    slot_stride: u32,
    s_base: u32,  // where a slot's matrices start in its rstate floats (after the conv state)
    scale: f32,
}

const DK: u32 = {{DK}}u;  // d_k = d_v <= 128 (the block: DK * WC floats), a multiple of 4: u and cs
// are read as vec4s (every row and block offset a multiple of 4)
const C: u32 = 32u;  // deltanet_chunk_intra.wgsl's
const WC: u32 = 16u;  // columns a workgroup
const WG: u32 = 256u;
const RG: u32 = WG / WC;  // invocations a column
const NR4: u32 = (DK + 4u * RG - 1u) / (4u * RG);
const NR: u32 = 4u * NR4;  // rows of S an invocation: k0 = (tid / WC) NR .. + NR, those below DK
const NB: u32 = (DK + WC - 1u) / WC;
const CI: u32 = WG / WC;  // chunk rows an invocation's D / o rows are apart (2 rows each: C = 2 CI)

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> u: array<vec4<f32>>;  // [T, conv_dim]: q | k | v, q and k normalised
@group(0) @binding(2) var<storage, read> idx: array<u32>;
@group(0) @binding(3) var<storage, read> rows: array<u32>;  // [2t] position, [2t + 1] slot
@group(0) @binding(4) var<storage, read> cs: array<vec4<f32>>;  // W | U | M | gamma (deltanet_chunk_intra)
@group(0) @binding(5) var<storage, read_write> rstate: array<f32>;
@group(0) @binding(6) var<storage, read_write> o: array<f32>;  // [T, H_v * DK]

var<workgroup> ss: array<f32, DK * WC>;  // the state's block, [DK][WC]
var<workgroup> dd: array<f32, C * WC>;  // D, [C][WC]
var<workgroup> gm: array<f32, C>;
var<workgroup> ed: array<f32, C>;  // exp(gamma_l - gamma_i)
var<workgroup> rid: array<u32, C>;

fn cs1(i: u32) -> f32 {
    return cs[i / 4u][i % 4u];
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let h = wid.x / NB;
    let slot = wid.y;
    let H = params.h_v;
    let kh = h % params.h_k;
    let cnt = idx[slot];
    if (cnt == 0u) {
        return;
    }
    let cap = params.cap;
    let c = tid % WC;
    let col = (wid.x % NB) * WC + c;
    let on = col < DK;
    let jc = min(col, DK - 1u);
    let kr = tid / WC;
    let sb = slot * params.slot_stride + params.s_base + h * DK * DK;
    let fresh = rows[2u * idx[params.n_slots + slot * cap]] == 0u;
    let k0 = kr * NR;
    var S: array<f32, NR>;
    for (var m = 0u; m < NR; m++) {
        let k = k0 + m;
        var s = 0.0;
        if (!fresh && on && k < DK) {
            s = rstate[sb + k * DK + jc];
        }
        S[m] = s;
        if (k < DK) {
            ss[k * WC + c] = s;
        }
    }
    let m_off = 2u * cap * H * DK;
    let g_off = m_off + cap * H * C;
    let q_base = kh * DK;
    let k_base = params.h_k * DK + kh * DK;
    let ids = params.n_slots + slot * cap;
    // a chunk's row ids and gammas are loaded during the chunk before (two dependent loads off the
    // serial path); invocation tid < C holds row tid's (rows past the slot's count: its last row)
    var t_nx = idx[ids + min(tid % C, cnt - 1u)];
    var g_nx = cs1(g_off + t_nx * H + h);
    for (var first = 0u; first < cnt; first += C) {
        let nr = min(C, cnt - first);
        if (tid < C) {
            rid[tid] = t_nx;
            gm[tid] = g_nx;
        }
        workgroupBarrier();  // also: the state's block written
        let gl = gm[nr - 1u];
        // D and q S for chunk rows i and i + CI
        var d = vec2<f32>(0.0);
        var qs = vec2<f32>(0.0);
        let ia = kr;
        let ib = kr + CI;
        let ra = rid[ia];
        let rb = rid[ib];
        let wa = (ra * H + h) * DK;
        let wb = (rb * H + h) * DK;
        let qa = ra * params.conv_dim + q_base;
        let qb = rb * params.conv_dim + q_base;
        for (var k = 0u; k < DK; k += 4u) {
            let s = vec4<f32>(ss[k * WC + c], ss[(k + 1u) * WC + c], ss[(k + 2u) * WC + c], ss[(k + 3u) * WC + c]);
            d += vec2<f32>(dot(cs[(wa + k) / 4u], s), dot(cs[(wb + k) / 4u], s));
            qs += vec2<f32>(dot(u[(qa + k) / 4u], s), dot(u[(qb + k) / 4u], s));
        }
        d = vec2<f32>(cs1(cap * H * DK + wa + jc), cs1(cap * H * DK + wb + jc)) - d;
        dd[ia * WC + c] = select(0.0, d.x, ia < nr);
        dd[ib * WC + c] = select(0.0, d.y, ib < nr);
        if (tid < C) {
            ed[tid] = exp(min(gl - gm[tid], 0.0));
        }
        workgroupBarrier();  // D and ed written; every read of ss done
        // o = exp(gamma) q S scale + M D (M holds the scale and the causal mask)
        var ov = vec2<f32>(exp(gm[ia]), exp(gm[ib])) * qs * params.scale;
        let ma = m_off + (ra * H + h) * C;
        let mb = m_off + (rb * H + h) * C;
        for (var j = 0u; j < C; j += 4u) {  // M is 0 past row i: rows past nr add nothing
            let dj = vec4<f32>(dd[j * WC + c], dd[(j + 1u) * WC + c], dd[(j + 2u) * WC + c], dd[(j + 3u) * WC + c]);
            ov += vec2<f32>(dot(cs[(ma + j) / 4u], dj), dot(cs[(mb + j) / 4u], dj));
        }
        if (on) {
            if (ia < nr) {
                o[ra * H * DK + h * DK + col] = ov.x;
            }
            if (ib < nr) {
                o[rb * H * DK + h * DK + col] = ov.y;
            }
        }
        if (tid < C && first + C < cnt) {
            t_nx = idx[ids + min(first + C + tid, cnt - 1u)];
            g_nx = cs1(g_off + t_nx * H + h);
        }
        // S <- exp(gamma_l) S + (exp(gamma_l - gamma) K)^T D; this invocation's rows k0 .. k0 + NR - 1
        let el = exp(gl);
        var acc: array<vec4<f32>, NR4>;
        for (var m = 0u; m < NR4; m++) {  // explicitly: naga zeroes a loop's var once, not each pass
            acc[m] = vec4<f32>(0.0);
        }
        for (var i = 0u; i < C; i++) {  // a fixed count (unrolled); rows past nr have D = 0
            let e = ed[i] * dd[i * WC + c];
            let kb = rid[i] * params.conv_dim + k_base;
            for (var m = 0u; m < NR4; m++) {
                acc[m] += u[(kb + min(k0 + 4u * m, DK - 4u)) / 4u] * e;  // rows past DK: kept, never stored
            }
        }
        for (var m = 0u; m < NR; m++) {
            S[m] = el * S[m] + acc[m / 4u][m % 4u];
            if (k0 + m < DK) {
                ss[(k0 + m) * WC + c] = S[m];
            }
        }
        workgroupBarrier();  // the new block written; D, ed, gm and rid read
    }
    if (on) {
        for (var m = 0u; m < NR; m++) {
            if (k0 + m < DK) {
                rstate[sb + (k0 + m) * DK + col] = S[m];
            }
        }
    }
}
