"""Hugging Face ``transformers`` on the CPU, the same GGUF, as a peer of the decoding benchmark.

Run by ``benchmarks/decoding_engine.py`` inside the optional ``.venv-torch`` (``make torch``), never
imported by the project: ``python benchmarks/transformers_worker.py GGUF_PATH`` reads
``{"prompt": [ids], "n_decode": N}`` on stdin and prints one JSON line, a list with one entry per
thread count (1 and all logical CPUs): prefill tokens/s of the prompt at batch 1, and greedy decode
tokens/s at batch 1 and 8 after 64 prompt tokens (medians of 3). ``transformers`` dequantizes the
Q4_1/Q8_0 tensors to float32 on load, as our engine does, and runs PyTorch's CPU kernels; the
decode loop is written out (a forward of one token per sequence with the model's own KV cache) so
that ``generate``'s bookkeeping is not timed.

Examples
--------
::

    echo '{"prompt": [1, 2, 3], "n_decode": 4}' | \
        .venv-torch/bin/python benchmarks/transformers_worker.py model.gguf
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main(path: str) -> None:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    req = json.loads(sys.stdin.read())
    p = Path(path)
    model = AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name, dtype=torch.float32)
    model.eval()
    prompt = torch.tensor([req["prompt"]], dtype=torch.long)
    n_decode = int(req["n_decode"])
    results = []

    def decode_rate(batch: int) -> float:
        ids = prompt[:, :64].repeat(batch, 1)
        out = model(ids, use_cache=True)
        cache, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        t = time.perf_counter()
        for _ in range(n_decode):
            out = model(tok, past_key_values=cache, use_cache=True)
            cache, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        return batch * n_decode / (time.perf_counter() - t)

    with torch.inference_mode():
        for threads in sorted({1, os.cpu_count() or 1}):
            torch.set_num_threads(threads)
            model(prompt[:, :8])  # warm-up
            times = []
            for _ in range(3):
                t = time.perf_counter()
                model(prompt, use_cache=True)
                times.append(time.perf_counter() - t)
            results.append(
                {
                    "threads": threads,
                    "prefill_tok_s": prompt.shape[1] / float(np.median(times)),
                    "decode_tok_s": float(np.median([decode_rate(1) for _ in range(3)])),
                    "decode_b8_tok_s": float(np.median([decode_rate(8) for _ in range(3)])),
                }
            )
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
