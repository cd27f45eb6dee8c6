// gemm_mma.wgsl's WVEC (tile field WC 2): the weight tile's words come from mma_dequant.wgsl's f16
// rows (binding 13 as vec4 words of 8 values); gemm_mma's vec_fetch / vec_put copy them a stage
// ahead into registers and then into wh. On an H100 this ran at 149 against 80 TOPS for subgroup
// matrix loads from the rows and matrix stores (WC 1).

@group(0) @binding(13) var<storage, read> w16v: array<vec4<u32>>;

// Word i (of BN * KS / 8, [row][8 values]) of the stage at value k0.
fn w_word(i: u32, k0: u32, first: u32) -> vec4<u32> {
    return w16v[(f16_row(i / (KS / 8u), first) * params.K + k0) / 8u + i % (KS / 8u)];
}
