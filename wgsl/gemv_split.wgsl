// The fused q|k|v GEMV's extra outputs and its row epilogue (included by gemv_*.wgsl with SPLIT).

@group(0) @binding(6) var<storage, read_write> y2: array<f32>;
@group(0) @binding(7) var<storage, read_write> y3: array<f32>;

// Row r of the stacked q|k|v matrix into its own output, each laid out [T][rows].
fn store_split(r: u32, t: u32, acc: f32) {
    _ = resid[0];  // bound like every matmul's, unused here (one binding list for all modes)
    var v = acc;
    if (params.has_bias != 0u) {
        v += bias[r];
    }
    if (r < params.split1) {
        y[t * params.split1 + r] = v;
    } else if (r < params.split2) {
        y2[t * (params.split2 - params.split1) + r - params.split1] = v;
    } else {
        y3[t * (params.N - params.split2) + r - params.split2] = v;
    }
}
