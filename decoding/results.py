"""GenerationResult: tokens, texts and timings of one ``generate`` call."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["GenerationResult"]


@dataclass
class GenerationResult:
    """What :func:`decoding.generate` returns.

    Attributes
    ----------
    tokens : list of list of int
        Generated ids of each prompt (prompt excluded; the EOS token, if produced, included).
    texts : list of str
        Decoded generated text of each prompt, cut before a stop string; special tokens dropped.
    prompt_tokens : list of list of int
    finish_reasons : list of str
        ``"eos"``, ``"stop"`` (a stop string) or ``"length"`` (``max_new_tokens`` reached).
    prefill_time, decode_time : float
        Seconds spent in the prompt forward and in the decode steps.
    step_times : list of float
        Seconds of each decode step (one forward plus sampling).
    method : str
        ``"autoregressive"``, ``"ems"`` or ``"vanilla"`` (speculative; then ``stats`` holds the
        drafter, accepted and verified draft tokens, forwards, tokens per forward, padding; for
        autoregressive decoding, the forwards and tokens per forward).

    Examples
    --------
    >>> r = GenerationResult([[5, 6]], ["hi"], [[1, 2]], ["length"], 0.5, 1.0, [1.0])
    >>> r.prefill_tokens_per_s, r.decode_tokens_per_s
    (4.0, 1.0)
    """

    tokens: list
    texts: list
    prompt_tokens: list
    finish_reasons: list
    prefill_time: float
    decode_time: float
    step_times: list = field(default_factory=list)
    method: str = "autoregressive"
    stats: dict = field(default_factory=dict)

    @property
    def n_prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompt_tokens)

    @property
    def n_generated(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def prefill_tokens_per_s(self) -> float:
        """Prompt tokens processed per second in the prefill."""
        return self.n_prompt_tokens / self.prefill_time if self.prefill_time > 0 else float("nan")

    @property
    def decode_tokens_per_s(self) -> float:
        """Generated tokens per second over the decode steps (all sequences together).

        The first generated token of each sequence comes from the prefill's logits, so it is not
        counted here.
        """
        n = self.n_generated - sum(1 for t in self.tokens if t)
        # NaN where no step decoded (max_new_tokens=1: every token came from the prefill); 0.0 had
        # made the demo's speed-up a ZeroDivisionError
        return n / self.decode_time if n and self.decode_time > 0 else float("nan")

    @property
    def time_per_step(self) -> float:
        """Mean seconds per decode step."""
        return sum(self.step_times) / len(self.step_times) if self.step_times else float("nan")

    @property
    def total_time(self) -> float:
        return self.prefill_time + self.decode_time

    # -- speculative statistics (``stats`` of the "ems" and "vanilla" methods) ---------------------
    @property
    def mean_accepted(self) -> float:
        """Mean accepted draft tokens per step per sample (each step also adds one target token)."""
        return float(self.stats.get("mean_accepted", float("nan")))

    @property
    def target_forwards(self) -> int:
        """Forward passes of the target model, prefill included."""
        return int(self.stats.get("target_forwards", 1 + len(self.step_times)))

    @property
    def tokens_per_forward(self) -> float:
        """Tokens computed per decode forward (pads included); the batch size for autoregressive."""
        if "tokens_per_forward" in self.stats:
            return float(self.stats["tokens_per_forward"])
        return float(len(self.tokens))

    @property
    def padding_fraction(self) -> float:
        """Fraction of the computed decode tokens that were padding (vanilla only; else 0)."""
        return float(self.stats.get("padding_fraction", 0.0))
