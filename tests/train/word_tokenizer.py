"""A word-level ``transformers`` fast tokenizer over a fixed corpus, with Qwen's chat-turn layout: a policy with a
vocabulary of a few dozen tokens instead of Qwen's 151,936, for tests that train many updates on a CPU.

The pieces are what :data:`PIECES` cuts (chat markers, ``<action>`` / ``</action>``, a word with its leading space,
a newline, a single space or punctuation mark), so ``decode(encode(text)) == text`` for every text made of the
corpus's pieces; anything else is ``[UNK]``. The chat template writes ``<|im_start|>role\\ncontent<|im_end|>\\n``
per message and ``<|im_start|>assistant\\n`` as the generation prompt, as Qwen2.5's does (without its default
system message).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

ENDOFTEXT, IM_START, IM_END, UNK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "[UNK]"
SPECIAL = (ENDOFTEXT, IM_START, IM_END, UNK)  # ids 0, 1, 2, 3
PIECES = r"<\|im_start\|>|<\|im_end\|>|<\|endoftext\|>|</?action>| ?\w+|\n|[^\w\s]| "
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def word_tokenizer(corpus: Iterable[str], folder: str | os.PathLike) -> PreTrainedTokenizerFast:
    """The tokenizer of ``corpus``'s pieces (plus the chat roles), saved to ``folder`` and loaded back from it with
    ``AutoTokenizer`` (so ``folder`` is a tokenizer folder like a checkpoint's)."""
    pieces = set()
    for text in [*corpus, "system\n", "user\n", "assistant\n"]:
        pieces.update(re.findall(PIECES, text))
    vocab = {token: i for i, token in enumerate(SPECIAL)}
    for piece in sorted(pieces - set(SPECIAL)):
        vocab[piece] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(PIECES), behavior="isolated")
    tok.decoder = decoders.Fuse()
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=ENDOFTEXT, unk_token=UNK,
                                      additional_special_tokens=[IM_START], chat_template=CHAT_TEMPLATE,
                                      clean_up_tokenization_spaces=False)
    wrapped.save_pretrained(folder)
    return load_word_tokenizer(folder)


def load_word_tokenizer(folder: str | os.PathLike, family: str | None = None) -> PreTrainedTokenizerFast:
    """The tokenizer saved in ``folder`` (the signature of :func:`agentjax.models.load_tokenizer`, which accepts
    Qwen tokenizers only; ``family`` is ignored)."""
    del family
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)
