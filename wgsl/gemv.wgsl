// Quantized matrix times 8-bit activations (dot4I8Packed), one kernel for
// every type with a reader wgsl/gemv_TYPE.wgsl. The activations come from
// quantize_q8.wgsl (its header says the layout): per 32 values int8 q, a
// scale d and d * sum(q), each 16 values one vec4, so a word of weights
// masked or shifted to bytes meets four q in one dot4I8Packed. Reading f32
// activations cost more than the weights: each lane needed 128 bytes of x,
// from 32 cache lines per load, for 16 bytes of Q4_K nibbles.
//
// The workgroup is TEAMS teams of 32 invocations. A team reads R weight rows
// together: each step covers 4 chunks of 256 values of every row, lanes
// 8j .. 8j + 7 chunk j, lane part p = lane % 8 32 values of it (which ones,
// and the two vec4 of activations they meet, is the reader's choice: its
// `x family`, below), so a team's weight loads are contiguous. Rows of
// blocks that are not 16-byte aligned (Q6_K 210 bytes, Q8_0 34, Q5_0 22:
// rows are padded only to a whole block) are still read in vec4: two or
// three aligned loads and `realign`. U steps are unrolled. K % 64 == 0 (the
// activation layout's unit); a chunk past K / 256 is partial (32-value
// types), its idle lanes read a valid block and add nothing.
//
// Per row, `seg` picks the reader (uniform per team): DOT0 for plain rows;
// PAIR (the fused gate||up of a gated FFN): slot 0 reads row r of `w` (gate,
// DOT0), slot 1 row r of `w2` (up, DOT1, row_bytes2), and the row's output is
// pair_act(gate) * up (gelu_f16: its table at binding 11, gelu_f16.wgsl);
// SPLIT (the fused q|k|v): `w` holds the matrices' rows one after the other
// (segment s from byte off_s, rows of row_bytes_s, reader DOT s), params.split1 / split2 send each row to its own output (y, y2, y3).
// A Q4_K_M layer's Q4_K q, k and Q6_K v so run as one dispatch.
// SG > 0: the adapter's subgroup size (dividing 32): partial sums are added
// with subgroupAdd, and across subgroups through shared memory; SG = 0 uses
// a shared-memory tree. Params, the output bindings and the row epilogue come
// from matmul_common.wgsl (x_stride: vec4 between tokens of xq);
// NT > 1 (small batches): a workgroup takes NT tokens, each team's weight
// loads meet every token's activations, so a batch of T tokens reads the
// weights ceil(T / NT) times from memory instead of T times; the repeated
// reads of a block for the next token come from the cache.
// EXPERT (expert_on.wgsl): the rows are an expert bank's, each token index a (token, slot)
// pair routed to its own expert (kernels_moe; NT = 1).
// Q8_OUT (gemv_q8_on.wgsl; PAIR only, dense or EXPERT): the pair's output also rounded to 8 bits
// for the down projection's GEMV, its quantize dispatch fused; the workgroup is then 32 teams
// (WG 1024), so its 32 rows are one whole 32-value block of the rounded layout.
// ROPE_OUT (gemv_rope_on.wgsl; SPLIT only): q and k rotated and k, v stored in the KV cache in the
// epilogue, the rope_kv dispatch fused.
// NORM_IN (gemv_norm_on.wgsl; one token a workgroup): binding 2 holds the rows of a plain RMSNorm's
// input, which the prologue norms and rounds into workgroup memory, the rmsnorm_q8 dispatch fused.
// dispatch (ceil(N_chunk / ROWS_PER_WG), ceil(T / NT), 1), numbered by grid_cell (matmul_common).

@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;

// #include matmul_common
// #include activations
// #include realign

{{W2}}
{{SPLIT_DECL}}
{{ACT_TABLE}}
{{EXPERT}}
{{Q8_OUT}}
{{ROPE_OUT}}
{{NORM_IN}}

const R: u32 = {{R}}u;        // weight rows per team
const U: u32 = {{U}}u;        // block steps unrolled
const NT: u32 = {{NT}}u;      // tokens per workgroup
const SG: u32 = {{SG}}u;      // subgroup size used for the reduction; 0 = none
const SG_PER_TEAM: u32 = TEAM / max(SG, 1u);
const PAIR: bool = {{PAIR}};
const SPLIT: bool = {{SPLIT}};
const SAME_X: bool = {{SAME_X}};  // every reader of this kernel takes one x family
const ONE_TYPE: bool = {{ONE_TYPE}};  // and is one reader (DOT0 = DOT1 = DOT2)
const TEAM: u32 = 32u;
const WG: u32 = {{WG}}u;  // 256; 1024 with Q8_OUT
const TEAMS: u32 = WG / TEAM;
const OUT: u32 = select(R, 1u, PAIR);  // output rows per team
const LO: u32 = 0x0F0F0F0Fu;

const RN: u32 = R * NT;       // sums per lane: row i of token j at j * R + i
const Q8_SLOTS: u32 = {{Q8_SLOTS}}u;  // q8_block's entries: 8 NT (Q8_OUT), else 1 (unused)
var<workgroup> q8_amax: array<f32, Q8_SLOTS>;
var<workgroup> q8_isum: array<i32, Q8_SLOTS>;
var<workgroup> partial: array<f32, {{PARTIAL}}>;  // the reduction's: WG * RN, (WG / SG) * RN with subgroups

// Stands in for subgroupAdd where the adapter has no subgroups (that branch never runs).
fn no_subgroups(v: f32) -> f32 {
    return v;
}

// The pair's activation of its gate (PAIR_ACT: silu, gelu, or gelu_f16 with its table).
fn pair_act(g: f32) -> f32 {
    return {{PAIR_ACT}}(g);
}

// --- weight loads: slot 1 is the pair's second matrix

fn wvec(slot: u32, i: u32) -> vec4<u32> {
    {{W2_VEC}}
    return w[i];
}

// The aligned word holding byte a.
fn wword(slot: u32, a: u32) -> u32 {
    {{W2_WORD}}
    return w[a >> 4u][(a >> 2u) & 3u];
}

// The f16 at even byte a.
fn wf16(slot: u32, a: u32) -> f32 {
    return unpack2x16float(wword(slot, a) >> ((a & 2u) * 8u)).x;
}

// 16 bytes at even byte a.
fn wide16(slot: u32, a: u32) -> vec4<u32> {
    let i = a >> 4u;
    return realign(wvec(slot, i), wvec(slot, i + 1u), a & 15u);
}

// sum_k q[k] . x[k] over four words of four int8.
fn dot16(q: vec4<u32>, x: vec4<u32>) -> i32 {
    return dot4I8Packed(q.x, x.x) + dot4I8Packed(q.y, x.y) + dot4I8Packed(q.z, x.z) + dot4I8Packed(q.w, x.w);
}

// --- the activations a lane meets: x families

// Two runs of 16 activations (a, b: int8 words) and the (d, d * sum q) of
// the 32-value blocks they lie in.
struct XL {
    a: vec4<u32>,
    b: vec4<u32>,
    sa: vec2<f32>,
    sb: vec2<f32>,
}

fn xscale(xsc: u32, bc: u32, sub: u32) -> vec2<f32> {
    let s = bitcast<vec4<f32>>(xq[xsc + bc * 4u + sub / 2u]);
    return select(s.xy, s.zw, (sub & 1u) != 0u);
}

// "std" (Q4_K, Q5_K): part p = 2c + hh: values 64c + 16hh .. +16 (sub-block
// 2c) and 64c + 32 + 16hh .. +16 (2c + 1), the lane's 32 bytes of xq.
fn x_std(xrow: u32, xsc: u32, bc: u32, p: u32) -> XL {
    let o = xrow + bc * 16u + 2u * p;
    let s = bitcast<vec4<f32>>(xq[xsc + bc * 4u + p / 2u]);
    return XL(xq[o], xq[o + 1u], s.xy, s.zw);
}

// "b32" (32-value blocks, IQ4_XS): part p = sub-block p, values 32p .. +16 and 32p + 16 .. +16.
fn x_b32(xrow: u32, xsc: u32, bc: u32, p: u32) -> XL {
    let o = xrow + bc * 16u + 4u * (p / 2u) + (p & 1u);
    let s = xscale(xsc, bc, p);
    return XL(xq[o], xq[o + 2u], s, s);
}

// "q6k": part p = 4n + 2j + hh: values 128n + 32j + 16hh .. +16 and the same + 64.
fn x_q6k(xrow: u32, xsc: u32, bc: u32, p: u32) -> XL {
    let n = p / 4u;
    let j = (p / 2u) & 1u;
    let o = xrow + bc * 16u + 8u * n + 2u * (p & 1u) + j;
    return XL(xq[o], xq[o + 4u], xscale(xsc, bc, 4u * n + j), xscale(xsc, bc, 4u * n + 2u + j));
}

// A lane's 32 weights as a reader hands them over: two runs of 16 int8 (qa
// meets x.a, qb x.b) and their factors, so that the lane's share of the dot
// product is c.x dx_a qa.xa + c.y dx_b qb.xb + c.z (dx_a sum xa) + c.w (dx_b sum xb):
// scales in c.xy, a min or an offset (Q4_0's -8) in c.zw. Read once, they meet
// the activations of each of the workgroup's NT tokens.
struct WB {
    qa: vec4<u32>,
    qb: vec4<u32>,
    c: vec4<f32>,
}

fn wdot(w: WB, x: XL) -> f32 {
    return w.c.x * x.sa.x * f32(dot16(w.qa, x.a)) + w.c.y * x.sb.x * f32(dot16(w.qb, x.b))
         + w.c.z * x.sa.y + w.c.w * x.sb.y;
}

// --- the readers of this kernel, and which one a row takes

{{READERS}}

fn seg_x(seg: u32, xrow: u32, xsc: u32, bc: u32, p: u32) -> XL {
    if (SAME_X || seg == 0u) {
        return {{X0}}(xrow, xsc, bc, p);
    }
    if (seg == 1u) {
        return {{X1}}(xrow, xsc, bc, p);
    }
    return {{X2}}(xrow, xsc, bc, p);
}

fn seg_w(seg: u32, slot: u32, rb: u32, bc: u32, p: u32) -> WB {
    if (ONE_TYPE || seg == 0u) {
        return {{DOT0}}(slot, rb, bc, p);
    }
    if (seg == 1u) {
        return {{DOT1}}(slot, rb, bc, p);
    }
    return {{DOT2}}(slot, rb, bc, p);
}

// Row r's reader (0..2) and the byte its row starts at.
fn row_seg(i: u32, r: u32) -> u32 {
    if (PAIR) {
        return i;
    }
    if (SPLIT) {
        return select(0u, 1u, r >= params.split1) + select(0u, 1u, r >= params.split2);
    }
    return 0u;
}

fn row_base(seg: u32, r: u32) -> u32 {
    if (PAIR && seg == 1u) {
        return r * params.row_bytes2;
    }
    if (SPLIT && seg == 1u) {
        return params.off2 + (r - params.split1) * params.row_bytes2;
    }
    if (SPLIT && seg == 2u) {
        return params.off3 + (r - params.split2) * params.row_bytes3;
    }
    return r * params.row_bytes;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    {{PROLOGUE}}
    let cell = grid_cell(wid, nwg, NT > 1u);  // (row block, token group): token groups first
    let t0 = cell.y * NT;  // the workgroup's first token
    if (t0 >= params.T || expert_skip(t0)) {  // expert_on: NT == 1, t0 a (token, slot) pair
        return;
    }
    norm_in(tid, t0);  // NORM_IN: the token's input norm, rounded into workgroup memory
    let team = tid / TEAM;
    let lane = tid % TEAM;
    let part = lane % 8u;
    let first = (cell.x * TEAMS + team) * OUT;  // the team's first output row
    let nsub = params.K / 32u;  // 32-value sub-blocks per row
    let nch = (nsub + 7u) / 8u;  // 256-value chunks (the last may be partial)
    let xk = params.K / 16u;  // the scales' offset in a token's row of xq
    var base: array<u32, R>;
    var seg: array<u32, R>;
    for (var i = 0u; i < R; i++) {
        // Rows past N (the last team of a chunk) read row N - 1 and are not stored.
        let r = min(select(first + i, first, PAIR), params.N - 1u);
        seg[i] = row_seg(i, r);
        base[i] = row_base(seg[i], r) + expert_byte(select(0u, i, PAIR), t0);
    }
    var acc: array<f32, RN>;
    for (var b0 = lane / 8u; b0 < nch; b0 += 4u * U) {
        for (var u = 0u; u < U; u++) {
            let sb = 8u * (b0 + 4u * u) + part;
            let live = sb < nsub;
            let s = min(sb, nsub - 1u);  // idle lanes read the last sub-block
            let bc = s / 8u;
            let p = s % 8u;
            if (NT == 1u) {
                // One token: the activations first, then each row's weights meet them as they
                // are read. Holding R rows' weights before the dot products (the batched order
                // below) costs the fused gate||up a third of its bandwidth on the H200.
                let xrow = x_row(t0);
                var x: XL;
                if (SAME_X) {
                    x = seg_x(0u, xrow, xrow + xk, bc, p);
                }
                for (var i = 0u; i < R; i++) {
                    if (!SAME_X) {
                        x = seg_x(seg[i], xrow, xrow + xk, bc, p);
                    }
                    acc[i] += select(0.0, wdot(seg_w(seg[i], select(0u, i, PAIR), base[i], bc, p), x), live);
                }
                continue;
            }
            var wb: array<WB, R>;
            for (var i = 0u; i < R; i++) {
                wb[i] = seg_w(seg[i], select(0u, i, PAIR), base[i], bc, p);
            }
            for (var j = 0u; j < NT; j++) {
                // Tokens past T (the batch's last workgroup) read token T - 1 and are not stored.
                let xrow = x_row(min(t0 + j, params.T - 1u));
                var x: XL;
                if (SAME_X) {
                    x = seg_x(0u, xrow, xrow + xk, bc, p);
                }
                for (var i = 0u; i < R; i++) {
                    if (!SAME_X) {
                        x = seg_x(seg[i], xrow, xrow + xk, bc, p);
                    }
                    acc[j * R + i] += select(0.0, wdot(wb[i], x), live);
                }
            }
        }
    }

    // Team sums, ending in lane 0.
    var tot: array<f32, RN>;
    if (SG == TEAM) {
        for (var i = 0u; i < RN; i++) {
            tot[i] = {{SUBGROUP_ADD}}(acc[i]);
        }
    } else if (SG > 0u) {
        for (var i = 0u; i < RN; i++) {
            let s = {{SUBGROUP_ADD}}(acc[i]);
            if (tid % max(SG, 1u) == 0u) {
                partial[(tid / max(SG, 1u)) * RN + i] = s;
            }
        }
        workgroupBarrier();
        if (lane == 0u) {
            for (var i = 0u; i < RN; i++) {
                var s = 0.0;
                for (var k = 0u; k < SG_PER_TEAM; k++) {
                    s += partial[(tid / max(SG, 1u) + k) * RN + i];
                }
                tot[i] = s;
            }
        }
    } else {
        for (var i = 0u; i < RN; i++) {
            partial[i * WG + tid] = acc[i];
        }
        workgroupBarrier();
        for (var s = TEAM / 2u; s > 0u; s >>= 1u) {
            if (lane < s) {
                for (var i = 0u; i < RN; i++) {
                    partial[i * WG + tid] += partial[i * WG + tid + s];
                }
            }
            workgroupBarrier();
        }
        for (var i = 0u; i < RN; i++) {
            tot[i] = partial[i * WG + tid];
        }
    }
    if (lane == 0u) {
        for (var j = 0u; j < NT; j++) {
            let t = t0 + j;
            if (t >= params.T) {
                break;
            }
            if (PAIR) {
                if (first < params.N) {
                    let g = tot[j * R];
                    let v = pair_act(g) * tot[j * R + R - 1u];
                    {{STORE}}(first, t, v);
                    q8_keep(j, team, v);
                }
            } else {
                for (var i = 0u; i < R; i++) {
                    if (first + i < params.N) {
                        {{STORE}}(first + i, t, tot[j * R + i]);
                    }
                }
            }
        }
    }
    q8_rows(tid, cell.x, t0);
    rope_rows(tid, cell.x, t0);
}
