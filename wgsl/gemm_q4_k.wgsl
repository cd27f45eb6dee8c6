// Q4_K weights times 8-bit activations for batches of tokens ("mmq"): the
// GEMV's arithmetic (gemv_q4_k.wgsl: dot4I8Packed of masked nibbles with the
// int8 q of quantize_q8.wgsl) in a tiled GEMM, so each weight block is read
// once per BT tokens instead of once per token.
//
// A workgroup owns BN staged weight rows x BT tokens; invocation (tr, tt)
// keeps RM x RT sums: rows tr + i TR and tokens tt + j TT (strided, so the
// stores of neighbouring invocations are neighbouring floats). The K loop
// stages SUB sub-blocks (32 values each; 8 = a whole Q4_K block, 4 = half of
// one) at a time: the rows' nibbles (16-byte loads, contiguous per row), the
// rows' headers decoded once into d*sc and dmin*m per sub-block, and the
// tokens' q bytes and scales, kept in quantize_q8's permuted order (nibble
// vec4 p meets activation vec4 2p (low nibbles) and 2p + 1 (high)). Two
// barriers per stage; PREFETCH issues the next stage's loads into registers
// (fetch) before this stage's products and stores them (put) after the
// closing barrier. Per sub-block pair c (sub-blocks 2c, 2c + 1):
//   acc += d sc_a dx_a isum_a + d sc_b dx_b isum_b - dmin m_a s_a - dmin m_b s_b.
// The weight tiles in workgroup memory are XOR-swizzled (swz) so that the 8
// neighbouring rows one 16-byte read phase touches land in 8 distinct banks.
//
// PAIR (the fused gate||up): staged rows [0, BN/2) are gate rows of `w`,
// [BN/2, BN) the same rows of `w2`; an invocation's slots i < RM/2 hold gate,
// i + RM/2 the matching up row; the output is act(gate) * up, BN/2 rows per
// tile. SPLIT (the fused q|k|v): store_split of gemv_split.wgsl. Params and
// the row epilogue come from matmul_common.wgsl (x_stride: vec4 between
// tokens of xq). Rows past N and tokens past T read row N - 1 / token T - 1
// and are not stored. Dispatch (ceil(N_chunk / OUT_ROWS), ceil(T / BT), 1).

@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> xq: array<vec4<u32>>;

// #include matmul_common
// #include activations

{{W2}}
{{SPLIT_DECL}}

const BN: u32 = {{BN}}u;    // staged weight rows per tile
const BT: u32 = {{BT}}u;    // tokens per tile
const RM: u32 = {{RM}}u;    // rows per invocation
const RT: u32 = {{RT}}u;    // tokens per invocation
const SUB: u32 = {{SUB}}u;  // sub-blocks per stage: 8 or 4
const PAIR: bool = {{PAIR}};
const ACT_GELU: bool = {{GELU}};
const TR: u32 = BN / RM;
const TT: u32 = BT / RT;
const WG: u32 = TR * TT;
const P: u32 = SUB / 2u;    // sub-block pairs per stage
const XV: u32 = 2u * SUB;   // activation vec4 per token per stage
const OUT_ROWS: u32 = select(BN, BN / 2u, PAIR);
const PREFETCH: bool = {{PREFETCH}};  // load stage n + 1 into registers while stage n is multiplied
const NQ: u32 = (BN * SUB + WG - 1u) / WG;  // per invocation per stage: nibble vec4,
const NH: u32 = (BN * P + WG - 1u) / WG;    // headers,
const NX: u32 = (BT * XV + WG - 1u) / WG;   // activation vec4,
const ND: u32 = (BT * P + WG - 1u) / WG;    // activation scales
const LO: u32 = 0x0F0F0F0Fu;

var<workgroup> wq: array<vec4<u32>, BN * SUB>;  // nibbles, [row][sub-block] swizzled
var<workgroup> ws: array<vec4<f32>, BN * P>;    // per row, pair: (d sc_a, dmin m_a, d sc_b, dmin m_b), swizzled
var<workgroup> xs: array<vec4<u32>, BT * XV>;   // activation q, [token][vec4]
var<workgroup> xd: array<vec4<f32>, BT * P>;    // per token, pair: (d_a, s_a, d_b, s_b)
var<workgroup> partial: array<f32, 1>;          // matmul_common's finish_row needs the name; unused here

fn wload(slot: u32, i: u32) -> vec4<u32> {
    {{W2_LOAD}}
    return w[i];
}

// Slot of entry v (< n, n in 2, 4, 8) of row `row` in a [row][n] tile: rows
// 8 / n apart start in the same bank, so v is XORed with the row's group.
fn swz(row: u32, v: u32, n: u32) -> u32 {
    return row * n + (v ^ ((row / (8u / n)) % n));
}

// (scale, min) of sub-block j from the header's 12 bytes (k_scales: 6 bits each).
fn scale_min(hd: vec4<u32>, j: u32) -> vec2<f32> {
    let sh = 8u * (j & 3u);
    let a = (hd.y >> sh) & 0xFFu;
    let m = (hd.z >> sh) & 0xFFu;
    if (j < 4u) {
        return vec2<f32>(f32(a & 63u), f32(m & 63u));
    }
    let b = (hd.w >> sh) & 0xFFu;
    return vec2<f32>(f32((b & 15u) | ((a >> 6u) << 4u)), f32((b >> 4u) | ((m >> 6u) << 4u)));
}

// Staged row `rho` of this tile: (which matrix, vec4 index of its row start).
fn staged_row(rho: u32, first: u32, rowv: u32) -> vec2<u32> {
    var slot = 0u;
    var r = first + rho;
    if (PAIR && rho >= BN / 2u) {
        slot = 1u;
        r -= BN / 2u;
    }
    return vec2<u32>(slot, min(r, params.N - 1u) * rowv);
}

fn dot_lo(q: vec4<u32>, x: vec4<u32>) -> i32 {
    return dot4I8Packed(q.x & LO, x.x) + dot4I8Packed(q.y & LO, x.y) + dot4I8Packed(q.z & LO, x.z) + dot4I8Packed(q.w & LO, x.w);
}

fn dot_hi(q: vec4<u32>, x: vec4<u32>) -> i32 {
    return dot4I8Packed((q.x >> 4u) & LO, x.x) + dot4I8Packed((q.y >> 4u) & LO, x.y)
         + dot4I8Packed((q.z >> 4u) & LO, x.z) + dot4I8Packed((q.w >> 4u) & LO, x.w);
}

// One stage's global loads, held in registers: invocation tid's share of the
// nibbles, headers, activation q and scales (entry k = tid + n WG of each list).
struct Staged {
    q: array<vec4<u32>, NQ>,
    h: array<vec4<u32>, NH>,
    x: array<vec4<u32>, NX>,
    d: array<vec4<u32>, ND>,
}

fn fetch(st: u32, tid: u32, first: u32, tok0: u32) -> Staged {
    let b = st / (8u / SUB);
    let s = st % (8u / SUB);
    let rowv = params.row_bytes / 16u;
    var g: Staged;
    for (var n = 0u; n < NQ; n++) {
        let k = tid + n * WG;
        if (k < BN * SUB) {
            let at = staged_row(k / SUB, first, rowv);
            g.q[n] = wload(at.x, at.y + b * 9u + 1u + s * SUB + k % SUB);
        }
    }
    for (var n = 0u; n < NH; n++) {
        let k = tid + n * WG;
        if (k < BN * P) {
            let at = staged_row(k / P, first, rowv);
            g.h[n] = wload(at.x, at.y + b * 9u);
        }
    }
    for (var n = 0u; n < NX; n++) {
        let k = tid + n * WG;
        if (k < BT * XV) {
            let t = min(tok0 + k / XV, params.T - 1u);
            g.x[n] = xq[t * params.x_stride + b * 16u + s * XV + k % XV];
        }
    }
    for (var n = 0u; n < ND; n++) {
        let k = tid + n * WG;
        if (k < BT * P) {
            let t = min(tok0 + k / P, params.T - 1u);
            g.d[n] = xq[t * params.x_stride + params.K / 16u + b * 4u + s * P + k % P];
        }
    }
    return g;
}

// Stage st straight into workgroup memory (PREFETCH off: the same loads and
// stores as fetch then put, without the register arrays, which lavapipe runs
// slower).
fn stage(st: u32, tid: u32, first: u32, tok0: u32) {
    let b = st / (8u / SUB);
    let s = st % (8u / SUB);
    let rowv = params.row_bytes / 16u;
    for (var k = tid; k < BN * SUB; k += WG) {
        let at = staged_row(k / SUB, first, rowv);
        wq[swz(k / SUB, k % SUB, SUB)] = wload(at.x, at.y + b * 9u + 1u + s * SUB + k % SUB);
    }
    for (var k = tid; k < BN * P; k += WG) {
        let at = staged_row(k / P, first, rowv);
        ws[swz(k / P, k % P, P)] = header(wload(at.x, at.y + b * 9u), s * SUB + 2u * (k % P));
    }
    for (var k = tid; k < BT * XV; k += WG) {
        let t = min(tok0 + k / XV, params.T - 1u);
        xs[k] = xq[t * params.x_stride + b * 16u + s * XV + k % XV];
    }
    for (var k = tid; k < BT * P; k += WG) {
        let t = min(tok0 + k / P, params.T - 1u);
        xd[k] = bitcast<vec4<f32>>(xq[t * params.x_stride + params.K / 16u + b * 4u + s * P + k % P]);
    }
}

// (d sc, dmin m) of sub-blocks j and j + 1 from a block's header.
fn header(hd: vec4<u32>, j: u32) -> vec4<f32> {
    let dm = unpack2x16float(hd.x);
    let ma = scale_min(hd, j);
    let mb = scale_min(hd, j + 1u);
    return vec4<f32>(dm.x * ma.x, dm.y * ma.y, dm.x * mb.x, dm.y * mb.y);
}

// A fetched stage into workgroup memory, the headers decoded on the way.
fn put(g: Staged, st: u32, tid: u32) {
    let s = st % (8u / SUB);
    for (var n = 0u; n < NQ; n++) {
        let k = tid + n * WG;
        if (k < BN * SUB) {
            wq[swz(k / SUB, k % SUB, SUB)] = g.q[n];
        }
    }
    for (var n = 0u; n < NH; n++) {
        let k = tid + n * WG;
        if (k < BN * P) {
            ws[swz(k / P, k % P, P)] = header(g.h[n], s * SUB + 2u * (k % P));
        }
    }
    for (var n = 0u; n < NX; n++) {
        let k = tid + n * WG;
        if (k < BT * XV) {
            xs[k] = g.x[n];
        }
    }
    for (var n = 0u; n < ND; n++) {
        let k = tid + n * WG;
        if (k < BT * P) {
            xd[k] = bitcast<vec4<f32>>(g.d[n]);
        }
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let tr = tid % TR;
    let tt = tid / TR;
    let first = wid.x * OUT_ROWS;  // the tile's first output row (of this chunk)
    let tok0 = wid.y * BT;
    var acc: array<f32, RM * RT>;
    let nst = (params.K / 256u) * (8u / SUB);  // stages
    var g: Staged;
    if (PREFETCH) {
        g = fetch(0u, tid, first, tok0);
    }
    for (var st = 0u; st < nst; st++) {
        if (PREFETCH) {
            put(g, st, tid);
        } else {
            stage(st, tid, first, tok0);
        }
        workgroupBarrier();
        if (PREFETCH && st + 1u < nst) {
            g = fetch(st + 1u, tid, first, tok0);  // in flight while this stage is multiplied
        }
        for (var c = 0u; c < P; c++) {
            var qa: array<vec4<u32>, RM>;  // nibble vec4 2c: low = sub-block 2c, high = 2c + 1 (first 16 values)
            var qb: array<vec4<u32>, RM>;  // nibble vec4 2c + 1: the other 16 values of each
            var sw: array<vec4<f32>, RM>;
            for (var i = 0u; i < RM; i++) {
                let rho = tr + i * TR;
                qa[i] = wq[swz(rho, 2u * c, SUB)];
                qb[i] = wq[swz(rho, 2u * c + 1u, SUB)];
                sw[i] = ws[swz(rho, c, P)];
            }
            for (var j = 0u; j < RT; j++) {
                let tau = tt + j * TT;
                let xo = tau * XV + 4u * c;
                let x0 = xs[xo];
                let x1 = xs[xo + 1u];
                let x2 = xs[xo + 2u];
                let x3 = xs[xo + 3u];
                let sx = xd[tau * P + c];
                for (var i = 0u; i < RM; i++) {
                    let ia = dot_lo(qa[i], x0) + dot_lo(qb[i], x2);
                    let ib = dot_hi(qa[i], x1) + dot_hi(qb[i], x3);
                    let u = sw[i];
                    acc[i * RT + j] += u.x * sx.x * f32(ia) + u.z * sx.z * f32(ib) - (u.y * sx.y + u.w * sx.w);
                }
            }
        }
        workgroupBarrier();  // the tiles are restaged next
    }

    for (var i = 0u; i < select(RM, RM / 2u, PAIR); i++) {
        let r = first + tr + i * TR;
        for (var j = 0u; j < RT; j++) {
            let t = tok0 + tt + j * TT;
            if (r < params.N && t < params.T) {
                var v = acc[i * RT + j];
                if (PAIR) {
                    v = select(silu(v), gelu(v), ACT_GELU) * acc[(i + RM / 2u) * RT + j];
                }
                {{STORE}}(r, t, v);
            }
        }
    }
}
