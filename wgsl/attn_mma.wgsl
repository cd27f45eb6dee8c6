// Prefill attention on the tensor cores (the Dawn tier: chromium_experimental_subgroup_matrix, f16
// inputs, f32 results, 16 x 16 x 16). attn_tiled2's walk and results, its products as subgroup matrices:
// one workgroup per (HG query heads of one kv head, block of R = M / HG batch rows), slot m = row m / HG,
// head m % HG; subgroup s owns slots 16 s .. 16 s + 15 as one 16-row query matrix (q rounded to f16, held
// in registers as HD / 16 left matrices for the whole walk). Per tile of BK keys staged in workgroup
// memory (f16, [key][dim]):
//   S = Q K^T   BK / 16 result matrices, stored to the subgroup's score rows (sc);
//   pass 1      each lane an online (max, sum) of its slot (lane % 16) over half the tile's keys;
//               the two halves merged by a shuffle after the walk;
//   pass 2      S again, p = f16(exp(s - max) / sum) into the subgroup's probability rows (pr),
//               then the V tile over the K tile's space, and O += P V as VD / 16 result matrices.
// As the reference (infr/cpu/ops.py attention): the *normalised* probabilities rounded to f16 before
// they multiply V, so the walk runs twice. Keys outside the walk's union of ranges are staged as
// zeros and never read from the cache; a slot's keys outside its own range get p = 0. Rows carry
// their own position and sequence slot (attn_common): one walk per distinct sequence of the block.
// Padding rows write zeros. HD, VD multiples of 16. Dispatch (n_heads / HG, ceil(T / R), 1), row
// blocks taken last-first so the long causal ones start early.

enable chromium_experimental_subgroup_matrix;

// #include attn_common

const M: u32 = {{M}}u;        // query slots of a workgroup, 16 a subgroup
const HG: u32 = {{HG}}u;      // query heads of a workgroup (one kv head's, a power of two dividing M)
const R: u32 = M / HG;        // batch rows of a workgroup
const NSG: u32 = M / 16u;     // subgroups
const SG: u32 = 32u;          // subgroup size (kernels_mma.SUBGROUP)
const WG: u32 = NSG * SG;
const BK: u32 = {{BK}}u;      // keys per tile, a multiple of 32
const HD: u32 = {{HD}}u;
const VD: u32 = {{VD}}u;
const LDK: u32 = {{LDK}}u;    // f16 stride of a staged K / V row: max(HD, VD) + 8
const LDS: u32 = BK + 4u;     // f32 stride of a score row
const LDP: u32 = BK + 8u;     // f16 stride of a probability row (>= 16: q is staged there too)
const HK: u32 = BK / 2u;      // keys of a tile each lane takes in the scalar part

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> kcache: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> vcache: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read> state: array<u32>;
@group(0) @binding(6) var<storage, read> rows: array<u32>;
@group(0) @binding(7) var<storage, read> block_table: array<u32>;

// #include paging

var<workgroup> kv: array<f16, BK * LDK>;
var<workgroup> sc: array<f32, NSG * 16u * LDS>;
var<workgroup> pr: array<f16, NSG * 16u * LDP>;

// Eight f16 of a vec4 word into kv from e.
fn put8(e: u32, w: vec4<u32>) {
    for (var c = 0u; c < 4u; c++) {
        let h = bitcast<vec2<f16>>(w[c]);
        kv[e + 2u * c] = h.x;
        kv[e + 2u * c + 1u] = h.y;
    }
}

// K (or with `is_v` V) rows of keys kb .. kb + BK of the walk's sequence, 16 bytes a load; keys outside
// [w.lo, w.hi) zeros, their rows never read (zero V rows keep p = 0 times a poisoned row out of the sums).
fn load_rows(is_v: bool, kb: u32, w: SeqWalk, kvh: u32, tid: u32) {
    let W = select(HD, VD, is_v) / 8u;  // vec4 words a row
    for (var i = tid; i < BK * W; i += WG) {
        let r = i / W;
        let c = i % W;
        var words = vec4<u32>(0u);
        let p = kb + r;
        if (p >= w.lo && p < w.hi) {
            let at = (cache_row(w.tb, p) * params.kv_heads + kvh) * W + c;
            if (is_v) {
                words = vcache[at];
            } else {
                words = kcache[at];
            }
        }
        put8(r * LDK + 8u * c, words);
    }
}

// Dims 16 d .. 16 d + 15 of the subgroup's 16 query slots, rounded to f16, into its pr rows (row-major,
// stride LDP): lane takes slot lane % 16, eight dims from 8 (lane / 16).
fn stage_q(d: u32, pb: u32, lane: u32, qrow: u32, live: bool) {
    let i = lane % 16u;
    let c0 = 8u * (lane / 16u);
    for (var c = 0u; c < 8u; c++) {
        var v = 0.0;
        if (live) {
            v = q[qrow + 16u * d + c0 + c];
        }
        pr[pb + i * LDP + c0 + c] = bitcast<vec2<f16>>(f16_bits(v)).x;
    }
}

// The scores of this lane's slot against its HK keys of the tile, from the subgroup's sc rows: scaled,
// soft-capped, NEG_BIG where the key is not the slot's.
fn lane_scores(sb: u32, lane: u32, kb: u32, lo: u32, hi: u32, mine: bool) -> array<f32, HK> {
    var s: array<f32, HK>;
    let row = sb + (lane % 16u) * LDS + HK * (lane / 16u);
    let j0 = kb + HK * (lane / 16u);
    for (var b = 0u; b < HK; b++) {
        let j = j0 + b;
        s[b] = NEG_BIG;
        if (mine && j >= lo && j < hi) {
            s[b] = finish_score(sc[row + b], params.scale, params.softcap);
        }
    }
    return s;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32, @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32) {
    let qb = query_block(wid, nwg, HG, R);
    let h0 = qb.h0;
    let kvh = qb.kvh;
    let t0 = qb.t0;
    let nq = qb.nq;  // live rows of this block
    let sb = sg * 16u * LDS;  // the subgroup's score rows
    let pb = sg * 16u * LDP;  // its probability rows

    // This lane's slot (lane % 16 of the subgroup's): its row's key range (none for padding rows).
    let m = sg * 16u + lane % 16u;
    let r_m = m / HG;
    let sk = slot_keys(t0, r_m, nq);
    let lo = sk.lo;
    let hi = sk.hi;
    let slot_of = sk.slot;
    let qrow = ((t0 + r_m) * params.n_heads + h0 + m % HG) * HD;

    // The query matrices, through the subgroup's pr rows.
{{QLOAD}}
{{ODECL}}
    // One walk per sequence of the block, in the order of its first row.
    for (var r = 0u; r < nq; r++) {
        if (!first_of_seq(t0, r)) {
            continue;
        }
        let w = seq_walk(t0, r, nq, BK);  // tiles from a multiple of BK over the sequence's union of key ranges
        let mine = slot_of == w.slot;

        // Pass 1: online (max, sum) of this lane's slot over its half of each tile.
        var ml = vec2<f32>(NEG_BIG, 0.0);
        for (var kb = w.first; kb < w.hi; kb += BK) {
            workgroupBarrier();  // kv and sc free
            load_rows(false, kb, w, kvh, tid);
            workgroupBarrier();
{{SCORES}}
            workgroupBarrier();
            let s = lane_scores(sb, lane, kb, lo, hi, mine);
            var mx = NEG_BIG;
            for (var b = 0u; b < HK; b++) {
                mx = max(mx, s[b]);
            }
            if (mx > NEG_BIG) {
                var sum = 0.0;
                for (var b = 0u; b < HK; b++) {
                    if (s[b] > NEG_BIG) {
                        sum += exp(s[b] - mx);
                    }
                }
                ml = merge_ml(ml, vec2<f32>(mx, sum));
            }
        }
        // Both halves of the slot's keys: lanes l and l ^ 16 hold the same slot.
        let row = merge_ml(ml, vec2<f32>(subgroupShuffleXor(ml.x, 16u), subgroupShuffleXor(ml.y, 16u)));

        // Pass 2: p = f16(exp(s - max) / sum) into pr, then O += P V.
        for (var kb = w.first; kb < w.hi; kb += BK) {
            workgroupBarrier();  // kv, sc and pr free
            load_rows(false, kb, w, kvh, tid);
            workgroupBarrier();
{{SCORES}}
            workgroupBarrier();  // scores stored, K read by all
            load_rows(true, kb, w, kvh, tid);
            let s = lane_scores(sb, lane, kb, lo, hi, mine);
            let prow = pb + (lane % 16u) * LDP + HK * (lane / 16u);
            for (var b = 0u; b < HK; b++) {
                var bits = 0u;
                if (s[b] > NEG_BIG) {
                    bits = f16_bits(exp(s[b] - row.x) / row.y);
                }
                pr[prow + b] = bitcast<vec2<f16>>(bits).x;
            }
            workgroupBarrier();
{{PV}}
        }
    }
    // Live rows their output; padding rows of the block zeros (no probabilities reached them), where the
    // buffer has them: each result matrix through the subgroup's sc rows.
    let n_rows = arrayLength(&out) / (params.n_heads * VD);
    let orow = (t0 + r_m) * params.n_heads + h0 + m % HG;
    let c0 = 8u * (lane / 16u);
{{OSTORE}}
}

// Columns 16 n .. 16 n + 15 of this lane's slot (eight of them, from c0) from the subgroup's sc rows.
fn write_out(n: u32, sb: u32, lane: u32, orow: u32, c0: u32, n_rows: u32, t: u32) {
    if (t < n_rows) {
        for (var c = 0u; c < 8u; c++) {
            out[orow * VD + 16u * n + c0 + c] = sc[sb + (lane % 16u) * LDS + c0 + c];
        }
    }
}
