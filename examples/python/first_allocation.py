#!/usr/bin/env python3
"""gpumem from Python in one page: the device's default resource, a buffer, a copy
there and back, what the pool holds, and the error when memory runs out.
docs/getting-started.md walks through it. Runs on the GPU when one is usable, else on
the host simulator (GPUMEM_BACKEND=sim forces it)."""

import sys

import gpumem


def main():
    # 0. The GPU when the driver and a device are there, else the simulator.
    backend = gpumem.select_backend("cuda_or_sim")
    print("backend:", "the host simulator" if backend == "sim" else "the CUDA driver")

    # 1. A buffer of a million 4-byte integers from the default resource, filled from the
    #    host and read back.
    data = bytes(range(256)) * (4 * (1 << 20) // 256)
    buf = gpumem.DeviceBuffer(len(data))
    buf.copy_from_host(data)
    back = buf.copy_to_host()
    print("round trip of %d bytes: %s" % (len(data), "equal" if back == data else "DIFFERENT"))

    # 2. What the default pool holds (where it is the virtual-memory pool).
    pool = gpumem.get_current_resource(0)
    if isinstance(pool, gpumem.VmmPoolResource):
        st = pool.statistics()
        print("the pool: %d bytes in use, %d bytes of memory held in %d pages"
              % (st["used_bytes"], st["mapped_bytes"], st["pages"]))

    # 3. More than the device has: a typed error that says why; the pool stays usable.
    try:
        gpumem.DeviceBuffer(gpumem.device_memory_info(0)[1] * 2)
    except gpumem.OutOfMemoryError as e:
        print("OutOfMemoryError, as expected:", str(e)[:100], "...")
    buf.close()
    return 0 if back == data else 1


if __name__ == "__main__":
    sys.exit(main())
