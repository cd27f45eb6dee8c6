// The chunked delta rule's row index (deltanet_chunk_intra.wgsl, deltanet_chunk_state.wgsl): each
// slot's live rows in batch order (= its position order: RecurrentStates.check_rows), so the
// chunk kernels can take C consecutive rows of one slot however the batch interleaves slots.
// idx = [count of each slot (n_slots)] then [n_slots][cap] row ids. One workgroup per slot,
// scanning the rows WG at a time (a flag per row, a workgroup prefix sum: its slot among them).
// Dispatch (n_slots, 1, 1).

struct Params {
    cap: u32,  // rows of the dispatch (the index's stride per slot)
    n_slots: u32,
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> live: array<u32>;  // [1] live rows
@group(0) @binding(2) var<storage, read> rows: array<u32>;  // [2t] position, [2t + 1] slot
@group(0) @binding(3) var<storage, read_write> idx: array<u32>;

var<workgroup> scan: array<u32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let slot = wid.x;
    let n = min(live[1], params.cap);
    var count = 0u;
    for (var b = 0u; b < n; b += WG) {
        let t = b + tid;
        let f = select(0u, 1u, t < n && rows[2u * min(t, n - 1u) + 1u] == slot);
        scan[tid] = f;
        workgroupBarrier();
        for (var off = 1u; off < WG; off <<= 1u) {  // Hillis-Steele inclusive sum
            var x = 0u;
            if (tid >= off) {
                x = scan[tid - off];
            }
            workgroupBarrier();
            scan[tid] += x;
            workgroupBarrier();
        }
        if (f == 1u) {
            idx[params.n_slots + slot * params.cap + count + scan[tid] - 1u] = t;
        }
        count += scan[WG - 1u];
        workgroupBarrier();  // every read of scan done before the next block writes it
    }
    if (tid == 0u) {
        idx[slot] = count;
    }
}
