#!/usr/bin/env python3
"""Records the allocation log of a CuPy + Numba data pipeline on a GPU, for W5.

CuPy and Numba are both switched to gpumem (gpumem.cupy, gpumem.numba), whose current
resource logs every call (GPUMEM_CONF=pool,log=OUT), so the log holds both
libraries' requests in one order: what a program that mixes them asks of one pool.

The pipeline: batches of images of changing count and size are copied to the device,
converted to float32, normalised, resized by block averaging, filtered in the
frequency domain every third batch (cuFFT's workspace comes from the allocator too),
reduced to per-image features; a Numba kernel builds a histogram of each batch in
small device arrays; small per-batch results are kept to the end. CuPy works on a
non-blocking stream of its own, Numba on its default stream. 40 batches make a log
of a few thousand calls.

    python3 bench/traces/record_pipeline.py OUT.csv [--batches 40]
"""

import argparse
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the CSV log to write")
    ap.add_argument("--batches", type=int, default=40)
    args = ap.parse_args()

    # GPUMEM_CONF is read when gpumem makes the device's first resource: before that.
    os.environ["GPUMEM_CONF"] = "pool,log=" + os.path.abspath(args.out)
    import gpumem

    gpumem.select_backend("cuda")
    import gpumem.cupy
    import gpumem.numba

    gpumem.numba.use_gpumem_for_numba()
    gpumem.cupy.use_gpumem_for_cupy()

    import cupy as cp
    import numpy as np
    from numba import cuda

    try:
        @cuda.jit
        def histogram(values, bins, out):
            i = cuda.grid(1)
            if i < values.size:
                b = int(values[i] * bins)
                if b >= bins:
                    b = bins - 1
                if b < 0:
                    b = 0
                cuda.atomic.add(out, b, 1)
        have_kernel = True
    except Exception as e:  # noqa: BLE001 - no NVVM here: arrays without the kernel
        print("record_pipeline: no Numba kernel (%s); allocating its arrays only" % e)
        have_kernel = False

    rng = np.random.default_rng(7)
    stream = cp.cuda.Stream(non_blocking=True)
    table = cp.zeros(24 * 1024 * 1024, dtype=cp.float32)  # a lookup table kept throughout
    results = []
    sides = [224, 256, 320, 384]
    with stream:
        for b in range(args.batches):
            n = int(rng.integers(16, 64))
            side = int(rng.choice(sides))
            host = rng.integers(0, 255, size=(n, side, side, 3), dtype=np.uint8)
            images = cp.asarray(host)
            x = images.astype(cp.float32)
            del images
            x -= x.mean(axis=(1, 2), keepdims=True)
            x /= x.std(axis=(1, 2), keepdims=True) + 1e-6
            f = side // 112  # block-average down to 112 x 112 (or close)
            small = x[:, : 112 * f, : 112 * f, :].reshape(n, 112, f, 112, f, 3).mean(axis=(2, 4))
            del x
            if b % 3 == 0:
                spectrum = cp.fft.rfft2(small, axes=(1, 2))
                spectrum[:, 40:, :, :] = 0
                small = cp.fft.irfft2(spectrum, s=(112, 112), axes=(1, 2))
                del spectrum
            features = small.reshape(n, -1)[:, :2048] @ table[: 2048 * 64].reshape(2048, 64)
            results.append(cp.argmax(features, axis=1))
            results.append(features.max(axis=1))
            del features
            # Numba: a histogram of the batch in small arrays of its own.
            stream.synchronize()
            values = cuda.to_device(cp.asnumpy(small.ravel()[:65536]).clip(0, 1))
            counts = cuda.to_device(np.zeros(64, dtype=np.int64))
            if have_kernel:
                try:  # compiled at the first launch: NVVM may be missing
                    histogram[(values.size + 255) // 256, 256](values, 64, counts)
                except Exception as e:  # noqa: BLE001
                    print("record_pipeline: the Numba kernel does not run (%s); arrays only" % e)
                    have_kernel = False
            scratch = [cuda.device_array(int(rng.integers(1, 64)) * 1024, dtype=np.uint8) for _ in range(6)]
            del values, counts, scratch, small
    stream.synchronize()
    cuda.synchronize()
    del results, table
    import gc

    gc.collect()
    print("record_pipeline: %d batches recorded into %s" % (args.batches, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
