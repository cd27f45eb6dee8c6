// The experts' sum of one value, shared by moe_combine.wgsl's combine and moe_combine_norms.wgsl: the
// including kernel binds src (each pair's row of D values), wts, scales and ids, and its params have
// D, K (n_used), weighted and scaled.

// Value c of token t's sum over its K pairs in selection order: each pair's value times its expert's
// scale (scaled: gemma4), then its router weight (weighted: the weight after the expert).
fn pair_sum(t: u32, c: u32) -> f32 {
    var acc = 0.0;
    for (var s = 0u; s < params.K; s++) {
        let a = t * params.K + s;
        var v = src[a * params.D + c];
        if (params.scaled != 0u) {
            v = v * scales[ids[a]];
        }
        if (params.weighted != 0u) {
            v = v * wts[a];
        }
        acc += v;
    }
    return acc;
}
