// Tiled prefill attention: one workgroup per (query head, block of BQ batch
// rows), dispatch (n_heads, ceil(T / BQ), 1). The block's q rows (f16, as the
// reference rounds them) and each tile of BK keys' K, then V, rows are staged
// in workgroup memory, so every K/V row read from the cache serves BQ queries.
// Invocation (qi, kj) scores query qi against key kj of the tile.
//
// The reference rounds the *normalised* probabilities to f16 before they
// multiply V, which needs each row's final max and sum: pass 1 walks the tiles
// keeping an online (max, sum) per invocation (merged per row at the end),
// pass 2 walks them again, p = f16(exp(s - max) / sum), and lane kj of row qi
// accumulates VD/4/BK vec4 columns of p . V. Causal, sliding-window and chunk masks
// per query; the block walks the union of its queries' key ranges.
//
// Rows carry their own position and sequence slot (attn_common). The tiles are
// one sequence's keys, so the block makes one such walk per distinct sequence
// among its rows, each row taking part only in its own: a block of one
// sequence (a prefill chunk) walks once, a block mixing k sequences k times.
// Tiles start at multiples of BK, so each lies in one cache block (BS is a
// multiple of BK) and costs one block-table read. Padding rows write zeros.
// HD % 2 == 0, VD % 4 == 0, both at most 512: BQ = 16 rows a block up to 256 (20 KiB of workgroup
// memory at 256), 8 past it (26 KiB at 512; kernels_attention.tiled_rows, tiled_bytes).

// #include attn_common

const BQ: u32 = {{BQ}}u;         // query rows a block
const BK: u32 = 16u;
const WG: u32 = BQ * BK;
const HD: u32 = {{HD}}u;
const VD: u32 = {{VD}}u;
const QS: u32 = HD / 2u + 1u;    // row strides in u32 words, padded against bank conflicts
const KVW: u32 = {{KVW}}u;       // max(HD, VD) / 2 + 1
const NV: u32 = (VD / 4u + BK - 1u) / BK;  // vec4 output columns per invocation

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> kcache: array<u32>;
@group(0) @binding(3) var<storage, read> vcache: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> state: array<u32>;
@group(0) @binding(6) var<storage, read> rows: array<u32>;
@group(0) @binding(7) var<storage, read> block_table: array<u32>;

// #include paging

var<workgroup> qs: array<u32, BQ * QS>;
var<workgroup> kv: array<u32, BK * KVW>;
var<workgroup> probs: array<f32, WG>;
var<workgroup> red: array<vec2<f32>, WG>;

// Keys kb .. kb + BK (kb % BK == 0: one cache block) of the sequence whose table starts at tb.
fn load_k(kb: u32, hi: u32, kvh: u32, tid: u32, tb: u32) {
    let base = cache_row(tb, kb);
    for (var i = tid; i < BK * (HD / 2u); i += WG) {
        let r = i / (HD / 2u);
        let w = i % (HD / 2u);
        var word = 0u;
        if (kb + r < hi) {
            word = kcache[((base + r) * params.kv_heads + kvh) * (HD / 2u) + w];
        }
        kv[r * KVW + w] = word;
    }
}

fn load_v(kb: u32, hi: u32, kvh: u32, tid: u32, tb: u32) {
    let base = cache_row(tb, kb);
    for (var i = tid; i < BK * (VD / 2u); i += WG) {
        let r = i / (VD / 2u);
        let w = i % (VD / 2u);
        var word = 0u;
        if (kb + r < hi) {
            word = vcache[((base + r) * params.kv_heads + kvh) * (VD / 2u) + w];
        }
        kv[r * KVW + w] = word;
    }
}

fn score(qi: u32, kj: u32) -> f32 {
    var s = vec2<f32>(0.0);
    for (var w = 0u; w < HD / 2u; w++) {
        s += halves(qs[qi * QS + w]) * halves(kv[kj * KVW + w]);
    }
    return finish_score(s.x + s.y, params.scale, params.softcap);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let h = wid.x;
    let t0 = wid.y * BQ;
    let kvh = h / (params.n_heads / params.kv_heads);
    var nq = 0u;  // live rows of this block
    if (t0 < state[1]) {
        nq = min(BQ, state[1] - t0);
    }
    let qi = tid / BK;
    let kj = tid % BK;
    let valid = qi < nq;
    let rk = row_keys(t0 + qi);  // no keys for a padding row
    let lo = rk.lo;
    let hi = rk.hi;

    for (var i = tid; i < BQ * (HD / 2u); i += WG) {
        let r = i / (HD / 2u);
        let w = i % (HD / 2u);
        var word = 0u;
        if (r < nq) {
            let b = ((t0 + r) * params.n_heads + h) * HD + 2u * w;
            word = pack_f16(q[b], q[b + 1u]);  // the f16 rounding of q
        }
        qs[r * QS + w] = word;
    }

    var acc: array<vec4<f32>, NV>;
    // One walk per sequence of the block, in the order of its first row.
    for (var r = 0u; r < nq; r++) {
        if (!first_of_seq(t0, r)) {
            continue;
        }
        let slot = rows[2u * (t0 + r) + 1u];
        // The union of this sequence's rows' key ranges, from a multiple of BK.
        let u = seq_key_union(t0, r, nq);
        let blk_lo = u.x / BK * BK;
        let blk_hi = u.y;
        let tb = slot * params.blocks_per_seq;
        let mine = valid && rows[2u * (t0 + qi) + 1u] == slot;

        // Pass 1: online (max, sum) of this invocation's keys kj, kj + BK, ...
        var ml = vec2<f32>(NEG_BIG, 0.0);
        for (var kb = blk_lo; kb < blk_hi; kb += BK) {
            workgroupBarrier();
            load_k(kb, blk_hi, kvh, tid, tb);
            workgroupBarrier();
            let j = kb + kj;
            if (mine && j >= lo && j < hi) {
                ml = merge_ml(ml, vec2<f32>(score(qi, kj), 1.0));
            }
        }
        workgroupBarrier();  // red free (the previous walk read it)
        red[tid] = ml;
        workgroupBarrier();
        var row = red[qi * BK];
        for (var k = 1u; k < BK; k++) {
            row = merge_ml(row, red[qi * BK + k]);
        }

        // Pass 2: p = f16(exp(s - max) / sum); lane kj sums columns kj, kj + BK, ... of p . V.
        for (var kb = blk_lo; kb < blk_hi; kb += BK) {
            workgroupBarrier();
            load_k(kb, blk_hi, kvh, tid, tb);
            workgroupBarrier();
            let j = kb + kj;
            var p = 0.0;
            if (mine && j >= lo && j < hi) {
                p = f16_round(exp(score(qi, kj) - row.x) / row.y);
            }
            probs[tid] = p;
            workgroupBarrier();
            load_v(kb, blk_hi, kvh, tid, tb);
            workgroupBarrier();
            for (var jj = 0u; jj < BK; jj++) {
                let pj = probs[qi * BK + jj];
                for (var n = 0u; n < NV; n++) {
                    let col = kj + n * BK;
                    if (col < VD / 4u) {
                        let v = vec4<f32>(halves(kv[jj * KVW + 2u * col]), halves(kv[jj * KVW + 2u * col + 1u]));
                        acc[n] += pj * v;
                    }
                }
            }
        }
    }
    // Live rows their output; padding rows of the block zeros (acc untouched), where the buffer has them.
    let t = t0 + qi;
    if (t < arrayLength(&out) / (params.n_heads * (VD / 4u))) {
        for (var n = 0u; n < NV; n++) {
            let col = kj + n * BK;
            if (col < VD / 4u) {
                out[(t * params.n_heads + h) * (VD / 4u) + col] = acc[n];
            }
        }
    }
}
