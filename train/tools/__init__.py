"""Tools around the engine, which the engine never imports: the device doctor (`doctor`), the trial run and
batch probe (`check`, `probe`) and the benchmark (`bench`)."""
