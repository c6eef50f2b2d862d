"""decoding: a small Llama inference engine with packed batches and multi-sample speculative decoding."""
