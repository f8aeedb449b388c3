"""The policy: the Qwen2/2.5 and Qwen3 decoder (Flax NNX), HF checkpoints, the sampler, the tokenizer.

- :mod:`~agentjax.models.config` — :class:`QwenConfig` with presets and ``config.json`` I/O.
- :mod:`~agentjax.models.qwen` — the decoder and its static :class:`KVCache`.
- :mod:`~agentjax.models.logprobs` — chosen-token log-probs / entropies, chunked over the sequence.
- :mod:`~agentjax.models.hf` — safetensors load (straight into sharded arrays) and save in HF layout.
- :mod:`~agentjax.models.sampling` — what a sampler takes and returns: sampling parameters, outputs, prompt padding.
- :mod:`~agentjax.models.sampler` — jitted prefill + decode loop; stop tokens/strings; constrained decoding.
- :mod:`~agentjax.models.choose` — constrained choice among a few whole answers in one teacher-forced pass.
- :mod:`~agentjax.models.constrain` — the token trie of allowed strings.
- :mod:`~agentjax.models.tokenizer` — the real Qwen tokenizer (checkpoint folder or offline BPE files).
- :mod:`~agentjax.models.word_tokenizer` — a word-level tokenizer over a fixed corpus (small text envs, tests).
"""

from agentjax.models.config import QwenConfig
from agentjax.models.constrain import TokenTrie, build_trie, build_trie_from_strings
from agentjax.models.hf import load_hf, save_hf
from agentjax.models.logprobs import chunked_logprobs
from agentjax.models.qwen import ActivationSharding, DecoderOutput, KVCache, Qwen, positions_from_segments
from agentjax.models.sampler import Sampler
from agentjax.models.sampling import Finish, SampleOutput, SamplingParams
from agentjax.models.tokenizer import load_tokenizer, stop_token_ids

__all__ = [
    "ActivationSharding",
    "DecoderOutput",
    "Finish",
    "KVCache",
    "Qwen",
    "QwenConfig",
    "SampleOutput",
    "Sampler",
    "SamplingParams",
    "TokenTrie",
    "build_trie",
    "build_trie_from_strings",
    "chunked_logprobs",
    "load_hf",
    "load_tokenizer",
    "positions_from_segments",
    "save_hf",
    "stop_token_ids",
]
