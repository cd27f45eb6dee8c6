// Shared by the split-K decode kernels (attn_scores, attn_values, attn_combine)
// and the tiled prefill kernels (attn_tiled, attn_tiled2, attn_mma). One Params struct for all of them
// (infr/gpu/kernels_misc.py pack_attention). Row t of the batch is live when
// t < state[1]; it sits at position rows[2t] of sequence slot rows[2t + 1] and
// sees that sequence's keys [key_lo(pos), pos] (the reference masks
// q_pos - k_pos >= window, window 0 = none, and, in chunked attention (llama4),
// keys before floor(pos / chunk) * chunk, chunk 0 = none). A padding row sees no keys and its
// output is written as zeros. Every including kernel declares `state` and `rows`.

struct Params {
    n_heads: u32,
    kv_heads: u32,
    head_dim: u32,
    v_head_dim: u32,
    scale: f32,
    window: u32,     // 0 = no sliding window
    softcap: f32,    // 0 = none
    n_ctx: u32,      // row stride of the split-K scores scratch
    max_chunks: u32, // row stride of the split-K stats / partial outputs
    blocks_per_seq: u32,  // block table entries per sequence slot (paging.wgsl)
    chunk: u32,      // 0 = no chunked attention
}

const NEG_BIG: f32 = -3.0e38;  // finite "minus infinity": no inf - inf anywhere

// #include f16_bits

fn f16_round(v: f32) -> f32 {
    return unpack2x16float(f16_bits(v)).x;
}

fn tanh_safe(v: f32) -> f32 {
    return tanh(clamp(v, -9.0, 9.0));
}

fn halves(w: u32) -> vec2<f32> {
    return unpack2x16float(w);
}

fn key_lo(pos: u32, window: u32, chunk: u32) -> u32 {
    var lo = 0u;
    if (window > 0u && pos + 1u > window) {
        lo = pos + 1u - window;
    }
    if (chunk > 0u) {
        lo = max(lo, pos / chunk * chunk);
    }
    return lo;
}

// Scale and soft-cap a raw q . k.
fn finish_score(raw: f32, scale: f32, softcap: f32) -> f32 {
    var r = raw * scale;
    if (softcap > 0.0) {
        r = tanh_safe(r / softcap) * softcap;
    }
    return r;
}

// Online-softmax merge of two (max, sum of exp) pairs.
fn merge_ml(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    let m = max(a.x, b.x);
    return vec2<f32>(m, a.y * exp(a.x - m) + b.y * exp(b.x - m));
}

// The keys batch row t sees, [lo, hi) of its sequence (none for a padding row),
// and where that sequence's block table starts (tb = slot * blocks_per_seq).
struct RowKeys {
    lo: u32,
    hi: u32,
    tb: u32,
}

fn row_keys(t: u32) -> RowKeys {
    if (t >= state[1]) {
        return RowKeys(0u, 0u, 0u);
    }
    let pos = rows[2u * t];
    return RowKeys(key_lo(pos, params.window, params.chunk), pos + 1u, rows[2u * t + 1u] * params.blocks_per_seq);
}

// What split-K workgroup `wid` of attn_scores / attn_values works on (the
// including kernel declares `params`): query heads h0 .. h0 + hg of kv head
// kvh for batch row wid.z, whose keys are rk, and chunks of c keys this
// workgroup takes from c_start (the first the query sees + wid.x) to c_last;
// nothing to do when c_start > c_last. Call with a live row (rk.hi > 0).
struct SplitWork {
    h0: u32,
    kvh: u32,
    c_start: u32,
    c_last: u32,
}

fn split_work(wid: vec3<u32>, rk: RowKeys, hg: u32, c: u32) -> SplitWork {
    let h0 = wid.y * hg;
    return SplitWork(h0, h0 / (params.n_heads / params.kv_heads), rk.lo / c + wid.x, (rk.hi - 1u) / c);
}

// A tiled prefill workgroup's query block: heads h0 .. h0 + hg of kv head kvh, batch rows t0 .. t0 + nq
// (the live ones of its r rows; blocks run from the last, the longest walks first).
struct QueryBlock {
    h0: u32,
    kvh: u32,
    t0: u32,
    nq: u32,
}

fn query_block(wid: vec3<u32>, nwg: vec3<u32>, hg: u32, r: u32) -> QueryBlock {
    let h0 = wid.x * hg;
    let t0 = (nwg.y - 1u - wid.y) * r;
    var nq = 0u;
    if (t0 < state[1]) {
        nq = min(r, state[1] - t0);
    }
    return QueryBlock(h0, h0 / (params.n_heads / params.kv_heads), t0, nq);
}

// A query slot's keys: [lo, hi) of the block's row r and its sequence slot; none (hi 0, no slot) for a
// padding row (r >= nq).
struct SlotKeys {
    lo: u32,
    hi: u32,
    slot: u32,
}

fn slot_keys(t0: u32, r: u32, nq: u32) -> SlotKeys {
    let rk = row_keys(t0 + r);
    if (r < nq) {
        return SlotKeys(rk.lo, rk.hi, rows[2u * (t0 + r) + 1u]);
    }
    return SlotKeys(rk.lo, 0u, 0xffffffffu);
}

// The tiled prefill kernels walk each sequence of a row block once, in the order of its first row:
// whether row r of the block from t0 is its sequence's first there.
fn first_of_seq(t0: u32, r: u32) -> bool {
    let slot = rows[2u * (t0 + r) + 1u];
    for (var e = 0u; e < r; e++) {
        if (rows[2u * (t0 + e) + 1u] == slot) {
            return false;
        }
    }
    return true;
}

// The union [x, y) of the key ranges of the block's rows r .. nq - 1 in row r's sequence.
fn seq_key_union(t0: u32, r: u32, nq: u32) -> vec2<u32> {
    let slot = rows[2u * (t0 + r) + 1u];
    var u = vec2<u32>(0xffffffffu, 0u);
    for (var e = r; e < nq; e++) {
        if (rows[2u * (t0 + e) + 1u] == slot) {
            let p = rows[2u * (t0 + e)];
            u = vec2<u32>(min(u.x, key_lo(p, params.window, params.chunk)), max(u.y, p + 1u));
        }
    }
    return u;
}

// One walk of a tiled prefill kernel: the sequence slot of the block's row r (its first there), the union
// [lo, hi) of that sequence's rows' key ranges (seq_key_union), the first tile's key (a multiple of bk
// at or below lo), and where the slot's block table starts.
struct SeqWalk {
    slot: u32,
    lo: u32,
    hi: u32,
    first: u32,
    tb: u32,
}

fn seq_walk(t0: u32, r: u32, nq: u32, bk: u32) -> SeqWalk {
    let slot = rows[2u * (t0 + r) + 1u];
    let u = seq_key_union(t0, r, nq);
    return SeqWalk(slot, u.x, u.y, u.x / bk * bk, slot * params.blocks_per_seq);
}
