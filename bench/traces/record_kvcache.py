#!/usr/bin/env python3
"""Records the allocation log of a small LLM inference loop on a GPU, for W5.

A GPT-like decoder (width 1024, 8 layers, 16 heads; bf16) serves batches of requests
whose prompt and generation lengths differ from batch to batch. Each layer's key/value
cache grows by one token per decoding step (torch.cat: a new, longer tensor each step,
the old one freed), and is dropped when the batch is done: the KV cache grows and
shrinks, as in a serving loop without a paged cache.

PyTorch's CUDA allocator is gpumem's (gpumem.torch) and gpumem's default resource logs
every call (GPUMEM_CONF=default,log=OUT): the log's app rows are exactly what PyTorch
asked for.

    python3 bench/traces/record_kvcache.py OUT.csv [--batches 6]

The log kept in the source tree, llm-kvcache-gpu.csv (recorded on an H100), is the first
three batches of a six-batch recording, 65,036 calls; the allocations still live at the
cut (the weights) are freed by rows added at its end.
"""

import argparse
import os
import sys


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the CSV log to write")
    ap.add_argument("--batches", type=int, default=6)
    return ap.parse_args()


def serve(batches):
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    vocab, d, layers, heads = 32000, 1024, 8, 16
    hd = d // heads
    dt = torch.bfloat16
    dev = "cuda"
    embed = torch.randn(vocab, d, device=dev, dtype=dt) * 0.02
    w_qkv = [torch.randn(d, 3 * d, device=dev, dtype=dt) * 0.02 for _ in range(layers)]
    w_out = [torch.randn(d, d, device=dev, dtype=dt) * 0.02 for _ in range(layers)]
    w_up = [torch.randn(d, 4 * d, device=dev, dtype=dt) * 0.02 for _ in range(layers)]
    w_down = [torch.randn(4 * d, d, device=dev, dtype=dt) * 0.02 for _ in range(layers)]

    def block(x, layer, cache):
        b, t, _ = x.shape
        q, k, v = (x @ w_qkv[layer]).split(d, dim=-1)
        q, k, v = (y.view(b, t, heads, hd).transpose(1, 2) for y in (q, k, v))
        if cache[layer] is not None:
            k = torch.cat([cache[layer][0], k], dim=2)  # the cache grows: a new tensor, the old freed
            v = torch.cat([cache[layer][1], v], dim=2)
        cache[layer] = (k, v)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=cache[layer][0].shape[2] == t)
        x = x + a.transpose(1, 2).reshape(b, t, d) @ w_out[layer]
        return x + F.gelu(x @ w_up[layer]) @ w_down[layer]

    shapes = [(8, 384, 96), (16, 128, 160), (4, 896, 64), (12, 256, 128), (8, 640, 48), (16, 192, 192)]
    with torch.no_grad():
        for n in range(batches):
            batch, prompt, generate = shapes[n % len(shapes)]
            cache = [None] * layers
            ids = torch.randint(0, vocab, (batch, prompt), device=dev)
            x = embed[ids]
            for layer in range(layers):
                x = block(x, layer, cache)
            token = (x[:, -1] @ embed.t()).argmax(-1, keepdim=True)
            for _ in range(generate):
                x = embed[token]
                for layer in range(layers):
                    x = block(x, layer, cache)
                token = (x[:, -1] @ embed.t()).argmax(-1, keepdim=True)
            del cache, ids, x, token  # the batch is done: its cache goes
    torch.cuda.synchronize()


def main():
    args = parse()
    os.environ["GPUMEM_CONF"] = "default,log=" + os.path.abspath(args.out)
    import gpumem

    gpumem.select_backend("cuda")
    import gpumem.torch

    gpumem.torch.use_gpumem_for_torch()
    serve(args.batches)
    import gc

    gc.collect()
    print("record_kvcache: %d batches recorded into %s" % (args.batches, args.out))
    return 0  # the log is flushed when the process exits (gpumem's exit hook)


if __name__ == "__main__":
    sys.exit(main())
