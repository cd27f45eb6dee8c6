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
// Entry points and dispatches (all share one bind group layout; z: the step's S slots):
//   penalize  (1,1,S)        repeat/presence/frequency penalties in place on x
//   slice_max (parts,1,S)    each slice's (max, lowest index) at scratch[PMAX]
//   radix     (parts,1,S)    one radix round of job step.job (0 top_k, 1 top_p)
//   draw      (parts,rows,S) per-slice Gumbel winner of each row
//   merge     (rows,1,S)     out[out_off + row] = the winner
// Row r draws for position state[pos_at] + 1 + r; the logits are x[x_off ..], so a step's
// output rows each sample their own row of one logits buffer (kernels_sample.StepSampling).
// With top_k on (k <= CAND_MAX) sample_topk.wgsl runs the chain instead, in 6 dispatches.
// Barriers sit under branches on the slot's settings: uniform per workgroup (the slot is
// workgroup_id.z), which naga accepts; a stricter compiler (Tint) would want them read from
// `slots` directly.


// #include sample_common

const WG: u32 = 64u;
const BINS: u32 = 16u;

var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;
var<workgroup> red_c: array<u32, 1024>;  // WG * BINS
var<workgroup> red_m: array<f32, 1024>;
var<workgroup> bin_c: array<u32, BINS>;
var<workgroup> bin_m: array<f32, BINS>;
var<workgroup> sh_st: St;
var<workgroup> sh_m: f32;
var<workgroup> sh_cut: vec4<u32>;  // (v, c, job, all kept)
var<workgroup> sh_rank: array<u32, WG>;
var<workgroup> sh_before: array<u32, WG>;

// The best of the per-slice (value bits, index) pairs at scratch[base + 2 p],
// p < parts, into best_v[0] / best_i[0].
fn best_of_parts(base: u32, tid: u32) {
    var bv = 0.0;
    var bi = NONE;
    for (var p = tid; p < params.parts; p += WG) {
        let v = bitcast<f32>(scratch[params.scratch_off + base + 2u * p]);
        let i = scratch[params.scratch_off + base + 2u * p + 1u];
        if (beats(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    best_v[tid] = bv;
    best_i[tid] = bi;
    reduce_best(tid);
}

// The maximum of x (merged from the slice maxima, all threads at once) into sh_m.
fn load_max(tid: u32) {
    best_of_parts(PMAX, tid);
    if (tid == 0u) {
        sh_m = best_v[0];
    }
    workgroupBarrier();
}

// and take the bin, from the top, where the count or mass is reached.
fn decide(job: u32, rp: u32, tid: u32) {
    let par = rp & 1u;
    // Thread t sums bin t % 16 over every (WG / 16)-th slice from t / 16; the partial sums
    // are then added in a fixed order, so the totals are the same on every run.
    var c = 0u;
    var m = 0.0;
    for (var s = tid / BINS; s < params.parts; s += WG / BINS) {
        let o = hist_at(job, par, s, tid % BINS);
        c += scratch[params.scratch_off + o];
        m += bitcast<f32>(scratch[params.scratch_off + o + 1u]);
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
                total = bitcast<f32>(scratch[params.scratch_off + RES + 3u]);  // mass of the top_k prefix
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
fn penalize(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    touch();
    if (!enter(wid.z, PATH_PEN)) {
        return;
    }
    let len = pos() + 1u;  // tokens in the context: positions 0 ..= pos()
    var lo = 0u;
    if (params.pen_n != NONE && len > params.pen_n) {
        lo = len - params.pen_n;
    }
    for (var i = lo + tid; i < len; i += WG) {
        let t = seq[params.seq_off + i];
        var first = true;
        for (var j = lo; j < i; j++) {
            if (seq[params.seq_off + j] == t) {
                first = false;
                break;
            }
        }
        if (!first || t >= params.n) {
            continue;  // each distinct token once, by its first occurrence in the window
        }
        var cnt = 1u;
        for (var j = i + 1u; j < len; j++) {
            cnt += select(0u, 1u, seq[params.seq_off + j] == t);
        }
        var v = xv(t);
        if (params.rep != 1.0) {
            v = select(v * params.rep_inv, v * params.rep, v <= 0.0);
        }
        x[params.x_off + t] = v - (f32(cnt) * params.freq + params.pres);
    }
}

// The slice maxima: scratch[PMAX + 2 s] = (max bits, lowest index of it) of slice s, as
// argmax.wgsl's first pass computes them.
@compute @workgroup_size(WG)
fn slice_max(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    touch();
    if (!enter(wid.z, PATH_FULL)) {
        return;
    }
    let lo = wid.x * params.slice;
    best_of_slice(params.x_off, lo, min(params.n, lo + params.slice), tid);
    if (tid == 0u) {
        scratch[params.scratch_off + PMAX + 2u * wid.x] = bitcast<u32>(best_v[0]);
        scratch[params.scratch_off + PMAX + 2u * wid.x + 1u] = best_i[0];
    }
}

@compute @workgroup_size(WG)
fn radix(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    touch();
    if (!enter(wid.z, PATH_FULL) || (step.job == 0u && slots[wid.z].use_k == 0u) || (step.job == 1u && slots[wid.z].use_p == 0u)) {
        return;
    }
    load_max(tid);
    let job = step.job;
    let r = step.round;
    if (job == 1u && r == 0u && slots[wid.z].use_k != 0u) {  // top_k's last round ended: its result
        decide(0u, 7u, tid);
        if (tid == 0u && wid.x == 0u) {
            let res = finalize(0u);
            for (var f = 0u; f < 4u; f++) {
                scratch[params.scratch_off + RES + f] = res[f];
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
        let v = xv(i);
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
        scratch[params.scratch_off + o] = c;
        scratch[params.scratch_off + o + 1u] = bitcast<u32>(s);
    }
}

@compute @workgroup_size(WG)
fn draw(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    touch();
    if (!enter(wid.z, PATH_FULL)) {
        return;
    }
    load_max(tid);
    // The kept prefix: the shorter of top_k's and top_p's (both prefixes of one order).
    var rk = vec4<u32>(0u, NONE, 0u, 0u);
    if (slots[wid.z].use_k != 0u && slots[wid.z].use_p == 0u) {
        decide(0u, 7u, tid);
        if (tid == 0u) {
            rk = finalize(0u);
        }
    } else if (slots[wid.z].use_k != 0u && tid == 0u) {
        rk = vec4<u32>(scratch[params.scratch_off + RES], scratch[params.scratch_off + RES + 1u], scratch[params.scratch_off + RES + 2u], scratch[params.scratch_off + RES + 3u]);
    }
    var rp = vec4<u32>(0u, NONE, 0u, 0u);
    if (slots[wid.z].use_p != 0u) {
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
    // Each thread knows how many ties come before its run (earlier slices from
    // the last round's histograms, earlier runs from the workgroup).
    let run = tie_run(lo, hi, tid, WG, cut.x);
    let a = run.x;
    let e = run.y;
    var here = 0u;
    var before = 0u;
    if (cut.w == 0u) {
        here = run.z;
        for (var s = tid; s < wid.x; s += WG) {
            before += scratch[params.scratch_off + hist_at(cut.z, 1u, s, cut.x & 15u)];
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
    let rkey = row_key(pos() + 1u + row);
    var bv = 0.0;
    var bi = NONE;
    for (var i = a; i < e; i++) {
        let v = xv(i);
        let k = key_of(v);
        var keep = cut.w != 0u || k > cut.x || (k == cut.x && rank < cut.y);
        if (k == cut.x) {
            rank += 1u;
        }
        if ((params.has_min_p != 0u && !(v >= floor_v)) || !(v >= -3.4028234663852886e38)) {
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
    best_v[tid] = bv;
    best_i[tid] = bi;
    reduce_best(tid);
    if (tid == 0u) {
        let o = dpart_at(row, wid.x);
        scratch[params.scratch_off + o] = bitcast<u32>(best_v[0]);
        scratch[params.scratch_off + o + 1u] = best_i[0];
    }
}

@compute @workgroup_size(WG)
fn merge(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    touch();
    if (!enter(wid.z, PATH_FULL)) {
        return;
    }
    best_of_parts(dpart_at(wid.x, 0u), tid);
    if (tid == 0u) {
        out[params.out_off + wid.x] = best_i[0];
    }
}
