// gemm_mma.wgsl's WVEC (tile field WC 2): the weight tile copied from mma_dequant.wgsl's f16 rows
// (binding 13 as vec4 words), the invocation's 8-value groups of a stage fetched into registers a
// stage ahead and stored into wh as f16 values in B. On an H100 this ran at 149 against 80 TOPS for
// subgroup matrix loads from the rows and matrix stores (WC 1).

@group(0) @binding(13) var<storage, read> w16v: array<vec4<u32>>;

const NWA: u32 = NW;

fn wvec_fetch(k0: u32, tid: u32, first: u32) -> array<vec4<u32>, NWA> {
    var w: array<vec4<u32>, NWA>;
    for (var n = 0u; n < NW; n++) {
        let i = tid + n * WG;
        if (i < BN * KS / 8u) {
            w[n] = w16v[(f16_row(i / (KS / 8u), first) * params.K + k0) / 8u + i % (KS / 8u)];
        }
    }
    return w;
}

fn wvec_put(w: array<vec4<u32>, NWA>, tid: u32) {
    for (var n = 0u; n < NW; n++) {
        let i = tid + n * WG;
        if (i < BN * KS / 8u) {
            let o = (i / (KS / 8u)) * LD + 8u * (i % (KS / 8u));
            for (var c = 0u; c < 4u; c++) {
                let h = bitcast<vec2<f16>>(w[n][c]);
                wh[o + 2u * c] = h.x;
                wh[o + 2u * c + 1u] = h.y;
            }
        }
    }
}
