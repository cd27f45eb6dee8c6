// The (token, slot) pairs grouped by expert for the batched expert GEMM (llama.cpp's MUL_MAT_ID
// idea; kernels_moe): per expert a count, then the pairs in expert order (`order`; within an
// expert in any order: each output row is computed alone, so its place changes nothing), and the
// tile list: tiles[i] = (expert, first index in order, pairs <= BT, 0), zeros past the last.
// One workgroup: counts by atomics, the offsets and tiles by one invocation (n_expert steps),
// the scatter by atomics again. dispatch (1, 1, 1).

struct Params {
    E: u32,          // experts
    A: u32,          // pairs
    BT: u32,         // pairs per tile at most
    max_tiles: u32,  // the tile list's length: ceil(A / BT) + E bounds it
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> cursor: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read_write> order: array<u32>;
@group(0) @binding(4) var<storage, read_write> tiles: array<vec4<u32>>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) tid: u32) {
    for (var e = tid; e < params.E; e += WG) {
        atomicStore(&cursor[e], 0u);
    }
    storageBarrier();
    for (var a = tid; a < params.A; a += WG) {
        atomicAdd(&cursor[ids[a]], 1u);
    }
    storageBarrier();
    if (tid == 0u) {
        var off = 0u;
        var n = 0u;
        for (var e = 0u; e < params.E; e++) {
            let c = atomicLoad(&cursor[e]);
            atomicStore(&cursor[e], off);  // from now on: where the expert's next pair goes
            for (var s = 0u; s < c; s += params.BT) {
                tiles[n] = vec4<u32>(e, off + s, min(params.BT, c - s), 0u);
                n++;
            }
            off += c;
        }
        for (; n < params.max_tiles; n++) {
            tiles[n] = vec4<u32>(0u);
        }
    }
    storageBarrier();
    for (var a = tid; a < params.A; a += WG) {
        order[atomicAdd(&cursor[ids[a]], 1u)] = a;
    }
}
