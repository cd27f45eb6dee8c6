// End of a decode step, on the GPU: log the token argmax or the sampler wrote
// into ids[0] and advance the positions, so the next step's embedding, rope, KV
// store and attention read them without a round trip to the host.
// state: [0] position of row 0's token (the sampler's context length - 1),
// [1] live rows n, [2] tokens logged. rows: [2t] position of row t, [2t + 1] its
// sequence slot; every live row moves to its next position, slots stay.
//   main     (decode_greedy): token_log[state[2]] = ids[0], state[2] += 1
//   context  (the sampling loop, infr/gpu/decode.py): seq[state[0] + 1] = ids[0]
//   batch    (the engine's multi-step decode): token_log[state[2] + t] = ids[t] for each live
//            row t, state[2] += state[1]

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
fn main() {
    let n = state[2];
    token_log[n] = ids[0];
    state[2] = n + 1u;
    advance();
}

@compute @workgroup_size(1)
fn context() {
    token_log[state[0] + 1u] = ids[0];
    advance();
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
