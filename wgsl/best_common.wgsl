// Arg-max reductions shared by argmax.wgsl, sample.wgsl and sample_topk.wgsl:
// (value, id) pairs where an empty slot (id NONE) never wins and equal values
// keep the lower id, as numpy's argmax. The including kernel declares
// `const WG`, `const NONE` and `best_v: array<f32, WG>`, `best_i: array<u32, WG>`
// in workgroup memory.

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
