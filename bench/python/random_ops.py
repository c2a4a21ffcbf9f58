"""W2's op sequence for bench/python/peers.py, exactly as gpumem-bench makes it
(bench/workloads/random_ops.cpp): std::mt19937_64 in Python, the same arithmetic."""

KiB, MiB = 1 << 10, 1 << 20


class MT19937_64:
    """std::mt19937_64: the same numbers as the C++ library's for the same seed."""

    def __init__(self, seed):
        self.mt = [0] * 312
        self.mt[0] = seed & 0xFFFFFFFFFFFFFFFF
        for i in range(1, 312):
            prev = self.mt[i - 1]
            self.mt[i] = (6364136223846793005 * (prev ^ (prev >> 62)) + i) & 0xFFFFFFFFFFFFFFFF
        self.index = 312

    def _twist(self):
        mt = self.mt
        for i in range(312):
            x = (mt[i] & 0xFFFFFFFF80000000) | (mt[(i + 1) % 312] & 0x7FFFFFFF)
            xa = x >> 1
            if x & 1:
                xa ^= 0xB5026F5AA96619E9
            mt[i] = mt[(i + 156) % 312] ^ xa
        self.index = 0

    def __call__(self):
        if self.index >= 312:
            self._twist()
        x = self.mt[self.index]
        self.index += 1
        x ^= (x >> 29) & 0x5555555555555555
        x ^= (x << 17) & 0x71D67FFFEDA60000
        x ^= (x << 37) & 0xFFF7EEE000000000
        x ^= x >> 43
        return x & 0xFFFFFFFFFFFFFFFF


MAX_LIVE = 1000


def random_ops(count, max_bytes, seed=1):
    """[(bytes, index)]: bytes > 0 allocates that many; bytes == 0 frees live[index]
    (the last live entry moves into the hole), as random_ops.cpp."""
    rng = MT19937_64(seed)
    ops, live = [], 0
    for _ in range(count):
        allocate = live == 0 or (live < MAX_LIVE and (rng() >> 63) == 0)
        if allocate:
            ops.append((1 + rng() % max_bytes, 0))
            live += 1
        else:
            ops.append((0, rng() % live))
            live -= 1
    return ops


def fnv(ops):
    h = 1469598103934665603
    for b, i in ops:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
        h = ((h ^ i) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def self_test():
    """Checks the generator and the op sequences against values from the C++ build."""
    rng = MT19937_64(5489)
    for _ in range(9999):
        rng()
    checks = [("mt19937_64 10000th output", rng(), 9981545732273789042),
              ("W2 max 4 KiB sequence", fnv(random_ops(20000, 4 * KiB)), 5565837160157226506),
              ("W2 max 4 MiB sequence", fnv(random_ops(20000, 4 * MiB)), 8906600737018267146)]
    failed = 0
    for what, got, want in checks:
        ok = got == want
        failed += not ok
        print("%s: %s" % (what, "ok" if ok else "MISMATCH (%d, want %d)" % (got, want)))
    print("%d passed, %d failed" % (len(checks) - failed, failed))
    return 1 if failed else 0
