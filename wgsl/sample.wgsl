// Sampling the next token on the GPU: penalties -> top_k -> top_p -> min_p ->
// temperature -> seeded draw, as infr/sampling.py (llama.cpp's default chain).
// The numpy twin of every step is infr/cpu/sample.py.
//
// No sort. top_k and top_p each keep a prefix of the logits in descending order
// (ties by lower index); the prefix is found by a radix select on the ordered
// 32-bit key of each value, 4 bits per round, 8 rounds (one dispatch each):
// round r histograms (count and mass exp(x - max)) the values whose upper 4r
// key bits match the prefix chosen so far, per slice of `slice` values; the
// next round's workgroups first merge those histograms (in a fixed order, so
// the result is the same run after run) and pick the bin where the count
// (top_k) or the mass (top_p) is reached. After 8 rounds the cut is an exact
// value v and a count c of its ties (lowest indices first).
// The draw is the Gumbel-max trick: argmax over kept tokens of
// (x - max) / temperature + Gumbel noise, the noise a counter-based hash of
// (seed, position, token id): an exact draw from the filtered softmax with no
// prefix sums, and reproducible bit for bit in numpy.
//
// Entry points and dispatches (all share one bind group layout):
//   penalize (1,1,1)        repeat/presence/frequency penalties in place on x
//   maxpart  (parts,1,1)    per-slice max and argmax
//   radix    (parts,1,1)    one radix round of job step.job (0 top_k, 1 top_p)
//   draw     (parts,rows,1) per-slice Gumbel winner of each row
//   merge    (rows,1,1)     out[row] = the winner
//   advance  (1,1,1)        seq[pos + 1] = out[0]; state[0] = pos + 1
// Row r draws for position state[0] + 1 + r (the decode loop uses one row).

struct Params {
    n: u32,
    parts: u32,
    slice: u32,
    top_k: u32,
    top_p: f32,
    min_p_log: f32,
    has_min_p: u32,
    inv_temp: f32,
    seed_lo: u32,
    seed_hi: u32,
    rows: u32,
    use_k: u32,
    use_p: u32,
    pen_n: u32,      // penalty window in tokens; NONE = the whole history
    rep: f32,
    rep_inv: f32,
    freq: f32,
    pres: f32,
}

struct Step {
    job: u32,
    round: u32,
}

struct St {
    pre: u32,     // key bits chosen so far
    acc_c: u32,   // count above the prefix's range
    acc_m: f32,   // mass above it
    need: f32,    // top_p's target mass
    eq_c: u32,    // values in the chosen bin (after the last round: equal to the cut)
}

const WG: u32 = 64u;
const BINS: u32 = 16u;
const NONE: u32 = 0xffffffffu;
// scratch layout (u32 words): [0, 32) round states per (job, parity); [32, 48) results per job;
// [64, 64 + 2 parts) slice maxima; then histograms [job][parity][part][bin][count, mass];
// then draw winners [row][part][score, index].
const RES: u32 = 32u;
const PMAX: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> seq: array<u32>;
@group(0) @binding(4) var<storage, read_write> state: array<u32>;
@group(0) @binding(5) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(6) var<storage, read_write> out: array<u32>;

var<workgroup> wv: array<f32, WG>;
var<workgroup> wi: array<u32, WG>;
var<workgroup> red_c: array<u32, 1024>;  // WG * BINS
var<workgroup> red_m: array<f32, 1024>;
var<workgroup> bin_c: array<u32, BINS>;
var<workgroup> bin_m: array<f32, BINS>;
var<workgroup> sh_st: St;
var<workgroup> sh_m: f32;
var<workgroup> sh_cut: vec4<u32>;  // (v, c, job, all kept)
var<workgroup> sh_rank: array<u32, WG>;
var<workgroup> sh_before: array<u32, WG>;

// Every entry point uses every binding, so one bind group layout serves all.
fn touch() {
    _ = params.n;
    _ = step.job;
    _ = x[0];
    _ = seq[0];
    _ = state[0];
    _ = scratch[0];
    _ = out[0];
}

fn hist_at(job: u32, par: u32, s: u32, b: u32) -> u32 {
    return PMAX + 2u * params.parts + (((job * 2u + par) * params.parts + s) * BINS + b) * 2u;
}

fn dpart_at(row: u32, s: u32) -> u32 {
    return PMAX + 2u * params.parts + 8u * params.parts * BINS + (row * params.parts + s) * 2u;
}

// Order-preserving map of f32 bits to u32: larger value, larger key.
fn key_of(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

fn value_of(k: u32) -> f32 {
    return bitcast<f32>(select(~k, k & 0x7fffffffu, (k & 0x80000000u) != 0u));
}

// Does (ov, oi) beat (mv, mi)? Empty slots never win; equal values keep the lower index.
fn beats(ov: f32, oi: u32, mv: f32, mi: u32) -> bool {
    return oi != NONE && (mi == NONE || ov > mv || (ov == mv && oi < mi));
}

fn reduce_best(tid: u32) {
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (tid < stride && beats(wv[tid + stride], wi[tid + stride], wv[tid], wi[tid])) {
            wv[tid] = wv[tid + stride];
            wi[tid] = wi[tid + stride];
        }
        workgroupBarrier();
    }
}

// PCG hash (Jarzynski & Olano 2020).
fn pcg(v: u32) -> u32 {
    let s = v * 747796405u + 2891336453u;
    let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
    return (w >> 22u) ^ w;
}

fn row_key(pos: u32) -> u32 {
    return pcg(pcg(pcg(params.seed_hi) ^ params.seed_lo) ^ pos);
}

fn gumbel(rk: u32, i: u32) -> f32 {
    let h = pcg(pcg(i ^ rk) + rk);
    let u = (f32(h >> 9u) + 0.5) * (1.0 / 8388608.0);  // in (0, 1), exact in f32
    return -log(-log(u));
}

// The maximum of x (merged from the slice maxima, all threads at once) into sh_m.
fn load_max(tid: u32) {
    var bv = 0.0;
    var bi = NONE;
    for (var p = tid; p < params.parts; p += WG) {
        let v = bitcast<f32>(scratch[PMAX + 2u * p]);
        let i = scratch[PMAX + 2u * p + 1u];
        if (beats(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    wv[tid] = bv;
    wi[tid] = bi;
    reduce_best(tid);
    if (tid == 0u) {
        sh_m = wv[0];
    }
    workgroupBarrier();
}

fn load_state(job: u32, r: u32) -> St {
    if (r == 0u) {
        return St(0u, 0u, 0.0, 0.0, 0u);
    }
    let o = (job * 2u + (r & 1u)) * 8u;
    return St(scratch[o], scratch[o + 1u], bitcast<f32>(scratch[o + 2u]), bitcast<f32>(scratch[o + 3u]), scratch[o + 4u]);
}

fn store_state(job: u32, r: u32, st: St) {
    let o = (job * 2u + (r & 1u)) * 8u;
    scratch[o] = st.pre;
    scratch[o + 1u] = st.acc_c;
    scratch[o + 2u] = bitcast<u32>(st.acc_m);
    scratch[o + 3u] = bitcast<u32>(st.need);
    scratch[o + 4u] = st.eq_c;
}

// The state after round rp of `job` (into sh_st): merge that round's histograms
// and take the bin, from the top, where the count or mass is reached.
fn decide(job: u32, rp: u32, tid: u32) {
    let par = rp & 1u;
    // Thread t sums bin t % 16 over every (WG / 16)-th slice from t / 16; the partial sums
    // are then added in a fixed order, so the totals are the same on every run.
    var c = 0u;
    var m = 0.0;
    for (var s = tid / BINS; s < params.parts; s += WG / BINS) {
        let o = hist_at(job, par, s, tid % BINS);
        c += scratch[o];
        m += bitcast<f32>(scratch[o + 1u]);
    }
    workgroupBarrier();  // red_* may still be read by a previous reduction
    red_c[tid] = c;
    red_m[tid] = m;
    workgroupBarrier();
    if (tid < BINS) {
        var cc = 0u;
        var mm = 0.0;
        for (var l = 0u; l < WG / BINS; l++) {
            cc += red_c[l * BINS + tid];
            mm += red_m[l * BINS + tid];
        }
        bin_c[tid] = cc;
        bin_m[tid] = mm;
    }
    workgroupBarrier();
    if (tid == 0u) {
        var st = load_state(job, rp);
        if (job == 1u && rp == 0u) {
            var total = 0.0;
            if (params.use_k != 0u) {
                total = bitcast<f32>(scratch[RES + 3u]);  // mass of the top_k prefix
            } else {
                for (var b = 0u; b < BINS; b++) {
                    total += bin_m[b];
                }
            }
            st.need = params.top_p * total;
        }
        var chosen = NONE;
        var last = NONE;
        var last_c = 0u;
        var last_m = 0.0;
        var ac = st.acc_c;
        var am = st.acc_m;
        for (var k = 0u; k < BINS; k++) {
            let b = BINS - 1u - k;
            let c = bin_c[b];
            if (c == 0u) {
                continue;
            }
            var hit = false;
            if (job == 0u) {
                hit = ac + c >= params.top_k;
            } else {
                hit = am + bin_m[b] >= st.need;
            }
            if (hit) {
                chosen = b;
                break;
            }
            last = b;
            last_c = ac;
            last_m = am;
            ac += c;
            am += bin_m[b];
        }
        if (chosen == NONE) {  // rounding left the target past the total: keep everything in range
            chosen = last;
            ac = last_c;
            am = last_m;
        }
        st.pre = st.pre | (chosen << (28u - 4u * rp));
        st.acc_c = ac;
        st.acc_m = am;
        st.eq_c = bin_c[chosen];
        sh_st = st;
    }
    workgroupBarrier();
}

// After decide(job, 7): the cut (v, c) and the mass of the kept prefix (thread 0).
fn finalize(job: u32) -> vec4<u32> {
    let st = sh_st;
    let e_v = exp(value_of(st.pre) - sh_m);
    var c = st.eq_c;
    if (job == 0u) {
        c = clamp(params.top_k - st.acc_c, 1u, st.eq_c);
    } else if (e_v > 0.0) {
        let q = ceil((st.need - st.acc_m) / e_v);
        c = select(st.eq_c, select(1u, u32(q), q >= 1.0), q < f32(st.eq_c));
    }
    let mass = st.acc_m + f32(c) * e_v;
    return vec4<u32>(st.pre, c, st.eq_c, bitcast<u32>(mass));
}

@compute @workgroup_size(WG)
fn penalize(@builtin(local_invocation_index) tid: u32) {
    touch();
    let len = state[0] + 1u;  // tokens in the context: positions 0 ..= state[0]
    var lo = 0u;
    if (params.pen_n != NONE && len > params.pen_n) {
        lo = len - params.pen_n;
    }
    for (var i = lo + tid; i < len; i += WG) {
        let t = seq[i];
        var first = true;
        for (var j = lo; j < i; j++) {
            if (seq[j] == t) {
                first = false;
                break;
            }
        }
        if (!first || t >= params.n) {
            continue;  // each distinct token once, by its first occurrence in the window
        }
        var cnt = 1u;
        for (var j = i + 1u; j < len; j++) {
            cnt += select(0u, 1u, seq[j] == t);
        }
        var v = x[t];
        if (params.rep != 1.0) {
            v = select(v * params.rep_inv, v * params.rep, v <= 0.0);
        }
        x[t] = v - (f32(cnt) * params.freq + params.pres);
    }
}

@compute @workgroup_size(WG)
fn maxpart(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    touch();
    let lo = wid.x * params.slice;
    let hi = min(params.n, lo + params.slice);
    var bv = 0.0;
    var bi = NONE;
    for (var i = lo + tid; i < hi; i += WG) {
        let v = x[i];
        if (bi == NONE || v > bv) {
            bv = v;
            bi = i;
        }
    }
    wv[tid] = bv;
    wi[tid] = bi;
    reduce_best(tid);
    if (tid == 0u) {
        scratch[PMAX + 2u * wid.x] = bitcast<u32>(wv[0]);
        scratch[PMAX + 2u * wid.x + 1u] = wi[0];
    }
}

@compute @workgroup_size(WG)
fn radix(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    touch();
    load_max(tid);
    let job = step.job;
    let r = step.round;
    if (job == 1u && r == 0u && params.use_k != 0u) {  // top_k's last round ended: its result
        decide(0u, 7u, tid);
        if (tid == 0u && wid.x == 0u) {
            let res = finalize(0u);
            for (var f = 0u; f < 4u; f++) {
                scratch[RES + f] = res[f];
            }
        }
    }
    var st = St(0u, 0u, 0.0, 0.0, 0u);
    if (r > 0u) {
        decide(job, r - 1u, tid);
        st = sh_st;
        if (tid == 0u && wid.x == 0u) {
            store_state(job, r, st);
        }
    }
    let m = sh_m;
    let shift = 28u - 4u * r;
    var cnt: array<u32, BINS>;
    var mas: array<f32, BINS>;
    let lo = wid.x * params.slice;
    let hi = min(params.n, lo + params.slice);
    for (var i = lo + tid; i < hi; i += WG) {
        let v = x[i];
        let k = key_of(v);
        if (r > 0u && (k >> (shift + 4u)) != (st.pre >> (shift + 4u))) {
            continue;
        }
        let b = (k >> shift) & 15u;
        cnt[b] += 1u;
        mas[b] += exp(v - m);
    }
    for (var b = 0u; b < BINS; b++) {
        red_c[tid * BINS + b] = cnt[b];
        red_m[tid * BINS + b] = mas[b];
    }
    workgroupBarrier();
    if (tid < BINS) {
        var c = 0u;
        var s = 0.0;
        for (var t = 0u; t < WG; t++) {
            c += red_c[t * BINS + tid];
            s += red_m[t * BINS + tid];
        }
        let o = hist_at(job, r & 1u, wid.x, tid);
        scratch[o] = c;
        scratch[o + 1u] = bitcast<u32>(s);
    }
}

@compute @workgroup_size(WG)
fn draw(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    touch();
    load_max(tid);
    // The kept prefix: the shorter of top_k's and top_p's (both prefixes of one order).
    var rk = vec4<u32>(0u, NONE, 0u, 0u);
    if (params.use_k != 0u && params.use_p == 0u) {
        decide(0u, 7u, tid);
        if (tid == 0u) {
            rk = finalize(0u);
        }
    } else if (params.use_k != 0u && tid == 0u) {
        rk = vec4<u32>(scratch[RES], scratch[RES + 1u], scratch[RES + 2u], scratch[RES + 3u]);
    }
    var rp = vec4<u32>(0u, NONE, 0u, 0u);
    if (params.use_p != 0u) {
        decide(1u, 7u, tid);
        if (tid == 0u) {
            rp = finalize(1u);
        }
    }
    if (tid == 0u) {
        if (params.use_k == 0u && params.use_p == 0u) {
            sh_cut = vec4<u32>(0u, 0u, 0u, 1u);
        } else if (params.use_p == 0u || (params.use_k != 0u && (rk.x > rp.x || (rk.x == rp.x && rk.y <= rp.y)))) {
            sh_cut = vec4<u32>(rk.x, rk.y, 0u, 0u);
        } else {
            sh_cut = vec4<u32>(rp.x, rp.y, 1u, 0u);
        }
    }
    workgroupBarrier();
    let cut = sh_cut;
    let m = sh_m;
    let lo = wid.x * params.slice;
    let hi = min(params.n, lo + params.slice);
    // Ties at the cut keep the lowest indices: each thread walks a contiguous chunk
    // and knows how many equal values come before it (earlier slices from the last
    // round's histograms, earlier chunks from the workgroup).
    let chunk = (params.slice + WG - 1u) / WG;
    let a = min(hi, lo + tid * chunk);
    let e = min(hi, a + chunk);
    var here = 0u;
    var before = 0u;
    if (cut.w == 0u) {
        for (var i = a; i < e; i++) {
            here += select(0u, 1u, key_of(x[i]) == cut.x);
        }
        for (var s = tid; s < wid.x; s += WG) {
            before += scratch[hist_at(cut.z, 1u, s, cut.x & 15u)];
        }
    }
    sh_rank[tid] = here;
    sh_before[tid] = before;
    workgroupBarrier();
    var rank = 0u;
    if (cut.w == 0u) {
        for (var t = 0u; t < WG; t++) {
            rank += sh_before[t] + select(0u, sh_rank[t], t < tid);
        }
    }
    let floor_v = m + params.min_p_log;
    let row = wid.y;
    let rkey = row_key(state[0] + 1u + row);
    var bv = 0.0;
    var bi = NONE;
    for (var i = a; i < e; i++) {
        let v = x[i];
        let k = key_of(v);
        var keep = cut.w != 0u || k > cut.x || (k == cut.x && rank < cut.y);
        if (k == cut.x) {
            rank += 1u;
        }
        if ((params.has_min_p != 0u && !(v >= floor_v)) || !(v >= -3.4028235e38)) {
            keep = false;  // below min_p, or -inf
        }
        if (keep) {
            let sc = (v - m) * params.inv_temp + gumbel(rkey, i);
            if (bi == NONE || sc > bv) {
                bv = sc;
                bi = i;
            }
        }
    }
    wv[tid] = bv;
    wi[tid] = bi;
    reduce_best(tid);
    if (tid == 0u) {
        let o = dpart_at(row, wid.x);
        scratch[o] = bitcast<u32>(wv[0]);
        scratch[o + 1u] = wi[0];
    }
}

@compute @workgroup_size(WG)
fn merge(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    touch();
    var bv = 0.0;
    var bi = NONE;
    for (var p = tid; p < params.parts; p += WG) {
        let o = dpart_at(wid.x, p);
        let v = bitcast<f32>(scratch[o]);
        let i = scratch[o + 1u];
        if (beats(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    wv[tid] = bv;
    wi[tid] = bi;
    reduce_best(tid);
    if (tid == 0u) {
        out[wid.x] = wi[0];
    }
}

@compute @workgroup_size(1)
fn advance() {
    touch();
    let p = state[0] + 1u;
    seq[p] = out[0];
    state[0] = p;
}
