// End of a greedy decode step, on the GPU: append the token argmax wrote into
// ids[0] to the token log and advance the position, so the next step's
// embedding and rope read them without a round trip to the host.
// state: [0] position of the batch's first token, [1] T, [2] tokens logged.

@group(0) @binding(0) var<storage, read> ids: array<u32>;
@group(0) @binding(1) var<storage, read_write> state: array<u32>;
@group(0) @binding(2) var<storage, read_write> token_log: array<u32>;

@compute @workgroup_size(1)
fn main() {
    let n = state[2];
    token_log[n] = ids[0];
    state[0] = state[0] + 1u;
    state[2] = n + 1u;
}
