// Arg-max reductions shared by argmax.wgsl, sample.wgsl and sample_topk.wgsl:
// (value, id) pairs where an empty slot (id NONE) never wins and equal values
// keep the lower id, as numpy's argmax. The including kernel declares
// `const WG`, `const NONE`, `best_v: array<f32, WG>`, `best_i: array<u32, WG>`
// in workgroup memory, and the values `x`.

// Does (ov, oi) beat (mv, mi)?
fn beats(ov: f32, oi: u32, mv: f32, mi: u32) -> bool {
    return oi != NONE && (mi == NONE || ov > mv || (ov == mv && oi < mi));
}

// Merge the workgroup's candidates (written to best_v / best_i); the winner
// ends in slot 0. Call in uniform control flow.
fn reduce_best(tid: u32) {
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (tid < stride && beats(best_v[tid + stride], best_i[tid + stride], best_v[tid], best_i[tid])) {
            best_v[tid] = best_v[tid + stride];
            best_i[tid] = best_i[tid + stride];
        }
        workgroupBarrier();
    }
}

// The largest of x[base + lo .. base + hi) and its lowest index (counted from base) into
// best_v[0] / best_i[0]: a slice maximum (argmax's first pass, the sampler's slice_max).
fn best_of_slice(base: u32, lo: u32, hi: u32, tid: u32) {
    var bv = -3.4028234663852886e38;
    var bi = NONE;
    // Increasing index order within an invocation, so a strict > keeps its first maximum.
    for (var i = lo + tid; i < hi; i += WG) {
        let v = x[base + i];
        if (v > bv || bi == NONE) {
            bv = v;
            bi = i;
        }
    }
    best_v[tid] = bv;
    best_i[tid] = bi;
    reduce_best(tid);
}
