"""Array workloads of RAPIDS-style users, on CuPy (NumPy in a CPU dry run):
`ctx.xp` is the array module. Only the shapes come from `ctx`; the data
come from the array module's own generator, seeded."""

import collections


def array_mix(ctx):
    """Random shapes through elementwise chains, reductions, FFTs, matrix
    products and sorts; the last few results stay alive, as cached
    intermediates do."""
    xp = ctx.xp
    rs = xp.random.default_rng(ctx.seed)
    kept = collections.deque(maxlen=6)
    top = ctx.size(4096, 96)
    for _ in range(ctx.steps(400)):
        n, m = ctx.logint(32, top), ctx.logint(32, top)
        a = rs.standard_normal((n, m), dtype=xp.float32)
        op = ctx.choice(["elementwise", "reduce", "fft", "matmul", "sort"])
        if op == "elementwise":
            r = xp.tanh(a * 0.5 + 1.0) * xp.exp(-(a ** 2)) + xp.sqrt(xp.abs(a))
        elif op == "reduce":
            r = a.sum(axis=0) + a.max(axis=0) + xp.linalg.norm(a, axis=0) + a.std(axis=0)
        elif op == "fft":
            f = xp.fft.rfft(a, axis=1)
            r = xp.fft.irfft(f * xp.exp(-xp.abs(f)), n=m, axis=1)
        elif op == "matmul":
            dtype = ctx.choice([xp.float32, xp.float32, xp.float64])
            b = rs.standard_normal((m, ctx.logint(32, top)), dtype=dtype)
            r = a.astype(dtype) @ b
        else:
            v = a.ravel()
            r = xp.sort(v)[xp.argsort(v[: n])]
        kept.append(r)
        float(r.ravel()[-1])  # a host round trip, as a user's check or print makes


def dataframe(ctx):
    """Partitions of a table of 1e5-1e7 rows through a filter, a derived
    column, a sort by key and gather, a group-by (segmented sums over the
    sorted keys), a join against a dimension table (searchsorted) and a
    top-k; a few joined partitions stay cached and are concatenated now
    and then."""
    xp = ctx.xp
    rs = xp.random.default_rng(ctx.seed)
    cached = collections.deque(maxlen=3)
    for part in range(ctx.steps(40)):
        rows = ctx.logint(100_000, 10_000_000) if not ctx.dry else 2000
        groups = max(10, rows // ctx.choice([10, 100, 1000]))
        df = {
            "key": rs.integers(0, groups, rows, dtype=xp.int64),
            "a": rs.standard_normal(rows, dtype=xp.float64),
            "b": rs.random(rows, dtype=xp.float32),
            "c": rs.integers(0, 1000, rows, dtype=xp.int32),
        }
        keep = (df["a"] > -0.5) & (df["c"] % 7 != 0)
        df = {name: col[keep] for name, col in df.items()}
        df["d"] = df["a"] * df["b"] + df["c"].astype(xp.float64)
        order = xp.argsort(df["key"])
        df = {name: col.take(order) for name, col in df.items()}
        # Group by key: segment boundaries of the sorted keys, sums from a cumulative sum.
        key = df["key"]
        starts = xp.flatnonzero(xp.concatenate([xp.ones(1, dtype=bool), key[1:] != key[:-1]]))
        ends = xp.concatenate([starts[1:], xp.array([key.size])])
        csum = xp.concatenate([xp.zeros(1), xp.cumsum(df["d"])])
        means = (csum[ends] - csum[starts]) / (ends - starts)
        gkeys = key[starts]
        # Inner join with a dimension table holding every other key.
        dim_keys = xp.arange(0, groups, 2, dtype=xp.int64)
        dim_vals = rs.standard_normal(dim_keys.size, dtype=xp.float64)
        pos = xp.minimum(xp.searchsorted(dim_keys, gkeys), dim_keys.size - 1)
        hit = dim_keys[pos] == gkeys
        joined = {"key": gkeys[hit], "mean": means[hit], "dim": dim_vals[pos[hit]]}
        top = xp.argsort(-joined["mean"])[:100]
        float(joined["dim"][top].sum())
        cached.append(joined)
        if part % 4 == 3:
            union = {name: xp.concatenate([t[name] for t in cached]) for name in joined}
            float(union["mean"].mean())
        # Let go of this partition's buffers before the next is made.
        del df, keep, order, key, starts, ends, csum, means, gkeys, pos, hit


def kmeans_pca(ctx):
    """Datasets of 1e4-1e6 rows: ten Lloyd iterations of k-means (distance
    matrices, argmin, one-hot centroid sums), then PCA by the covariance's
    eigendecomposition and an SVD of a sample."""
    xp = ctx.xp
    rs = xp.random.default_rng(ctx.seed)
    for _ in range(ctx.steps(16)):
        n = ctx.logint(10_000, 1_000_000) if not ctx.dry else 500
        d, k = ctx.choice([16, 32, 64, 128, 256]), ctx.choice([8, 16, 32, 64])
        x = rs.standard_normal((n, d), dtype=xp.float32)
        centers = x[rs.integers(0, n, k)]
        for _ in range(10):
            dist = (x * x).sum(axis=1)[:, None] - 2 * (x @ centers.T) + (centers * centers).sum(axis=1)[None]
            labels = dist.argmin(axis=1)
            onehot = (labels[:, None] == xp.arange(k)[None]).astype(xp.float32)
            centers = (onehot.T @ x) / xp.maximum(onehot.sum(axis=0), 1)[:, None]
        float(dist.min(axis=1).sum())
        xc = x - x.mean(axis=0)
        _, vectors = xp.linalg.eigh((xc.T @ xc) / (n - 1))
        projected = xc @ vectors[:, -8:]
        _, s, _ = xp.linalg.svd(x[: min(n, 8192)], full_matrices=False)
        float(projected.std() + s[0])


def image_pipeline(ctx):
    """Batches of images of random sizes through the steps of an imaging
    pipeline: conversion to float, a Gaussian blur by FFT, the gradient
    magnitude, a threshold at a percentile, a pyramid of 2x reductions and
    a histogram; the last few results stay cached."""
    xp = ctx.xp
    rs = xp.random.default_rng(ctx.seed)
    kept = collections.deque(maxlen=4)
    top = ctx.size(3072, 96)
    for _ in range(ctx.steps(120)):
        h, w = ctx.logint(64, top), ctx.logint(64, top)
        batch = ctx.choice([1, 2, 4, 8]) if not ctx.dry else 1
        img = rs.integers(0, 256, (batch, h, w), dtype=xp.int32).astype(xp.float32) / 255
        sigma = ctx.choice([1.0, 2.0, 4.0])
        fy, fx = xp.fft.fftfreq(h)[:, None], xp.fft.rfftfreq(w)[None, :]
        gauss = xp.exp(-2 * (xp.pi * sigma) ** 2 * (fx ** 2 + fy ** 2))
        blurred = xp.fft.irfft2(xp.fft.rfft2(img) * gauss, s=(h, w)).astype(xp.float32)
        gy, gx = xp.diff(blurred, axis=1)[:, :, :-1], xp.diff(blurred, axis=2)[:, :-1, :]
        magnitude = xp.sqrt(gy * gy + gx * gx)
        edges = magnitude > xp.percentile(magnitude, 90)
        level = blurred
        while min(level.shape[1:]) >= 128:
            hh, ww = level.shape[1] // 2, level.shape[2] // 2
            level = level[:, : 2 * hh, : 2 * ww].reshape(batch, hh, 2, ww, 2).mean(axis=(2, 4))
        hist, _ = xp.histogram(blurred, bins=256, range=(0.0, 1.0))
        kept.append((edges, level, hist))
        float(hist.sum() + edges.sum())  # a host round trip, as a report makes
        del img, gauss, blurred, gy, gx, magnitude
