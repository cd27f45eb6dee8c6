// End of a decode step, on the GPU (GPUBackend.decode_steps): log the tokens the argmax or
// the samplers wrote into ids and advance the positions, so the next step's embedding, rope,
// KV store, attention and samplers read them without a round trip to the host.
// state: [0] position of row 0's token, [1] live rows n, [2] tokens logged. rows: [2t]
// position of row t, [2t + 1] its sequence slot; every live row moves to its next position,
// slots stay: token_log[state[2] + t] = ids[t] for each live row t, state[2] += state[1].

@group(0) @binding(0) var<storage, read> ids: array<u32>;
@group(0) @binding(1) var<storage, read_write> state: array<u32>;
@group(0) @binding(2) var<storage, read_write> token_log: array<u32>;
@group(0) @binding(3) var<storage, read_write> rows: array<u32>;

fn advance() {
    state[0] = state[0] + 1u;
    for (var t = 0u; t < state[1]; t++) {
        rows[2u * t] = rows[2u * t] + 1u;
    }
}

@compute @workgroup_size(1)
fn batch() {
    let n = state[2];
    let live = state[1];
    for (var t = 0u; t < live; t++) {
        token_log[n + t] = ids[t];
    }
    state[2] = n + live;
    advance();
}
