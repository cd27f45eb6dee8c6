// Split-K decode attention, pass 2 of 3: probabilities times V per chunk.
// Same dispatch, heads and chunks per workgroup as attn_scores. Each workgroup first merges the
// stats of every chunk the query sees into the global (max, sum), so that,
// like the reference, the *normalised* probability is rounded to f16 before it
// multiplies V: p = f16(exp(s - max) / sum). The scores come from the scratch
// (attn_scores), not from K again. The chunk's partial output sum_j p_j * v_j
// (already normalised) goes to part[((t * n_heads + h) * max_chunks + c) *
// VD/4 + i] (vec4); attn_combine adds the chunks. VD % 4 == 0, VD <= 4 * WG.
// V rows are read through the block table a block's run of keys at a time
// (one table read per run, paging.wgsl).

// #include attn_common

const WG: u32 = {{WG}}u;
const C: u32 = {{C}}u;
const HG: u32 = {{HG}}u;
const VD: u32 = {{VD}}u;
const LANES: u32 = VD / 4u;     // invocations per key: 4 dims (one vec2<u32>) each
const GROUPS: u32 = WG / LANES; // keys summed side by side

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> scores: array<f32>;
@group(0) @binding(2) var<storage, read> stats: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read> vcache: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> part: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> state: array<u32>;
@group(0) @binding(6) var<storage, read> rows: array<u32>;
@group(0) @binding(7) var<storage, read> block_table: array<u32>;

// #include paging

var<workgroup> red: array<array<vec2<f32>, HG>, WG>;
var<workgroup> probs: array<array<f32, C>, HG>;
var<workgroup> red_v: array<vec4<f32>, WG>;

// KV_MIN > 0: the one-pass kernel takes the rows that see at most KV_MIN keys
// (short contexts); split-K does nothing for them. Padding rows: nothing either.
const KV_MIN: u32 = {{KV_MIN}}u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let t = wid.z;
    let rk = row_keys(t);
    if (rk.hi <= KV_MIN || rk.hi == 0u) {
        return;
    }
    let work = split_work(wid, rk, HG, C);
    if (work.c_start > work.c_last) {
        return;
    }
    let h0 = work.h0;
    let kvh = work.kvh;
    let lo = rk.lo;
    let hi = rk.hi;
    // Global (max, sum) over the chunks [lo / C, (hi - 1) / C].
    var ml: array<vec2<f32>, HG>;
    for (var g = 0u; g < HG; g++) {
        ml[g] = vec2<f32>(NEG_BIG, 0.0);
    }
    for (var cc = lo / C + tid; cc <= work.c_last; cc += WG) {
        for (var g = 0u; g < HG; g++) {
            ml[g] = merge_ml(ml[g], stats[(t * params.n_heads + h0 + g) * params.max_chunks + cc]);
        }
    }
    red[tid] = ml;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (tid < stride) {
            for (var g = 0u; g < HG; g++) {
                red[tid][g] = merge_ml(red[tid][g], red[tid + stride][g]);
            }
        }
        workgroupBarrier();
    }
    let gml = red[0];

    for (var c = work.c_start; c <= work.c_last; c += nwg.x) {
        let k0 = c * C;
        workgroupBarrier();  // probs and red_v free again
        for (var kk = 0u; kk < C; kk += WG) {
            let j = k0 + kk + tid;
            for (var g = 0u; g < HG; g++) {
                var p = 0.0;
                if (j >= lo && j < hi) {
                    let s = scores[(t * params.n_heads + h0 + g) * params.n_ctx + j];
                    p = f16_round(exp(s - gml[g].x) / gml[g].y);
                }
                probs[g][kk + tid] = p;
            }
        }
        workgroupBarrier();

        // Keys of this chunk the query sees, relative to k0.
        let j_lo = max(lo, k0) - k0;
        let j_hi = min(hi, k0 + C) - k0;
        let lane = tid % LANES;
        let grp = tid / LANES;
        var acc: array<vec4<f32>, HG>;  // zeroed explicitly: naga zero-initialises a loop-local var once
        for (var g = 0u; g < HG; g++) {
            acc[g] = vec4<f32>(0.0);
        }
        if (grp < GROUPS) {
            // Runs of keys within one block: consecutive cache rows from `off`.
            for (var r = j_lo; r < j_hi;) {
                let r_end = block_end(k0 + r, k0 + j_hi) - k0;
                let off = cache_row(rk.tb, k0 + r) - r;  // key jj's row is off + jj (u32 wraps back)
                for (var jj = r + grp; jj < r_end; jj += GROUPS) {
                    let w = vcache[((off + jj) * params.kv_heads + kvh) * LANES + lane];
                    let v = vec4<f32>(halves(w.x), halves(w.y));
                    for (var g = 0u; g < HG; g++) {
                        acc[g] += probs[g][jj] * v;
                    }
                }
                r = r_end;
            }
        }
        for (var g = 0u; g < HG; g++) {
            red_v[tid] = acc[g];
            workgroupBarrier();
            if (tid < LANES) {
                var sum = red_v[tid];
                for (var k = 1u; k < GROUPS; k++) {
                    sum += red_v[k * LANES + tid];
                }
                part[((t * params.n_heads + h0 + g) * params.max_chunks + c) * LANES + tid] = sum;
            }
            workgroupBarrier();
        }
    }
}
