// gemv.wgsl's NORM_IN (kernels_norm_in.NormIn): the GEMV's input is a plain RMSNorm of binding 2's row,
// normed and rounded in the prologue into workgroup memory (xq, quantize_q8's layout of one token), so
// the rmsnorm_q8 dispatch before the GEMV goes: decode is bound by its dispatches. The prologue is
// rmsnorm_q8.wgsl's arithmetic in its order (its 256 invocations, here the workgroup's first 256,
// each owning the words tid + 256 j; the same tree of sums; each 32-value block rounded by its 8
// invocations), so xq holds the bits rmsnorm_q8 writes and the GEMV's output is the unfused one's.
// It is a latency on every workgroup's way to its first weight load, so each invocation loads its
// words and their weights at once (one trip to the cache, not one per word: that prologue made the
// 8B's decode 20 % slower), and a block's max and sum go through subgroup shuffles, not barriers.
// One token a workgroup (NT 1); K % 256 == 0; subgroups of 8 or more invocations in order.
// #include q8_layout
// #include q8_block

@group(0) @binding(2) var<storage, read> xin: array<vec4<f32>>;
@group(0) @binding(15) var<storage, read> norm_w: array<vec4<f32>>;

const KN: u32 = {{NORM_K}}u;  // the row's width, params.K
const NW: u32 = (KN + 1023u) / 1024u;  // words an invocation owns
const_assert NT == 1u && KN % 256u == 0u;
var<workgroup> xq: array<vec4<u32>, KN * 5u / 64u>;  // kernels_q8.words(KN) / 4
var<workgroup> xsc: array<u32, KN / 16u>;  // the scale words, staged: two blocks' invocations share a vec4
var<workgroup> norm_sum: array<f32, 256>;

// q8_block.wgsl's rounding of one 32-value block over its 8 invocations (lanes 8k .. 8k + 7 of a
// subgroup), through shuffles: the same max, q, d and sum. Call in uniform control flow.
fn q8_block_lanes(vals: vec4<f32>) -> Q8Block {
    let a = abs(vals);
    var m = max(max(a.x, a.y), max(a.z, a.w));
    m = max(m, subgroupShuffleXor(m, 1u));
    m = max(m, subgroupShuffleXor(m, 2u));
    m = max(m, subgroupShuffleXor(m, 4u));
    let r = q8_round(vals, max(m, 0.0));
    var s = r.q.x + r.q.y + r.q.z + r.q.w;
    s += subgroupShuffleXor(s, 1u);
    s += subgroupShuffleXor(s, 2u);
    s += subgroupShuffleXor(s, 4u);
    return Q8Block(r.q, r.d, s);
}

fn norm_in(tid: u32, t0: u32) {
    let base = x_token(t0) * (KN / 4u);
    let mine = tid < 256u;
    var xs: array<vec4<f32>, NW>;
    var gs: array<vec4<f32>, NW>;
    for (var j = 0u; j < NW; j++) {
        let w = tid + 256u * j;
        if (mine && w < KN / 4u) {
            xs[j] = xin[base + w];
            gs[j] = norm_w[w];
        }
    }
    var s4 = vec4<f32>(0.0);
    for (var j = 0u; j < NW; j++) {
        if (tid + 256u * j < KN / 4u) {
            s4 += xs[j] * xs[j];
        }
    }
    if (mine) {
        norm_sum[tid] = (s4.x + s4.y) + (s4.z + s4.w);
    }
    workgroupBarrier();
    for (var stride = 128u; stride > 0u; stride /= 2u) {
        if (tid < stride) {
            norm_sum[tid] += norm_sum[tid + stride];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(norm_sum[0] / f32(params.K) + params.eps);  // rmsnorm_q8's division, by a uniform
    for (var j = 0u; j < NW; j++) {
        let i = 4u * (tid + 256u * j);  // this invocation's 4 values
        let live = mine && i < KN;
        var o = vec4<f32>(0.0);
        if (live) {
            o = xs[j] * inv * gs[j];
        }
        let b = q8_block_lanes(o);
        // Invocations 4k .. 4k + 3 hold the four words of one vec4 of xq (q8_word_at): the first stores
        // them whole (a write to one lane of a vector may rewrite the whole vector).
        let word = q8_word(b.q);
        let w1 = subgroupShuffleDown(word, 1u);
        let w2 = subgroupShuffleDown(word, 2u);
        let w3 = subgroupShuffleDown(word, 3u);
        if (live && tid % 4u == 0u) {
            xq[q8_word_at(0u, i) / 4u] = vec4<u32>(word, w1, w2, w3);
        }
        if (live && tid % 8u == 0u) {
            let so = q8_scale_at(0u, KN, i) - KN / 4u;
            xsc[so] = bitcast<u32>(b.d);
            xsc[so + 1u] = bitcast<u32>(b.d * f32(b.s));
        }
    }
    workgroupBarrier();
    for (var v = tid; v < KN / 64u; v += WG) {
        xq[KN / 16u + v] = vec4<u32>(xsc[4u * v], xsc[4u * v + 1u], xsc[4u * v + 2u], xsc[4u * v + 3u]);
    }
    workgroupBarrier();  // xq complete
}

// The workgroup's one token's row starts at 0.
fn x_row(t: u32) -> u32 {
    return 0u;
}
