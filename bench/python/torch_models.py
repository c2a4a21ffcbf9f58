"""The PyTorch model that bench/e2e_torch.py trains and bench/traces/record_torch.py
records: a GPT-like stack of pre-norm transformer layers with a tied output head."""


def transformer(vocab, width, layers, heads, max_length):
    """A new model (on the CPU): token and position embeddings, `layers` pre-norm
    encoder layers with a causal mask, the embedding as the output head."""
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.pos = nn.Embedding(max_length, width)
            layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.1, batch_first=True,
                                               norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(width)

        def forward(self, ids):
            seq = ids.shape[1]
            x = self.embed(ids) + self.pos(torch.arange(seq, device=ids.device))
            mask = nn.Transformer.generate_square_subsequent_mask(seq, device=ids.device)
            x = self.blocks(x, mask=mask, is_causal=True)
            return self.norm(x) @ self.embed.weight.t()

    return Model()


def train_step(model, optimizer, vocab, batch, length):
    """One bf16 training step of `model` on random tokens, `batch` sequences of `length`:
    forward, cross-entropy against random labels, backward, optimizer step. Everything
    the step allocated is freed when it returns (the device work may still run)."""
    import torch
    import torch.nn.functional as F

    ids = torch.randint(0, vocab, (batch, length), device="cuda")
    labels = torch.randint(0, vocab, (batch, length), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(ids)
        loss = F.cross_entropy(logits.float().view(-1, vocab), labels.view(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
