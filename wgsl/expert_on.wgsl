// An expert bank (gemv.wgsl, matmul.wgsl): the binding holds experts e0 .. e0 + count of an
// [n_expert, out, in] bank, `stride` bytes apart. The kernel's token index is a (token, slot)
// pair a = t * n_used + s whose expert the router wrote in ids[a] (kernels_moe); its rows start
// at that expert's bytes (slot 1: the pair's second matrix, base2 / stride2, which a fused
// gate_up bank sets to its up rows). x row a / x_div: n_used pairs share their token's input,
// or each pair has its own (the input scaled by its weight, llama4; the down projection).
// ids is read-only and a is the workgroup's, so expert_skip is uniform (barriers follow).

// #include expert_params
@group(0) @binding(9) var<storage, read> ids: array<u32>;

// Pairs whose expert another binding holds (a bank split by expert ranges) leave at once.
fn expert_skip(a: u32) -> bool {
    let e = ids[a];
    return e < experts.e0 || e >= experts.e0 + experts.count;
}

fn expert_byte(slot: u32, a: u32) -> u32 {
    let e = ids[a] - experts.e0;
    if (slot == 1u) {
        return experts.base2 + e * experts.stride2;
    }
    return experts.base + e * experts.stride;
}

fn x_token(a: u32) -> u32 {
    return a / experts.x_div;
}
