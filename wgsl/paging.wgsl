// The paged KV cache's addressing (docs/gpu_kernels.md, "Paged KV cache"), for
// kernels that bind `block_table` (the including kernel declares it, and fills
// BS through {{BS}}). A sequence slot s owns blocks_per_seq entries of the table,
// from s * blocks_per_seq; its logical block b (positions b * BS .. + BS) is
// physical block block_table[s * blocks_per_seq + b], so position p of slot s
// lives at cache row block_table[s * blocks_per_seq + p / BS] * BS + p % BS.
// BS is a power of two >= 16.

const BS: u32 = {{BS}}u;

// Cache row of position p of the sequence whose table starts at tb (= slot * blocks_per_seq).
fn cache_row(tb: u32, p: u32) -> u32 {
    return block_table[tb + p / BS] * BS + p % BS;
}

// The first position past p's block, capped at e: positions p .. block_end(p, e)
// have consecutive cache rows (one table read for the run).
fn block_end(p: u32, e: u32) -> u32 {
    return min(e, (p / BS + 1u) * BS);
}
