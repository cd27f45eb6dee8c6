// The end of a row's RMS as the norm kernels share it: each invocation's partial sum of squares `s` added
// up a tree over the workgroup's WG invocations (this order in every includer, so fused and unfused norms
// give the same floats), then 1 / sqrt(mean + eps) over n values. Needs a workgroup array `partial` of WG
// floats, WG a power of two; uniform control flow (barriers). It begins with a barrier: an includer may
// still be reading partial[0] of an earlier sum.

fn rms_tree(s: f32, tid: u32, n: u32, eps: f32) -> f32 {
    workgroupBarrier();
    partial[tid] = s;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (tid < stride) {
            partial[tid] += partial[tid + stride];
        }
        workgroupBarrier();
    }
    // Same expression shape as the reference: x * (1 / sqrt(ms + eps)) * g.
    return 1.0 / sqrt(partial[0] / f32(n) + eps);
}
