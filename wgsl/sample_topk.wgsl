// Sampling when top_k is on (k <= CAND_MAX): llama.cpp's default chain
// (top_k 40, top_p 0.95, min_p 0.05) in 6 dispatches instead of sample.wgsl's
// 19. top_p and min_p only ever look inside the top_k set, so the whole
// vocabulary is scanned just to find that set; the k survivors are then sorted
// in one workgroup, where top_p's running mass is a prefix sum.
//
//   radix8   (parts,1,1)  4 rounds of an 8-bit radix select of the k-th largest
//                         key (counts only: top_k needs no mass), per-slice
//                         histograms counted with workgroup atomics
//   collect  (parts,1,1)  the k kept tokens (ties at the cut: lowest ids first,
//                         ranked through the last round's per-slice counts) into
//                         the candidate list, slots taken with an atomic counter
//   pick     (rows,1,1)   sort the candidates (bitonic: descending value, ties by
//                         id), top_p over their mass, min_p, then the Gumbel-max draw
//
// The kept set and the draw are sample.wgsl's (and the twin's, infr/cpu/sample.py):
// the same keys, the same noise, the same score (x - max) / T + g, ties to the lower id.

// #include sample_common

const WG: u32 = 256u;
const H: u32 = 256u;  // bins per round

var<workgroup> h8: array<atomic<u32>, H>;
var<workgroup> scan_a: array<u32, WG>;
var<workgroup> scan_b: array<u32, WG>;
var<workgroup> sh_st: St;
var<workgroup> sh_n: u32;
var<workgroup> sh_len: atomic<u32>;
var<workgroup> c_key: array<u32, CAND_MAX>;
var<workgroup> c_idx: array<u32, CAND_MAX>;
var<workgroup> c_cum: array<f32, CAND_MAX>;
var<workgroup> part_f: array<f32, WG>;
var<workgroup> sh_total: f32;
var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;

// Inclusive prefix sum of one u32 per invocation (uniform control flow).
fn scan_u32(tid: u32, v: u32) -> u32 {
    scan_a[tid] = v;
    workgroupBarrier();
    var from_a = true;
    for (var off = 1u; off < WG; off <<= 1u) {
        if (from_a) {
            scan_b[tid] = scan_a[tid] + select(0u, scan_a[max(tid, off) - off], tid >= off);
        } else {
            scan_a[tid] = scan_b[tid] + select(0u, scan_b[max(tid, off) - off], tid >= off);
        }
        from_a = !from_a;
        workgroupBarrier();
    }
    let r = select(scan_a[tid], scan_b[tid], !from_a);
    workgroupBarrier();
    return r;
}

// The state after round rp (into sh_st): merge that round's per-slice counts
// and take the bin, from the top, where the count reaches top_k. Invocation
// tid looks after bin 255 - tid, so a prefix sum gives the counts above.
fn decide8(rp: u32, tid: u32) {
    let st = load_state(0u, rp);
    let b = H - 1u - tid;
    var c = 0u;
    for (var s = 0u; s < params.parts; s++) {
        c += scratch[params.scratch_off + h8_at(rp & 1u, s, b)];
    }
    if (tid == 0u) {  // never kept: a count that misses top_k (impossible) keeps the lowest bin
        sh_st = St(st.pre, st.acc_c, 0.0, 0.0, 0u);
    }
    let incl = scan_u32(tid, c);  // values in bins >= b (after the barriers inside)
    let k = params.top_k;
    if (c > 0u && st.acc_c + incl - c < k && st.acc_c + incl >= k) {
        sh_st = St(st.pre | (b << (24u - 8u * rp)), st.acc_c + incl - c, 0.0, 0.0, c);
    }
    workgroupBarrier();
}

// After decide8(3): the cut key v and how many of its ties are kept.
fn cut8() -> vec2<u32> {
    let st = sh_st;
    return vec2<u32>(st.pre, clamp(params.top_k - st.acc_c, 1u, max(st.eq_c, 1u)));
}

@compute @workgroup_size(WG)
fn radix8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    touch();
    if (!enter(wid.z, PATH_TOPK)) {
        return;
    }
    let r = step.round;
    atomicStore(&h8[tid], 0u);
    var st = St(0u, 0u, 0.0, 0.0, 0u);
    if (r > 0u) {
        decide8(r - 1u, tid);
        st = sh_st;
        if (tid == 0u && wid.x == 0u) {
            store_state(0u, r, st);
        }
    } else if (tid == 0u && wid.x == 0u) {
        atomicStore(&counter[params.slot], 0u);  // collect's slots, taken afresh every step
    }
    workgroupBarrier();
    let shift = 24u - 8u * r;
    let lo = wid.x * params.slice;
    let hi = min(params.n, lo + params.slice);
    for (var i = lo + tid; i < hi; i += WG) {
        let k = key_of(xv(i));
        if (r > 0u && (k >> (shift + 8u)) != (st.pre >> (shift + 8u))) {
            continue;
        }
        atomicAdd(&h8[(k >> shift) & 255u], 1u);
    }
    workgroupBarrier();
    scratch[params.scratch_off + h8_at(r & 1u, wid.x, tid)] = atomicLoad(&h8[tid]);
}

@compute @workgroup_size(WG)
fn collect(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    touch();
    if (!enter(wid.z, PATH_TOPK)) {
        return;
    }
    decide8(3u, tid);
    let cut = cut8();
    let lo = wid.x * params.slice;
    let hi = min(params.n, lo + params.slice);
    // The ties before this invocation's run: earlier slices from the last
    // round's counts, earlier runs by a prefix sum.
    let run = tie_run(lo, hi, tid, WG, cut.x);
    let a = run.x;
    let e = run.y;
    var rank = scan_u32(tid, run.z) - run.z;
    for (var s = 0u; s < wid.x; s++) {  // round 3 (parity 1) counted each slice's ties
        rank += scratch[params.scratch_off + h8_at(1u, s, cut.x & 255u)];
    }
    for (var i = a; i < e; i++) {
        let k = key_of(xv(i));
        var keep = k > cut.x;
        if (k == cut.x) {
            keep = rank < cut.y;
            rank += 1u;
        }
        if (keep) {
            let slot = atomicAdd(&counter[params.slot], 1u);
            if (slot < CAND_MAX) {
                scratch[params.scratch_off + cand_at(slot)] = bitcast<u32>(xv(i));
                scratch[params.scratch_off + cand_at(slot) + 1u] = i;
            }
        }
    }
}

// Loads the candidates (sh_n of them, padded to a power of two with empty
// slots that sort last) and sorts them: descending key, ties by lower id.
fn before_c(a: u32, b: u32) -> bool {
    let ia = c_idx[a];
    let ib = c_idx[b];
    return ia != NONE && (ib == NONE || c_key[a] > c_key[b] || (c_key[a] == c_key[b] && ia < ib));
}

fn sort_candidates(tid: u32) -> u32 {
    if (tid == 0u) {
        sh_n = min(atomicLoad(&counter[params.slot]), CAND_MAX);
    }
    let n = workgroupUniformLoad(&sh_n);
    var n2 = 2u;
    while (n2 < n) {
        n2 <<= 1u;
    }
    for (var i = tid; i < n2; i += WG) {
        if (i < n) {
            c_key[i] = key_of(bitcast<f32>(scratch[params.scratch_off + cand_at(i)]));
            c_idx[i] = scratch[params.scratch_off + cand_at(i) + 1u];
        } else {
            c_key[i] = 0u;
            c_idx[i] = NONE;
        }
    }
    workgroupBarrier();
    for (var k = 2u; k <= n2; k <<= 1u) {
        for (var j = k >> 1u; j > 0u; j >>= 1u) {
            for (var i = tid; i < n2; i += WG) {
                let l = i ^ j;
                if (l > i) {
                    let swap = select(before_c(i, l), before_c(l, i), (i & k) == 0u);
                    if (swap) {
                        let tk = c_key[i];
                        let ti = c_idx[i];
                        c_key[i] = c_key[l];
                        c_idx[i] = c_idx[l];
                        c_key[l] = tk;
                        c_idx[l] = ti;
                    }
                }
            }
            workgroupBarrier();
        }
    }
    return n;
}

@compute @workgroup_size(WG)
fn pick(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    touch();
    if (!enter(wid.z, PATH_TOPK)) {
        return;
    }
    let n = sort_candidates(tid);
    let m = value_of(c_key[0]);  // the largest logit: top_k keeps it
    // top_p: the shortest prefix whose mass exp(x - m) reaches top_p of the k
    // tokens' mass. Each invocation owns a contiguous run of the sorted list.
    let per = (n + WG - 1u) / WG;
    let a = min(n, tid * per);
    let e = min(n, a + per);
    var run = 0.0;
    for (var i = a; i < e; i++) {
        run += exp(value_of(c_key[i]) - m);
        c_cum[i] = run;
    }
    part_f[tid] = run;
    workgroupBarrier();
    var off = 0.0;  // mass of the runs before this one, in a fixed order
    for (var t = 0u; t < tid; t++) {
        off += part_f[t];
    }
    if (tid == WG - 1u) {
        sh_total = off + run;
    }
    if (tid == 0u) {
        atomicStore(&sh_len, 0u);
    }
    workgroupBarrier();
    let need = params.top_p * sh_total;
    var below = 0u;  // tokens whose running mass stays under top_p's target
    for (var i = a; i < e; i++) {
        below += select(0u, 1u, off + c_cum[i] < need);
    }
    atomicAdd(&sh_len, below);
    workgroupBarrier();
    var len = n;
    if (params.use_p != 0u) {
        len = min(n, atomicLoad(&sh_len) + 1u);
    }
    let floor_v = m + params.min_p_log;
    let rkey = row_key(pos() + 1u + wid.x);
    var bv = 0.0;
    var bi = NONE;
    for (var i = a; i < min(e, len); i++) {
        let v = value_of(c_key[i]);
        let id = c_idx[i];
        if ((params.has_min_p != 0u && !(v >= floor_v)) || !(v >= -3.4028234663852886e38)) {
            continue;  // below min_p, or -inf
        }
        let sc = (v - m) * params.inv_temp + gumbel(rkey, id);
        if (beats(sc, id, bv, bi)) {
            bv = sc;
            bi = id;
        }
    }
    best_v[tid] = bv;
    best_i[tid] = bi;
    reduce_best(tid);
    if (tid == 0u) {
        out[params.out_off + wid.x] = best_i[0];
    }
}
