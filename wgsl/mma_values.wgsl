// What gemm_mma.wgsl's weight tile and mma_dequant.wgsl's f16 rows share: the f16 values of staged
// int8 lanes (the same arithmetic, so the same bits either way): values k .. k + 8 (k % 8 == 0)
// of a stage, from q4, the vec4 holding values [16 hf, 16 hf + 16) of their sub-block (hf = (k % 32)
// / 16), and s, that sub-block's scale terms: a q + b per value (a the sub-block's scale, or its
// 16-value half's with SCALE16; b its min term), each rounded to f16.

fn values8(q4: vec4<u32>, s: vec2<f32>, k: u32) -> array<vec4<f16>, 2> {
    let hf = (k % 32u) / 16u;
    let j = (k % 16u) / 4u;  // the first of two words
    let qa = vec4<f32>(unpack4xI8(q4[j]));
    let qb = vec4<f32>(unpack4xI8(q4[j + 1u]));
    var a = s.x;
    var b = vec4<f32>(0.0);
    if (SCALE16) {
        a = select(s.x, s.y, hf == 1u);
    } else if (MIN_TERM) {
        b = vec4<f32>(s.y);
    }
    return array<vec4<f16>, 2>(vec4<f16>(fma(vec4<f32>(a), qa, b)), vec4<f16>(fma(vec4<f32>(a), qb, b)));
}

// The f16 row a staged row rho of the tile at `first` is copied to / from (mma_dequant's output,
// gemm_mma's WCOPY input): a pair's up rows follow its gate rows, each half padded to 128 rows.
fn f16_row(rho: u32, first: u32) -> u32 {
    if (PAIR && rho >= BN / 2u) {
        return (params.N + 127u) / 128u * 128u + first + rho - BN / 2u;
    }
    return first + rho;
}
