// Causal attention of this batch's queries over the f16 KV cache.
// One workgroup per (query head, batch row): dispatch (n_heads, T, 1). Row t
// sits at position rows[2t] of its sequence (slot rows[2t + 1]) and sees that
// sequence's keys [key_lo(pos), pos] (attn_common: sliding window and chunk).
// Keys are read at their cache rows through the block table (paging.wgsl); a padding row (t >= state[1]) writes zeros.
// GQA: query head h reads kv head h / (n_heads / kv_heads).
//
// Like the reference (and llama.cpp's non-flash path) q is rounded to f16, and
// so are the *normalised* probabilities before they multiply V. Normalised
// rounding needs the final max and sum first, so the kernel makes two passes
// over the keys: pass 1 keeps a running (max, sum) per invocation (online
// softmax, merged through shared memory), pass 2 takes each score again and
// accumulates f16(p) * v a tile of WG keys at a time. Only the first tile's
// scores are kept (one a invocation), the others' computed again, so any
// context length works; the price is reading K twice past WG keys (from L2).
//
// Decode has one query per head, so the keys are spread over the whole
// workgroup in both passes: in pass 1 each invocation scores its own keys with
// 16-byte loads; in pass 2 the workgroup splits into G = WG / (v_head_dim / 4)
// groups, each summing every G-th key of the tile for 4 dims per invocation,
// and the groups' sums are added at the end. head_dim % 8 == 0 and
// v_head_dim % 4 == 0 (the host checks).

// #include attn_common
// #include attn_q8_{{Q8}}

const WG: u32 = 256u;
const MAX_D: u32 = 512u;            // head_dim and v_head_dim bound (the host checks)

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> kcache: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> vcache: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read> state: array<u32>;
@group(0) @binding(6) var<storage, read> rows: array<u32>;
@group(0) @binding(7) var<storage, read> block_table: array<u32>;

// #include paging

var<workgroup> qs: array<vec4<f32>, MAX_D / 4u>;
var<workgroup> red_m: array<f32, WG>;
var<workgroup> red_l: array<f32, WG>;
var<workgroup> probs: array<f32, WG>;
var<workgroup> red_v: array<vec4<f32>, WG>;

// Scaled (and soft-capped) q . k for the key at cache row crow of kv head kvh.
fn score(crow: u32, kvh: u32) -> f32 {
    let n8 = params.head_dim / 8u;
    let base = (crow * params.kv_heads + kvh) * n8;
    var s = vec4<f32>(0.0);
    for (var i = 0u; i < n8; i++) {
        let k = kcache[base + i];
        let lo = vec4<f32>(halves(k.x), halves(k.y));
        let hi = vec4<f32>(halves(k.z), halves(k.w));
        s += qs[2u * i] * lo + qs[2u * i + 1u] * hi;
    }
    var r = (s.x + s.y + s.z + s.w) * params.scale;
    if (params.softcap > 0.0) {
        r = tanh_safe(r / params.softcap) * params.softcap;
    }
    return r;
}

// KV_MAX > 0: the graph also holds split-K attention, which takes the rows that
// see more than KV_MAX keys; this kernel does nothing for them (the choice is
// made per row from `rows`, as the length is only known there).
const KV_MAX: u32 = {{KV_MAX}}u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let h = wid.x;
    let t = wid.y;
    let rk = row_keys(t);
    if (KV_MAX > 0u && rk.hi > KV_MAX) {
        return;
    }
    let kvh = h / (params.n_heads / params.kv_heads);
    let lo = rk.lo;
    let hi = rk.hi;
    let tb = rk.tb;

    let qbase = (t * params.n_heads + h) * params.head_dim;
    for (var d = tid; d < params.head_dim / 4u; d += WG) {
        let b = qbase + 4u * d;
        qs[d] = vec4<f32>(f16_round(q[b]), f16_round(q[b + 1u]), f16_round(q[b + 2u]), f16_round(q[b + 3u]));
    }
    workgroupBarrier();

    // Pass 1: running max and sum of exp over this invocation's keys. The score of its key in the
    // first tile is kept for pass 2: up to WG keys (a decode's near span) K is read once, not twice.
    var m = NEG_BIG;
    var l = 0.0;
    var s0 = 0.0;
    for (var j = lo + tid; j < hi; j += WG) {
        let s = score(cache_row(tb, j), kvh);
        if (j < lo + WG) {
            s0 = s;
        }
        let m_new = max(m, s);
        l = l * exp(m - m_new) + exp(s - m_new);
        m = m_new;
    }
    red_m[tid] = m;
    red_l[tid] = l;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (tid < stride) {
            let m1 = red_m[tid];
            let m2 = red_m[tid + stride];
            let mm = max(m1, m2);
            red_l[tid] = red_l[tid] * exp(m1 - mm) + red_l[tid + stride] * exp(m2 - mm);
            red_m[tid] = mm;
        }
        workgroupBarrier();
    }
    let m_all = red_m[0];
    let l_all = red_l[0];

    // Pass 2: p = f16(exp(s - max) / sum), out = sum_j p_j * v_j.
    let lanes = params.v_head_dim / 4u;  // invocations per key: 4 dims (one vec2<u32>) each
    let groups = WG / lanes;
    let lane = tid % lanes;
    let grp = tid / lanes;
    var acc = vec4<f32>(0.0);
    for (var b = lo; b < hi; b += WG) {
        let j = b + tid;
        var p = 0.0;
        if (j < hi) {
            var s = s0;
            if (b != lo) {
                s = score(cache_row(tb, j), kvh);
            }
            p = f16_round(exp(s - m_all) / l_all);
        }
        probs[tid] = p;
        workgroupBarrier();
        if (grp < groups) {
            let n = min(WG, hi - b);
            // Runs of the tile's keys within one block: consecutive cache rows from `off`.
            for (var r = 0u; r < n;) {
                let r_end = block_end(b + r, b + n) - b;
                let off = cache_row(tb, b + r) - r;  // key jj's row is off + jj (u32 wraps back)
                var jj = r + grp;
                // Four keys per step: the loads issue before any is used, so a group's chain of
                // dependent loads is a quarter of its keys (it set the decode's cost per key at
                // a few hundred keys, where each group walks tens of them).
                for (; jj + 3u * groups < r_end; jj += 4u * groups) {
                    let v0 = vcache[((off + jj) * params.kv_heads + kvh) * lanes + lane];
                    let v1 = vcache[((off + jj + groups) * params.kv_heads + kvh) * lanes + lane];
                    let v2 = vcache[((off + jj + 2u * groups) * params.kv_heads + kvh) * lanes + lane];
                    let v3 = vcache[((off + jj + 3u * groups) * params.kv_heads + kvh) * lanes + lane];
                    acc += probs[jj] * vec4<f32>(halves(v0.x), halves(v0.y));
                    acc += probs[jj + groups] * vec4<f32>(halves(v1.x), halves(v1.y));
                    acc += probs[jj + 2u * groups] * vec4<f32>(halves(v2.x), halves(v2.y));
                    acc += probs[jj + 3u * groups] * vec4<f32>(halves(v3.x), halves(v3.y));
                }
                if (jj + groups < r_end) {
                    let v0 = vcache[((off + jj) * params.kv_heads + kvh) * lanes + lane];
                    let v1 = vcache[((off + jj + groups) * params.kv_heads + kvh) * lanes + lane];
                    acc += probs[jj] * vec4<f32>(halves(v0.x), halves(v0.y));
                    acc += probs[jj + groups] * vec4<f32>(halves(v1.x), halves(v1.y));
                    jj += 2u * groups;
                }
                if (jj < r_end) {
                    let v0 = vcache[((off + jj) * params.kv_heads + kvh) * lanes + lane];
                    acc += probs[jj] * vec4<f32>(halves(v0.x), halves(v0.y));
                }
                r = r_end;
            }
        }
        workgroupBarrier();
    }
    red_v[tid] = acc;
    workgroupBarrier();
    var sum = vec4<f32>(0.0);
    if (tid < lanes) {
        sum = red_v[tid];
        for (var g = 1u; g < groups; g++) {
            sum += red_v[g * lanes + tid];
        }
        let o = (t * params.n_heads + h) * params.v_head_dim + 4u * tid;
        out[o] = sum.x;
        out[o + 1u] = sum.y;
        out[o + 2u] = sum.z;
        out[o + 3u] = sum.w;
    }
    q8_out(sum, h * params.v_head_dim + 4u * tid, tid, tid < lanes, t);
}
