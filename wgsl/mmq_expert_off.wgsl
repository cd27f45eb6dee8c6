// Dense tiles of gemm_mmq.wgsl: tile y covers tokens y * BT .. y * BT + BT of the batch.

// #include mmq_expert_none

const NO_TOKEN: u32 = 0xFFFFFFFFu;

fn tile_skip(y: u32) -> bool {
    return false;
}

fn tile_tok0(y: u32) -> u32 {
    return y * BT;
}

// The x row of the tile's token tau (tokens past T read token T - 1 and are not stored).
fn x_tok(tok0: u32, tau: u32) -> u32 {
    return min(tok0 + tau, params.T - 1u);
}

// The output row of token tau, NO_TOKEN past the batch.
fn out_tok(tok0: u32, tau: u32) -> u32 {
    return select(NO_TOKEN, tok0 + tau, tok0 + tau < params.T);
}
