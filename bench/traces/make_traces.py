#!/usr/bin/env python3
"""Makes the allocation logs kept in bench/traces, which gpumem-bench's W5 replays.

Two are synthetic but shaped like real programs, written here in gpumem's CSV event
log format (docs/observability.md, "The log format"); one is recorded from a gpumem
program on the simulator:

  transformer-train.csv  the calls PyTorch's allocator gets from a small GPT-like
                         model's training steps (fp32 weights, bf16 activations,
                         AdamW; gradients set to None each step; the sequence length
                         changes from step to step, as with dynamic padding)
  data-pipeline.csv      a CuPy/Numba-style image pipeline: batches of changing size
                         decoded, converted, normalised and resized on one stream
                         while the next batch is staged on another; FFT workspaces;
                         small per-batch results kept to the end; small Numba arrays
                         whose frees arrive in groups of ten (Numba's deferred frees)
  example-training.csv   gpumem-example-training (tools/examples/training_loop.cpp)
                         logged through GPUMEM_CONF on the simulator: two threads with
                         their own streams (made only when --example-training is given)

Every run makes the same files (fixed seeds). Real logs recorded on a GPU go beside
them (bench/traces/record_torch.py, record_pipeline.py).

    python3 bench/traces/make_traces.py [--out bench/traces] [--example-training PATH]
"""

import argparse
import os
import random
import subprocess
import sys
import tempfile

HEADER = "seq,time_ns,thread,device,stream,source,op,ptr,bytes,alignment,outcome,site"
KiB, MiB = 1 << 10, 1 << 20


class Log:
    """Writes one log: unique addresses (never reused), times that only grow."""

    def __init__(self, seed):
        self.rows = []
        self.rng = random.Random(seed)
        self.time_ns = 0
        self.next_ptr = 0x7F0000000000
        self.live = {}  # ptr -> bytes

    def tick(self, lo_us, hi_us):
        self.time_ns += int(self.rng.uniform(lo_us, hi_us) * 1000)

    def alloc(self, nbytes, site, stream=0x0, thread=1):
        nbytes = max(1, int(nbytes))
        ptr = self.next_ptr
        self.next_ptr += (nbytes + 511) // 512 * 512 + 512
        self.live[ptr] = nbytes
        self.tick(0.5, 3)
        self.rows.append((self.time_ns, thread, stream, "allocate", ptr, nbytes, site))
        return ptr

    def free(self, ptr, site="", stream=0x0, thread=1):
        nbytes = self.live.pop(ptr)
        self.tick(0.3, 2)
        self.rows.append((self.time_ns, thread, stream, "deallocate", ptr, nbytes, site))

    def write(self, path):
        with open(path, "w", newline="\n") as f:
            f.write(HEADER + "\n")
            for seq, (t, thread, stream, op, ptr, nbytes, site) in enumerate(self.rows, 1):
                f.write("%d,%d,%d,0,0x%x,app,%s,0x%x,%d,256,ok,%s\n" % (seq, t, thread, stream, op, ptr, nbytes, site))
        return len(self.rows)


def transformer_train(path):
    """A GPT-like model, 6 layers of width 1024, batch 4, vocab 32000, 4 steps."""
    log = Log(seed=5)
    d, layers, heads, vocab, batch = 1024, 6, 16, 32000, 4
    f32, bf16 = 4, 2
    # Weights (fp32), allocated once and kept.
    weight_shapes = [("embed", vocab * d)]
    for i in range(layers):
        weight_shapes += [("l%d.ln1" % i, 2 * d), ("l%d.qkv.w" % i, 3 * d * d), ("l%d.qkv.b" % i, 3 * d),
                          ("l%d.proj.w" % i, d * d), ("l%d.proj.b" % i, d), ("l%d.ln2" % i, 2 * d),
                          ("l%d.fc1.w" % i, 4 * d * d), ("l%d.fc1.b" % i, 4 * d),
                          ("l%d.fc2.w" % i, 4 * d * d), ("l%d.fc2.b" % i, d)]
    weight_shapes.append(("ln_f", 2 * d))
    for name, n in weight_shapes:
        log.alloc(n * f32, "init." + name)
    optimizer_state = []
    for step, seq in enumerate([512, 384, 448, 512]):
        tokens = batch * seq
        log.tick(50, 200)
        ids = log.alloc(tokens * 8, "data.input_ids")
        labels = log.alloc(tokens * 8, "data.labels")
        x = log.alloc(tokens * d * bf16, "forward.embed")
        saved = []  # what autograd keeps for backward, per layer
        for i in range(layers):
            ln1 = log.alloc(tokens * d * bf16, "forward.ln1")
            stats = log.alloc(tokens * 2 * f32, "forward.ln1.stats")
            qkv = log.alloc(tokens * 3 * d * bf16, "forward.qkv")
            scores = log.alloc(batch * heads * seq * seq * bf16, "forward.attn.scores")
            probs = log.alloc(batch * heads * seq * seq * bf16, "forward.attn.softmax")
            log.free(scores)
            ctx = log.alloc(tokens * d * bf16, "forward.attn.context")
            proj = log.alloc(tokens * d * bf16, "forward.proj")
            x2 = log.alloc(tokens * d * bf16, "forward.residual")
            log.free(proj)
            ln2 = log.alloc(tokens * d * bf16, "forward.ln2")
            stats2 = log.alloc(tokens * 2 * f32, "forward.ln2.stats")
            h = log.alloc(tokens * 4 * d * bf16, "forward.fc1")
            g = log.alloc(tokens * 4 * d * bf16, "forward.gelu")
            out = log.alloc(tokens * d * bf16, "forward.fc2")
            x3 = log.alloc(tokens * d * bf16, "forward.residual")
            log.free(out)
            saved.append([x, ln1, stats, qkv, probs, ctx, x2, ln2, stats2, h, g])
            x = x3
            log.tick(100, 400)
        lnf = log.alloc(tokens * d * bf16, "forward.ln_f")
        logits = log.alloc(tokens * vocab * bf16, "forward.lm_head")
        logits32 = log.alloc(tokens * vocab * f32, "loss.float")
        loss = log.alloc(4, "loss.value")
        dlogits = log.alloc(tokens * vocab * f32, "backward.loss")
        log.free(logits32)
        dlogits16 = log.alloc(tokens * vocab * bf16, "backward.loss.cast")
        log.free(dlogits)
        grads = {}
        grads["embed"] = log.alloc(vocab * d * f32, "backward.lm_head.weight_grad")
        dx = log.alloc(tokens * d * bf16, "backward.lm_head")
        log.free(dlogits16)
        log.free(logits)
        log.free(lnf)
        log.free(x)
        for i in reversed(range(layers)):
            x_in, ln1, stats, qkv, probs, ctx, x2, ln2, stats2, h, g = saved[i]
            for name, n in weight_shapes:
                if name.startswith("l%d." % i) and name.endswith((".w", ".b")):
                    grads[name] = log.alloc(n * f32, "backward.weight_grad")
            dg = log.alloc(tokens * 4 * d * bf16, "backward.fc2")
            dh = log.alloc(tokens * 4 * d * bf16, "backward.gelu")
            log.free(dg)
            log.free(g)
            log.free(h)
            dln2 = log.alloc(tokens * d * bf16, "backward.fc1")
            log.free(dh)
            dx2 = log.alloc(tokens * d * bf16, "backward.ln2")
            log.free(dln2)
            log.free(ln2)
            log.free(stats2)
            dctx = log.alloc(tokens * d * bf16, "backward.proj")
            dprobs = log.alloc(batch * heads * seq * seq * bf16, "backward.attn.context")
            dscores = log.alloc(batch * heads * seq * seq * bf16, "backward.attn.softmax")
            log.free(dprobs)
            log.free(probs)
            dqkv = log.alloc(tokens * 3 * d * bf16, "backward.attn.scores")
            log.free(dscores)
            log.free(dctx)
            log.free(ctx)
            dln1 = log.alloc(tokens * d * bf16, "backward.qkv")
            log.free(dqkv)
            log.free(qkv)
            dxi = log.alloc(tokens * d * bf16, "backward.ln1")
            log.free(dln1)
            log.free(ln1)
            log.free(stats)
            log.free(x2)
            log.free(dx)
            log.free(dx2)
            dx = dxi
            log.free(x_in)
            log.tick(100, 400)
        log.free(dx)
        log.free(loss)
        log.free(ids)
        log.free(labels)
        # AdamW: its state on the first step, then foreach temporaries in chunks.
        if not optimizer_state:
            for name, n in weight_shapes:
                optimizer_state.append(log.alloc(n * f32, "optimizer.exp_avg"))
                optimizer_state.append(log.alloc(n * f32, "optimizer.exp_avg_sq"))
        names = [name for name, _ in weight_shapes if name in grads]
        for k in range(0, len(names), 8):
            chunk = names[k:k + 8]
            temps = [log.alloc(dict(weight_shapes)[n] * f32, "optimizer.foreach_tmp") for n in chunk]
            for t in temps:
                log.free(t)
        # zero_grad(set_to_none=True): gradients go back.
        for name in list(grads):
            log.free(grads.pop(name))
        log.tick(200, 800)
    return log.write(path)


def data_pipeline(path):
    """An image pipeline on a compute stream, staging the next batch on a copy stream."""
    log = Log(seed=7)
    compute, copy = 0x5A5A0001, 0x5A5A0002  # two streams, as the log writes their handles
    numba_stream = 0x1                        # Numba's default stream: the legacy one
    table = log.alloc(96 * MiB, "init.lookup_table", compute)
    weights = log.alloc(44 * MiB, "init.model_weights", compute)
    results = []
    pending_numba = []  # Numba defers frees and flushes ten at a time
    staged = None
    sizes = [224, 256, 320, 384, 512]
    for b in range(48):
        n = log.rng.randint(16, 64)
        side = log.rng.choice(sizes)
        raw_bytes = n * side * side * 3
        if staged is None:
            staged = log.alloc(raw_bytes, "load.h2d", copy)
        current, staged = staged, None
        # The next batch is staged while this one is processed.
        n_next = log.rng.randint(16, 64)
        side_next = log.rng.choice(sizes)
        staged = log.alloc(n_next * side_next * side_next * 3, "load.h2d", copy)
        as_float = log.alloc(raw_bytes * 4, "decode.astype_float32", compute)
        log.free(current, stream=compute)  # freed where it was consumed
        mean = log.alloc(n * 3 * 4, "normalize.mean", compute)
        centered = log.alloc(raw_bytes * 4, "normalize.subtract", compute)
        log.free(as_float, stream=compute)
        scaled = log.alloc(raw_bytes * 4, "normalize.divide", compute)
        log.free(centered, stream=compute)
        log.free(mean, stream=compute)
        resized = log.alloc(n * 3 * 224 * 224 * 4, "resize.bilinear", compute)
        log.free(scaled, stream=compute)
        if b % 3 == 0:  # a frequency-domain filter on every third batch
            workspace = log.alloc(2 * n * 3 * 224 * 113 * 8, "fft.plan_workspace", compute)
            spectrum = log.alloc(n * 3 * 224 * 113 * 8, "fft.rfft2", compute)
            filtered = log.alloc(n * 3 * 224 * 224 * 4, "fft.irfft2", compute)
            log.free(spectrum, stream=compute)
            log.free(workspace, stream=compute)
            log.free(resized, stream=compute)
            resized = filtered
        for _ in range(log.rng.randint(2, 5)):  # augmentations: crops and flips of changing size
            crop = log.rng.choice([160, 192, 208, 224])
            aug = log.alloc(n * 3 * crop * crop * 4, "augment.crop", compute)
            log.free(aug, stream=compute)
        features = log.alloc(n * 2048 * 4, "model.features", compute)
        log.free(resized, stream=compute)
        logits = log.alloc(n * 1000 * 4, "model.logits", compute)
        log.free(features, stream=compute)
        results.append(log.alloc(n * 4, "result.argmax", compute))
        results.append(log.alloc(n * 5 * 8, "result.top5", compute))
        log.free(logits, stream=compute)
        # Numba kernels on small arrays: histograms and counters.
        for _ in range(log.rng.randint(6, 14)):
            pending_numba.append(log.alloc(log.rng.choice([256, 1 * KiB, 4 * KiB, 64 * KiB, 256 * KiB]),
                                           "numba.device_array", numba_stream))
            if len(pending_numba) > 10:
                for p in pending_numba:
                    log.free(p, stream=numba_stream)
                pending_numba = []
        log.tick(300, 1500)
    log.free(staged, stream=copy)
    for p in pending_numba:
        log.free(p, stream=numba_stream)
    for r in results:
        log.free(r, stream=compute)
    log.free(weights, stream=compute)
    log.free(table, stream=compute)
    return log.write(path)


def example_training(path, binary):
    """gpumem-example-training on a 16 GiB simulated device, 20 steps at scale 4 (peak
    live about 2.5 GiB, so that it replays on the simulator's default 8 GiB device): no
    allocation fails there, so every call replays. The log is read back and written
    with the app rows only, renumbered (what W5 replays)."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "raw.csv")
        env = dict(os.environ, GPUMEM_BACKEND="sim", GPUMEM_SIM_MEMORY="16GiB", GPUMEM_CONF="pool,log=" + raw)
        subprocess.run([binary, "20", "4"], env=env, check=True, stdout=subprocess.DEVNULL)
        with open(raw) as f:
            header = f.readline().rstrip("\n")
            rows = [line.rstrip("\n").split(",") for line in f]
    cols = header.split(",")
    src, seq, t = cols.index("source"), cols.index("seq"), cols.index("time_ns")
    rows = [r for r in rows if r[src] == "app"]
    rows.sort(key=lambda r: int(r[seq]))
    t0 = int(rows[0][t]) if rows else 0
    with open(path, "w", newline="\n") as f:
        f.write(header + "\n")
        for i, r in enumerate(rows, 1):
            r[seq] = str(i)
            r[t] = str(int(r[t]) - t0)
            f.write(",".join(r) + "\n")
    return len(rows)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=here, help="folder to write the logs into (default: this one)")
    ap.add_argument("--example-training", metavar="PATH",
                    help="the gpumem-example-training binary: also (re)makes example-training.csv")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    made = [("transformer-train.csv", transformer_train(os.path.join(args.out, "transformer-train.csv"))),
            ("data-pipeline.csv", data_pipeline(os.path.join(args.out, "data-pipeline.csv")))]
    if args.example_training:
        made.append(("example-training.csv",
                     example_training(os.path.join(args.out, "example-training.csv"), args.example_training)))
    for name, n in made:
        print("%s: %d calls" % (name, n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
