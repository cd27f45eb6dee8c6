// Index of the largest of x[0..n) into out[0]; ties go to the lowest index,
// as numpy's argmax. Two dispatches: `partial` with one workgroup per slice of
// `per` values, dispatch (parts, rows, 1), writes each slice's (value, index) to
// `best`; `merge` with one workgroup per row, dispatch (1, rows, 1), reduces the
// parts. Row r (workgroup_id.y) is x[r n .. r n + n) into out[r] (a step's output
// rows). One workgroup alone walks a 128k vocabulary in ~180 µs on an H200;
// split, both take a few.

struct Params {
    n: u32,
    per: u32,    // values per slice (partial)
    parts: u32,  // slices (final)
}

const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> best: array<vec2<u32>>;  // (value bits, index) per slice
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;

// #include best_common

@compute @workgroup_size(WG)
fn partial(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    _ = out[0];  // both entry points use every binding: one bind group layout serves both
    let lo = wid.x * params.per;
    let hi = min(params.n, lo + params.per);
    best_of_slice(wid.y * params.n, lo, hi, tid);
    if (tid == 0u) {
        best[wid.y * params.parts + wid.x] = vec2<u32>(bitcast<u32>(best_v[0]), best_i[0]);
    }
}

@compute @workgroup_size(WG)
fn merge(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    _ = x[0];
    var bv = -3.4028234663852886e38;
    var bi = NONE;
    for (var p = tid; p < params.parts; p += WG) {
        let c = best[wid.y * params.parts + p];
        let v = bitcast<f32>(c.x);
        if (beats(v, c.y, bv, bi)) {
            bv = v;
            bi = c.y;
        }
    }
    best_v[tid] = bv;
    best_i[tid] = bi;
    reduce_best(tid);
    if (tid == 0u) {
        out[wid.y] = best_i[0];
    }
}
