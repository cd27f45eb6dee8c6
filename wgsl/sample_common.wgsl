// What the sampler's two shader modules share (sample.wgsl, sample_topk.wgsl):
// the settings, the bindings (one bind group layout for every entry point), the
// scratch layout, the order-preserving key of a logit, the seeded Gumbel noise
// and the radix rounds' state.
//
// One dispatch runs every sampled row of a step: workgroup_id.z is the row's slot, whose
// settings are slots[z] (kernels_sample.StepSampling writes them all in one call) and
// whose scratch, penalty window and candidate counter sit at its own offsets. A slot
// whose path does not take an entry point returns at once (the whole workgroup: its
// settings are the workgroup's).

struct Params {
    n: u32,
    parts: u32,
    slice: u32,
    top_k: u32,
    top_p: f32,
    min_p_log: f32,
    has_min_p: u32,
    inv_temp: f32,
    seed_lo: u32,
    seed_hi: u32,
    rows: u32,
    use_k: u32,
    use_p: u32,
    pen_n: u32,      // penalty window in tokens; NONE = the whole history
    rep: f32,
    rep_inv: f32,
    freq: f32,
    pres: f32,
    x_off: u32,   // the row's first value in x (a step's output row i: i * n)
    out_off: u32, // out[out_off + r] takes draw row r's token
    pos_at: u32,  // state[pos_at]: the row's position (the last context token's)
    scratch_off: u32,  // the slot's scratch: scratch[params.scratch_off + scratch_off ..]
    seq_off: u32,      // its context's ids (the penalty window): seq[params.seq_off + seq_off ..]
    slot: u32,         // its candidate counter: counter[slot]
    path: u32,         // PATH_* bits: the entry points it takes
}

struct Step {
    job: u32,
    round: u32,
}

struct St {
    pre: u32,     // key bits chosen so far
    acc_c: u32,   // count above the prefix's range
    acc_m: f32,   // mass above it
    need: f32,    // top_p's target mass
    eq_c: u32,    // values in the chosen bin (after the last round: equal to the cut)
}

const NONE: u32 = 0xffffffffu;
// scratch layout (u32 words): [0, 32) round states per (job, parity); [32, 48) results per job;
// [64, 64 + 2 parts) slice maxima; then histograms [job][parity][part][16 bins][count, mass];
// then draw winners [row][part][score, index]; then sample_topk.wgsl's 8-bit histograms
// [parity][part][256 bins] and its candidates [CAND_MAX][value, index].
const RES: u32 = 32u;
const PATH_PEN: u32 = 1u;   // penalize
const PATH_TOPK: u32 = 2u;  // radix8, collect, pick (sample_topk.wgsl)
const PATH_FULL: u32 = 4u;  // slice_max, radix, draw, merge (sample.wgsl)
const PMAX: u32 = 64u;
const CAND_MAX: u32 = 1024u;  // top_k up to this many takes sample_topk.wgsl (kernels_sample.CAND_MAX)

@group(0) @binding(0) var<storage, read> slots: array<Params>;
// slots[workgroup_id.z], from enter(). Control flow that reaches a barrier reads slots[wid.z]
// instead: Tint (Dawn) does not take a private variable as uniform.
var<private> params: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> seq: array<u32>;
@group(0) @binding(4) var<storage, read_write> state: array<u32>;
@group(0) @binding(5) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(6) var<storage, read_write> out: array<u32>;
@group(0) @binding(7) var<storage, read_write> counter: array<atomic<u32>>;  // [slot]: candidates collected

// #include best_common

fn xv(i: u32) -> f32 {
    return x[params.x_off + i];
}

// The position of the row's last context token: draw row r samples for position pos() + 1 + r.
fn pos() -> u32 {
    return state[params.pos_at];
}

// The slot's settings; false: its path does not take this entry point (`path` bits).
fn enter(z: u32, path: u32) -> bool {
    params = slots[z];
    return (slots[z].path & path) != 0u;  // slots, not params: see the declaration
}

// Every entry point uses every binding, so one bind group layout serves all.
fn touch() {
    _ = slots[0].n;
    _ = step.job;
    _ = x[0];
    _ = seq[params.seq_off + 0];
    _ = state[0];
    _ = scratch[params.scratch_off + 0];
    _ = out[0];
    _ = atomicLoad(&counter[0]);
}

fn hist_at(job: u32, par: u32, s: u32, b: u32) -> u32 {
    return PMAX + 2u * params.parts + (((job * 2u + par) * params.parts + s) * 16u + b) * 2u;
}

fn dpart_at(row: u32, s: u32) -> u32 {
    return PMAX + 2u * params.parts + 128u * params.parts + (row * params.parts + s) * 2u;
}

// sample_topk.wgsl's areas, after the draw winners.
fn h8_at(par: u32, s: u32, b: u32) -> u32 {
    return dpart_at(params.rows, 0u) + ((par * params.parts + s) * 256u + b);
}

fn cand_at(i: u32) -> u32 {
    return h8_at(2u, 0u, 0u) + 2u * i;
}

// Order-preserving map of f32 bits to u32: larger value, larger key.
fn key_of(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

fn value_of(k: u32) -> f32 {
    return bitcast<f32>(select(~k, k & 0x7fffffffu, (k & 0x80000000u) != 0u));
}


// PCG hash (Jarzynski & Olano 2020).
fn pcg(v: u32) -> u32 {
    let s = v * 747796405u + 2891336453u;
    let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
    return (w >> 22u) ^ w;
}

fn row_key(pos: u32) -> u32 {
    return pcg(pcg(pcg(params.seed_hi) ^ params.seed_lo) ^ pos);
}

// -log(-log(u)), u = (m + 1/2) / 2^23 for the hash's top 23 bits m. Over a whole vocabulary the
// largest noise comes from the u nearest 1, where -log(u) ~ 1 - u is tiny and `log`'s absolute
// error (2^-21 in [0.5, 2] by Vulkan's rules) swamps it: Dawn on NVIDIA drew a wrong token. There
// -log(u) is the series of -log(1 - v) in v = 1 - u, which is exact in f32 (cpu/sample.py's twin).
fn gumbel(rk: u32, i: u32) -> f32 {
    let h = pcg(pcg(i ^ rk) + rk);
    let m = f32(h >> 9u);
    let v = (8388607.5 - m) * (1.0 / 8388608.0);  // 1 - u, exact
    var e = -log((m + 0.5) * (1.0 / 8388608.0));
    if (v < 0.0625) {
        e = v * (1.0 + v * (0.5 + v * (0.33333334 + v * (0.25 + v * (0.2 + v * 0.16666667)))));
    }
    return -log(e);
}

// The maximum of x (merged from the slice maxima, all threads at once) into sh_m.
fn load_state(job: u32, r: u32) -> St {
    if (r == 0u) {
        return St(0u, 0u, 0.0, 0.0, 0u);
    }
    let o = (job * 2u + (r & 1u)) * 8u;
    return St(scratch[params.scratch_off + o], scratch[params.scratch_off + o + 1u], bitcast<f32>(scratch[params.scratch_off + o + 2u]), bitcast<f32>(scratch[params.scratch_off + o + 3u]), scratch[params.scratch_off + o + 4u]);
}

fn store_state(job: u32, r: u32, st: St) {
    let o = (job * 2u + (r & 1u)) * 8u;
    scratch[params.scratch_off + o] = st.pre;
    scratch[params.scratch_off + o + 1u] = st.acc_c;
    scratch[params.scratch_off + o + 2u] = bitcast<u32>(st.acc_m);
    scratch[params.scratch_off + o + 3u] = bitcast<u32>(st.need);
    scratch[params.scratch_off + o + 4u] = st.eq_c;
}

// The state after round rp of `job` (into sh_st): merge that round's histograms

// Ties at a cut keep the lowest ids, so a pass that ranks them has each
// invocation (tid of wg) walk a contiguous run [a, e) of its slice [lo, hi):
// (a, e, the keys in it equal to `cut`).
fn tie_run(lo: u32, hi: u32, tid: u32, wg: u32, cut: u32) -> vec3<u32> {
    let chunk = (params.slice + wg - 1u) / wg;
    let a = min(hi, lo + tid * chunk);
    let e = min(hi, a + chunk);
    var here = 0u;
    for (var i = a; i < e; i++) {
        here += select(0u, 1u, key_of(xv(i)) == cut);
    }
    return vec3<u32>(a, e, here);
}
