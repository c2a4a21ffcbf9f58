#!/usr/bin/env python3
"""Records the allocation log of a small PyTorch training run on a GPU, for W5.

PyTorch's CUDA allocator is switched to gpumem's (gpumem.torch, a
CUDAPluggableAllocator) and gpumem's current resource logs every call
(GPUMEM_CONF=pool,log=OUT): the log's app rows are exactly the allocations and
frees PyTorch asked for, its upstream rows what gpumem's pool reserved.

The model is GPT-like: token embedding, 6 pre-norm transformer layers of width 768
(12 heads, feed-forward 3072), a tied output head; AdamW; bf16 autocast; the sequence
length changes from step to step (dynamic padding), which is what makes a caching
allocator's reuse hard. Six steps make a log of a few thousand calls.

With --model vision: a small residual convolutional network (torch.nn only) trained
with multi-scale inputs: image size and batch change from step to step (cuDNN's
workspaces and the activations change with them).

Without gpumem's Python package (or with --via torch-history) the log is made from
PyTorch's own allocator history instead (torch.cuda.memory._record_memory_history):
the same program's requests, as the sizes PyTorch's caching allocator rounded them
to (multiples of 512 bytes), written in gpumem's log format.

    python3 bench/traces/record_torch.py OUT.csv [--steps 6] [--via gpumem|torch-history]
                                         [--model transformer|vision]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import torch_models  # noqa: E402  (bench/python)


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the CSV log to write")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--via", choices=["auto", "gpumem", "torch-history"], default="auto")
    ap.add_argument("--model", choices=["transformer", "vision"], default="transformer")
    return ap.parse_args()


def gpumem_importable():
    import importlib.util

    return importlib.util.find_spec("gpumem") is not None


def train(steps):
    import torch

    torch.manual_seed(0)
    device = "cuda"
    vocab, d, layers, heads, batch = 32000, 768, 6, 12, 8

    model = torch_models.transformer(vocab, d, layers, heads, 1024).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lengths = [256, 512, 384, 512, 448, 320, 512, 256]
    for step in range(steps):
        torch_models.train_step(model, optimizer, vocab, batch, lengths[step % len(lengths)])
    torch.cuda.synchronize()
    del model, optimizer
    torch.cuda.synchronize()


def train_vision(steps):
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    device = "cuda"

    def stage(cin, cout, stride):
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

    model = nn.Sequential(stage(3, 64, 2), stage(64, 128, 2), stage(128, 256, 2), stage(256, 512, 2),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000)).to(device)
    model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    shapes = [(64, 224), (96, 160), (32, 288), (64, 192), (48, 256), (128, 128), (64, 224), (32, 320)]
    for step in range(steps):
        batch, size = shapes[step % len(shapes)]
        images = torch.randn(batch, 3, size, size, device=device).to(memory_format=torch.channels_last)
        labels = torch.randint(0, 1000, (batch,), device=device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del images, labels, loss
    torch.cuda.synchronize()
    del model, optimizer
    torch.cuda.synchronize()


def via_gpumem(out, steps):
    # GPUMEM_CONF is read when gpumem makes the device's first resource: before that.
    os.environ["GPUMEM_CONF"] = "pool,log=" + os.path.abspath(out)
    import gpumem

    gpumem.select_backend("cuda")
    import gpumem.torch

    gpumem.torch.use_gpumem_for_torch()
    (train_vision if MODEL == "vision" else train)(steps)
    import gc

    gc.collect()
    # The log is flushed when the process exits (gpumem's exit hook).


def via_torch_history(out, steps):
    import torch

    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    (train_vision if MODEL == "vision" else train)(steps)
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    rows = []
    for trace in snapshot.get("device_traces", []):
        for e in trace:
            action = e.get("action")
            if action == "alloc":
                op = "allocate"
            elif action == "free_requested":
                op = "deallocate"
            else:
                continue  # segment events, free_completed, snapshots, oom
            rows.append((int(e.get("time_us", 0)) * 1000, op, int(e["addr"]), int(e["size"]), int(e.get("stream", 0))))
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0] if rows else 0
    with open(out, "w", newline="\n") as f:
        f.write("seq,time_ns,thread,device,stream,source,op,ptr,bytes,alignment,outcome,site\n")
        for seq, (t, op, ptr, size, stream) in enumerate(rows, 1):
            f.write("%d,%d,1,0,0x%x,app,%s,0x%x,%d,512,ok,torch.%s\n" % (seq, t - t0, stream, op, ptr, size, op))


MODEL = "transformer"


def main():
    global MODEL
    args = parse()
    MODEL = args.model
    via = args.via
    if via == "auto":
        via = "gpumem" if gpumem_importable() else "torch-history"
    if via == "gpumem":
        via_gpumem(args.out, args.steps)
    else:
        via_torch_history(args.out, args.steps)
    print("record_torch: %d steps recorded through %s into %s" % (args.steps, via, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
