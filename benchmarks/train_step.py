"""Command ``train-step``: one training step of a small Llama model (Hugging Face transformers, grouped-query attention), our attention against SDPA's in one run.

    python -m benchmarks train-step [--dtypes bf16,fp32] [--batch 4] [--seq-len 2048]
                                    [--layers 4] [--out FILE.json]

The model is ``transformers.LlamaForCausalLM`` with hidden size 1024, 16 query heads and 4
key/value heads (head dim 64), intermediate size 2816, a 32000-token vocabulary and ``--layers``
layers; two copies with the same random weights run with ``attn_implementation="sdpa"``
(PyTorch's choice of backend) and ``"ioaware"`` (`ioaware.integrations.transformers`). A step
is the forward on ``--batch`` random sequences of ``--seq-len`` tokens (no padding: causal
attention without a mask), the next-token cross-entropy, the backward and an AdamW update.
After three warm-up steps each (compiling, or loading from the kernel cache, and preparing) and
one step for each one's peak memory, steps are timed by CUDA events around synchronous calls
(`benchmarks.common.time_cuda`, ``timing="sync"``: what a training loop sees, host work
included) in `ROUNDS` alternating rounds, each the median of 3 to 10 steps of ours and then of
SDPA's. Per dtype it records each round's median (``*_ms_rounds``) and their median, p10 and
p90, the ratio SDPA / ours of each round (``ratio_rounds``) and their median (above 1: ours
faster), tokens per second, the first step's loss of each (same weights, same batch) and the
peak memory; it writes a JSON file with provenance.
"""
from __future__ import annotations

import argparse
import copy
import json

from .common import (command_line, first_sentence, provenance, summarize_times, time_cuda,
                     torch_dtype, write_json)

HIDDEN, HEADS, KV_HEADS, INTERMEDIATE, VOCAB = 1024, 16, 4, 2816, 32000
#: Alternating timing rounds (each: ours and SDPA, the median of 3 to 10 steps each).
ROUNDS = 7


def build_pair(torch, transformers, dtype, layers, seq_len, device="cuda"):
    """The same random weights under "sdpa" and under "ioaware", each with its AdamW, as
    ``[(name, model, optimizer), ...]``."""
    import ioaware.integrations.transformers as ioaware_hf
    ioaware_hf.register()
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN,
                                      intermediate_size=INTERMEDIATE, num_hidden_layers=layers,
                                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                                      max_position_embeddings=seq_len)
    torch.manual_seed(0)
    sdpa = transformers.LlamaForCausalLM(copy.deepcopy(config)).to(device=device, dtype=dtype)
    ours = transformers.LlamaForCausalLM(copy.deepcopy(config)).to(device=device, dtype=dtype)
    ours.load_state_dict(sdpa.state_dict())
    sdpa.set_attn_implementation("sdpa")
    ours.set_attn_implementation("ioaware")
    return [(name, model.train(), torch.optim.AdamW(model.parameters(), lr=1e-5))
            for name, model in (("sdpa", sdpa), ("ioaware", ours))]


def train_step(model, optimizer, ids):
    """Forward, next-token loss, backward, AdamW update; returns the loss (a tensor)."""
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def main(argv=None) -> int:
    argv = list(argv or [])
    ap = argparse.ArgumentParser(prog="python -m benchmarks train-step",
                                 description=first_sentence(__doc__))
    ap.add_argument("--dtypes", default="bf16,fp32", help="comma-separated: bf16, fp16, fp32")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--out", default=None, help="JSON file to write (with provenance)")
    args = ap.parse_args(argv)
    dtypes = args.dtypes.split(",")
    for dt in dtypes:
        if dt not in ("bf16", "fp16", "fp32"):
            ap.error(f"--dtypes: {dt!r} is not bf16, fp16 or fp32")
    if min(args.batch, args.seq_len, args.layers) < 1:
        ap.error("--batch, --seq-len and --layers must be positive")

    import torch
    import transformers
    prov = provenance(command_line("train-step", argv))
    rows = []
    for dt in dtypes:
        dtype = torch_dtype(torch, dt)
        pair = build_pair(torch, transformers, dtype, args.layers, args.seq_len)
        g = torch.Generator(device="cuda").manual_seed(1)
        ids = torch.randint(0, VOCAB, (args.batch, args.seq_len), device="cuda", generator=g)
        row = {"dtype": dt, "batch": args.batch, "seq_len": args.seq_len, "layers": args.layers,
               "hidden": HIDDEN, "heads": HEADS, "heads_kv": KV_HEADS, "head_dim": HIDDEN // HEADS}
        steps = {}
        for name, model, opt in pair:
            row[f"first_loss_{name}"] = float(train_step(model, opt, ids).detach())
            for _ in range(2):
                train_step(model, opt, ids)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            train_step(model, opt, ids)
            torch.cuda.synchronize()
            row[f"{name}_peak_bytes"] = int(torch.cuda.max_memory_allocated())
            steps[name] = lambda m=model, o=opt: train_step(m, o, ids)
        # -- ROUNDS alternating rounds: a drift of the machine's speed during the run moves
        #    both sides of a round's ratio alike --
        medians = {name: [] for name in steps}
        for _ in range(ROUNDS):
            for name, step in steps.items():
                medians[name].append(time_cuda(torch, step, warmup=1, min_reps=3, max_reps=10,
                                               budget_s=0.5)[0])
        for name, ms in medians.items():
            med, p10, p90 = summarize_times(ms)
            row.update({f"{name}_ms": med, f"{name}_ms_p10": p10, f"{name}_ms_p90": p90,
                        f"{name}_ms_rounds": ms,
                        f"{name}_tokens_per_s": args.batch * args.seq_len / (med * 1e-3)})
        row["ratio_rounds"] = [a / b for a, b in zip(medians["sdpa"], medians["ioaware"])]
        row["ratio_sdpa_over_ioaware"] = summarize_times(row["ratio_rounds"])[0]
        rows.append(row)
        print(f"{dt}: ioaware {row['ioaware_ms']:.2f} ms, sdpa {row['sdpa_ms']:.2f} ms, "
              f"ratio {row['ratio_sdpa_over_ioaware']:.2f}x; first loss "
              f"{row['first_loss_ioaware']:.4f} / {row['first_loss_sdpa']:.4f}", flush=True)
        del pair
        torch.cuda.empty_cache()
    doc = {"schema": "ioaware.train_step/1", "provenance": prov, "records": rows}
    if args.out:
        write_json(doc, args.out)
        print(f"wrote {args.out}")
    else:
        print(json.dumps(rows, indent=1))
    return 0
