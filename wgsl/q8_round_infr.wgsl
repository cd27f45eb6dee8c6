    let d = m / 127.0;
    var q = vec4<i32>(0);
    if (d > 0.0) {
        q = vec4<i32>(round(vals / d));
    }