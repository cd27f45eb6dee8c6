// Tiled prefill attention, register-blocked and GQA-shared (attn_tiled's
// successor; same results). One workgroup per (HG query heads of one kv head,
// block of R = M / HG batch rows): its M query slots (slot m = row m / HG,
// head m % HG) all read the same kv head, so each K/V tile staged in
// workgroup memory serves M queries (attn_tiled: 16). Dispatch
// (n_heads / HG, ceil(T / R), 1), row blocks taken last-first so the long
// causal ones start early.
//
// Invocation (qg, lane), qg = tid / 16: query slots qg * QPI .. + QPI, and
// keys lane, lane + 16, ... of each BK = 16 KPI-key tile (a QPI x KPI
// micro-tile of scores: every q/k word read from workgroup memory feeds
// several MACs), then vec4 output columns lane, lane + 16, ... of p . V for
// the same slots.
//
// As the reference (infr/cpu/ops.py attention): q rounded to f16, K/V the f16
// cache, the *normalised* probabilities rounded to f16 before they multiply V.
// That needs each row's final max and sum first, so pass 1 walks the tiles for
// an online (max, sum) per slot and lane (merged over the 16 lanes at the end)
// and pass 2 walks them again: p = f16(exp(s - max) / sum) into a tile of f16
// pairs, then the V tile over the K tile's space, and p . V.
//
// Rows carry their own position and sequence slot (attn_common): one walk per
// distinct sequence among the block's rows, each row taking part only in its
// own (one walk for a prefill chunk). Keys outside the walk's union of ranges
// are staged as zeros and never read from the cache (released sliding-window
// blocks, poisoned rows past the length). Each key's cache row goes through the
// block table (a 32-key tile may straddle 16-position blocks). Padding rows
// write zeros. HD % 8 == 0, VD % 4 == 0, both at most 512 (past 256 only 8 or 16 slots fit
// 48 KiB of workgroup memory: kernels_attention.default_tiling).

// #include attn_common

const WG: u32 = {{WG}}u;         // (M / QPI) * 16
const M: u32 = {{M}}u;           // query slots of a workgroup
const HG: u32 = {{HG}}u;         // query heads of a workgroup (one kv head's, a power of two dividing M)
const R: u32 = M / HG;           // batch rows of a workgroup
const QPI: u32 = {{QPI}}u;       // query slots per invocation
const KPI: u32 = {{KPI}}u;       // keys per invocation and tile (even)
const BK: u32 = 16u * KPI;       // keys per tile
const HD: u32 = {{HD}}u;
const VD: u32 = {{VD}}u;
const HW: u32 = HD / 2u;         // u32 words (f16 pairs) of a q / k row
const VW: u32 = VD / 2u;
const QS: u32 = HW + 1u;         // row strides padded against bank conflicts
const KVW: u32 = {{KVW}}u;       // max(HD, VD) / 2 + 1
const KVN: u32 = {{KVN}}u;       // max(BK * KVW, M * 32): also the (max, sum) merge's scratch
const KP: u32 = KPI / 2u;        // f16-pair words of probabilities per invocation and slot
const PS: u32 = BK / 2u + 1u;    // f16-pair words of a probability row, padded
const NV: u32 = (VD / 4u + 15u) / 16u;  // vec4 output columns per invocation and slot

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> kcache: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> vcache: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> state: array<u32>;
@group(0) @binding(6) var<storage, read> rows: array<u32>;
@group(0) @binding(7) var<storage, read> block_table: array<u32>;

// #include paging

var<workgroup> qs: array<u32, M * QS>;
var<workgroup> kv: array<u32, KVN>;
var<workgroup> probs: array<u32, M * PS>;

// K rows of keys kb .. kb + BK of the walk's sequence, 16 bytes a load (HD % 8 == 0); keys
// outside [w.lo, w.hi) zeros, their rows never read.
fn load_k(kb: u32, w: SeqWalk, kvh: u32, tid: u32) {
    for (var i = tid; i < BK * (HW / 4u); i += WG) {
        let r = i / (HW / 4u);
        let c = i % (HW / 4u);
        var words = vec4<u32>(0u);
        let p = kb + r;
        if (p >= w.lo && p < w.hi) {
            words = kcache[(cache_row(w.tb, p) * params.kv_heads + kvh) * (HW / 4u) + c];
        }
        let e = r * KVW + 4u * c;
        kv[e] = words.x;
        kv[e + 1u] = words.y;
        kv[e + 2u] = words.z;
        kv[e + 3u] = words.w;
    }
}

// V rows likewise, 8 bytes a load (VD % 4 == 0).
fn load_v(kb: u32, w: SeqWalk, kvh: u32, tid: u32) {
    for (var i = tid; i < BK * (VW / 2u); i += WG) {
        let r = i / (VW / 2u);
        let c = i % (VW / 2u);
        var words = vec2<u32>(0u);
        let p = kb + r;
        if (p >= w.lo && p < w.hi) {
            words = vcache[(cache_row(w.tb, p) * params.kv_heads + kvh) * (VW / 2u) + c];
        }
        let e = r * KVW + 2u * c;
        kv[e] = words.x;
        kv[e + 1u] = words.y;
    }
}

// Scores of this invocation's QPI slots against keys lane + 16 b (b < KPI) of the
// staged tile, s[i * KPI + b]: scaled and soft-capped.
fn scores(qg: u32, lane: u32) -> array<f32, QPI * KPI> {
    var acc: array<vec2<f32>, QPI * KPI>;  // partial sums of (even, odd) dims
    let qb = qg * QPI * QS;
    for (var w = 0u; w < HW; w++) {
        var k: array<vec2<f32>, KPI>;
        for (var b = 0u; b < KPI; b++) {
            k[b] = halves(kv[(lane + 16u * b) * KVW + w]);
        }
        for (var i = 0u; i < QPI; i++) {
            let x = halves(qs[qb + i * QS + w]);
            for (var b = 0u; b < KPI; b++) {
                acc[i * KPI + b] += x * k[b];
            }
        }
    }
    var s: array<f32, QPI * KPI>;
    for (var e = 0u; e < QPI * KPI; e++) {
        s[e] = finish_score(acc[e].x + acc[e].y, params.scale, params.softcap);
    }
    return s;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let qb = query_block(wid, nwg, HG, R);
    let h0 = qb.h0;
    let kvh = qb.kvh;
    let t0 = qb.t0;
    let nq = qb.nq;  // live rows of this block
    let qg = tid / 16u;
    let lane = tid % 16u;

    for (var i = tid; i < M * HW; i += WG) {
        let m = i / HW;
        let w = i % HW;
        let r = m / HG;
        var word = 0u;
        if (r < nq) {
            let b = ((t0 + r) * params.n_heads + h0 + m % HG) * HD + 2u * w;
            word = pack_f16(q[b], q[b + 1u]);  // the f16 rounding of q
        }
        qs[m * QS + w] = word;
    }

    // This invocation's slots: their rows' key ranges (none for padding rows).
    var lo: array<u32, QPI>;
    var hi: array<u32, QPI>;
    var slot_of: array<u32, QPI>;
    for (var i = 0u; i < QPI; i++) {
        let sk = slot_keys(t0, (qg * QPI + i) / HG, nq);
        lo[i] = sk.lo;
        hi[i] = sk.hi;
        slot_of[i] = sk.slot;
    }

    var acc: array<array<vec4<f32>, NV>, QPI>;
    // One walk per sequence of the block, in the order of its first row.
    for (var r = 0u; r < nq; r++) {
        if (!first_of_seq(t0, r)) {
            continue;
        }
        let w = seq_walk(t0, r, nq, BK);  // tiles from a multiple of BK over the sequence's union of key ranges
        var mine: array<bool, QPI>;
        for (var i = 0u; i < QPI; i++) {
            mine[i] = slot_of[i] == w.slot;
        }

        // Pass 1: online (max, sum) per slot over this lane's keys.
        var ml: array<vec2<f32>, QPI>;
        for (var i = 0u; i < QPI; i++) {
            ml[i] = vec2<f32>(NEG_BIG, 0.0);
        }
        for (var kb = w.first; kb < w.hi; kb += BK) {
            workgroupBarrier();
            load_k(kb, w, kvh, tid);
            workgroupBarrier();
            let s = scores(qg, lane);
            for (var i = 0u; i < QPI; i++) {
                // this tile's (max, sum) of the slot's keys here, merged into the running pair
                var mx = NEG_BIG;
                for (var b = 0u; b < KPI; b++) {
                    let j = kb + lane + 16u * b;
                    if (mine[i] && j >= lo[i] && j < hi[i]) {
                        mx = max(mx, s[i * KPI + b]);
                    }
                }
                if (mx > NEG_BIG) {
                    var sum = 0.0;
                    for (var b = 0u; b < KPI; b++) {
                        let j = kb + lane + 16u * b;
                        if (mine[i] && j >= lo[i] && j < hi[i]) {
                            sum += exp(s[i * KPI + b] - mx);
                        }
                    }
                    ml[i] = merge_ml(ml[i], vec2<f32>(mx, sum));
                }
            }
        }
        workgroupBarrier();  // kv free: the merge's scratch
        for (var i = 0u; i < QPI; i++) {
            let e = ((qg * QPI + i) * 16u + lane) * 2u;
            kv[e] = bitcast<u32>(ml[i].x);
            kv[e + 1u] = bitcast<u32>(ml[i].y);
        }
        workgroupBarrier();
        var row: array<vec2<f32>, QPI>;
        for (var i = 0u; i < QPI; i++) {
            let e = (qg * QPI + i) * 32u;
            var v = vec2<f32>(NEG_BIG, 0.0);
            for (var l = 0u; l < 16u; l++) {
                v = merge_ml(v, vec2<f32>(bitcast<f32>(kv[e + 2u * l]), bitcast<f32>(kv[e + 2u * l + 1u])));
            }
            row[i] = v;
        }

        // Pass 2: p = f16(exp(s - max) / sum) as f16 pairs, then p . V.
        for (var kb = w.first; kb < w.hi; kb += BK) {
            workgroupBarrier();  // kv and probs free (the previous tile's p . V, or the merge, read them)
            load_k(kb, w, kvh, tid);
            workgroupBarrier();
            let s = scores(qg, lane);
            for (var i = 0u; i < QPI; i++) {
                for (var c = 0u; c < KP; c++) {
                    var bits = 0u;
                    for (var h = 0u; h < 2u; h++) {
                        let b = 2u * c + h;
                        let j = kb + lane + 16u * b;
                        if (mine[i] && j >= lo[i] && j < hi[i]) {
                            bits |= f16_bits(exp(s[i * KPI + b] - row[i].x) / row[i].y) << (16u * h);
                        }
                    }
                    // word c * 16 + lane: keys lane + 32 c and lane + 32 c + 16
                    probs[(qg * QPI + i) * PS + c * 16u + lane] = bits;
                }
            }
            workgroupBarrier();  // K read by all
            load_v(kb, w, kvh, tid);
            workgroupBarrier();
            for (var jw = 0u; jw < BK / 2u; jw++) {
                let r0 = (jw % 16u + 32u * (jw / 16u)) * KVW;  // the word's two keys (as written above)
                let r1 = r0 + 16u * KVW;
                var p: array<vec2<f32>, QPI>;  // those keys' probabilities for each slot
                for (var i = 0u; i < QPI; i++) {
                    p[i] = halves(probs[(qg * QPI + i) * PS + jw]);
                }
                for (var n = 0u; n < NV; n++) {
                    let col = lane + n * 16u;
                    if (col < VD / 4u) {
                        let v0 = vec4<f32>(halves(kv[r0 + 2u * col]), halves(kv[r0 + 2u * col + 1u]));
                        let v1 = vec4<f32>(halves(kv[r1 + 2u * col]), halves(kv[r1 + 2u * col + 1u]));
                        for (var i = 0u; i < QPI; i++) {
                            acc[i][n] += p[i].x * v0 + p[i].y * v1;
                        }
                    }
                }
            }
        }
    }
    // Live rows their output; padding rows of the block zeros (acc untouched), where the buffer has them.
    let n_rows = arrayLength(&out) / (params.n_heads * (VD / 4u));
    for (var i = 0u; i < QPI; i++) {
        let m = qg * QPI + i;
        let t = t0 + m / HG;
        if (t < n_rows) {
            for (var n = 0u; n < NV; n++) {
                let col = lane + n * 16u;
                if (col < VD / 4u) {
                    out[(t * params.n_heads + h0 + m % HG) * (VD / 4u) + col] = acc[i][n];
                }
            }
        }
    }
}
