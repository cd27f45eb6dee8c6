// Expert tiles of gemm_mmq.wgsl (MUL_MAT_ID: kernels_moe's grouped path). moe_group.wgsl sorted
// the (token, slot) pairs by expert into `order` and cut each expert's run into tiles of at most
// BT pairs: tiles[y] = (expert, first index in order, pairs, 0), pairs 0 past the last tile. A
// tile multiplies its expert's rows (this binding holds experts e0 .. e0 + count, `stride`
// bytes apart; slot 1, the pair's up rows, at base2 / stride2) by its pairs' x rows (pair a
// reads row a / x_div) and stores output row a. Tile and experts are read-only or uniform at a
// uniform index, so tile_skip is uniform (barriers follow).

// #include expert_params
@group(0) @binding(9) var<storage, read> order: array<u32>;
@group(0) @binding(10) var<storage, read> tiles: array<vec4<u32>>;

const NO_TOKEN: u32 = 0xFFFFFFFFu;

var<private> tile: vec4<u32>;  // this workgroup's tiles[y] (tile_tok0)

fn tile_skip(y: u32) -> bool {
    let tl = tiles[y];
    return tl.z == 0u || tl.x < experts.e0 || tl.x >= experts.e0 + experts.count;
}

fn tile_tok0(y: u32) -> u32 {
    tile = tiles[y];
    return tile.y;
}

fn x_tok(tok0: u32, tau: u32) -> u32 {
    return order[tok0 + min(tau, tile.z - 1u)] / experts.x_div;
}

fn out_tok(tok0: u32, tau: u32) -> u32 {
    return select(NO_TOKEN, order[tok0 + min(tau, tile.z - 1u)], tau < tile.z);
}

fn expert_byte(slot: u32) -> u32 {
    let e = tile.x - experts.e0;
    if (slot == 1u) {
        return experts.base2 + e * experts.stride2;
    }
    return experts.base + e * experts.stride;
}
