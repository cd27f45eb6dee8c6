// Split-K decode attention, pass 1 of 3: scores and per-chunk softmax stats.
// Dispatch (P, n_heads / HG, T): workgroup x takes the chunks of C key
// positions the query (batch row z, attn_common: its own sequence and length) sees, c = c_first + x, c_first + x + P, ... (P <=
// max_chunks, so a short context launches few busy workgroups and a long one
// gives each several chunks; the graph is built for n_ctx and reused at every
// position), for HG query heads sharing one kv head (each K row is read once
// for all of them). Writes every score of a chunk to the scratch
// scores[(t * n_heads + h) * n_ctx + j] and the chunk's (max, sum exp) to
// stats[(t * n_heads + h) * max_chunks + c]. head_dim == HD, HD % 8 == 0.
// Key j is read at its cache row through the block table (paging.wgsl); the
// scratch is indexed by the position j, so n_ctx bounds a sequence's length.

// #include attn_common

const WG: u32 = {{WG}}u;
const C: u32 = {{C}}u;    // keys per chunk, a multiple of WG
const HG: u32 = {{HG}}u;  // query heads per workgroup (divides the GQA group)
const HD: u32 = {{HD}}u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> kcache: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> scores: array<f32>;
@group(0) @binding(4) var<storage, read_write> stats: array<vec2<f32>>;
@group(0) @binding(5) var<storage, read> state: array<u32>;
@group(0) @binding(6) var<storage, read> rows: array<u32>;
@group(0) @binding(7) var<storage, read> block_table: array<u32>;

// #include paging

var<workgroup> qs: array<vec4<f32>, HG * HD / 4u>;
var<workgroup> red: array<array<vec2<f32>, HG>, WG>;

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
    // q rounded to f16, as the reference does.
    for (var i = tid; i < HG * HD / 4u; i += WG) {
        let b = (t * params.n_heads + h0) * HD + 4u * i;
        qs[i] = vec4<f32>(f16_round(q[b]), f16_round(q[b + 1u]), f16_round(q[b + 2u]), f16_round(q[b + 3u]));
    }
    for (var c = work.c_start; c <= work.c_last; c += nwg.x) {
        workgroupBarrier();  // qs written; red free again
        let k0 = c * C;
        var ml: array<vec2<f32>, HG>;
        for (var g = 0u; g < HG; g++) {
            ml[g] = vec2<f32>(NEG_BIG, 0.0);
        }
        for (var kk = 0u; kk < C; kk += WG) {
            let j = k0 + kk + tid;
            if (j >= lo && j < hi) {
                // Zeroed explicitly: naga hoists a loop-local var and zero-initialises it only once.
                var acc: array<vec4<f32>, HG>;
                for (var g = 0u; g < HG; g++) {
                    acc[g] = vec4<f32>(0.0);
                }
                let base = (cache_row(rk.tb, j) * params.kv_heads + kvh) * (HD / 8u);
                for (var i = 0u; i < HD / 8u; i++) {
                    let k = kcache[base + i];
                    let klo = vec4<f32>(halves(k.x), halves(k.y));
                    let khi = vec4<f32>(halves(k.z), halves(k.w));
                    for (var g = 0u; g < HG; g++) {
                        acc[g] += qs[g * (HD / 4u) + 2u * i] * klo + qs[g * (HD / 4u) + 2u * i + 1u] * khi;
                    }
                }
                for (var g = 0u; g < HG; g++) {
                    let a = acc[g];
                    let s = finish_score(a.x + a.y + a.z + a.w, params.scale, params.softcap);
                    scores[(t * params.n_heads + h0 + g) * params.n_ctx + j] = s;
                    ml[g] = merge_ml(ml[g], vec2<f32>(s, 1.0));
                }
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
        if (tid < HG) {
            stats[(t * params.n_heads + h0 + tid) * params.max_chunks + c] = red[0][tid];
        }
    }
}
