"""A word-level ``transformers`` fast tokenizer over a fixed corpus, with Qwen's chat-turn layout: a policy with a
vocabulary of a few dozen tokens instead of Qwen's 151,936, for small text environments (the credit-testbed MDPs,
``RunConfig.tokenizer = "words:mdp"``: :mod:`agentjax.train.tokenizers`) and for tests that train many updates on a
CPU.

The pieces are what :data:`PIECES` cuts: chat markers, ``<action>`` / ``</action>``, a word of letters (or
underscores) with its leading space, one digit with its leading space (numbers are read digit by digit, so the
vocabulary stays finite), a newline, a single space or one punctuation mark. ``decode(encode(text)) == text`` for
every text made of the corpus's pieces; anything else is ``[UNK]``. The vocabulary is the four special tokens
(:data:`SPECIAL`, ids 0-3) and then the corpus's pieces in sorted order, so the same corpus gives the same ids.
The chat template writes ``<|im_start|>role\\ncontent<|im_end|>\\n`` per message and ``<|im_start|>assistant\\n``
as the generation prompt, as Qwen2.5's does (without its default system message).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

ENDOFTEXT, IM_START, IM_END, UNK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "[UNK]"
SPECIAL = (ENDOFTEXT, IM_START, IM_END, UNK)  # ids 0, 1, 2, 3
ENDOFTEXT_ID, IM_START_ID, IM_END_ID, UNK_ID = range(4)
STOP_IDS = (IM_END_ID, ENDOFTEXT_ID)  # a reply ends at either (as Qwen's <|im_end|>, <|endoftext|>)
MAX_WORD_TOKENIZER_BYTES = 4 << 20  # a larger tokenizer.json is not a word tokenizer's (is_word_tokenizer)
PIECES = r"<\|im_start\|>|<\|im_end\|>|<\|endoftext\|>|</?action>| ?[^\W\d]+| ?\d|\n|[^\w\s]| "
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def pieces(text: str) -> list[str]:
    """The pieces of ``text`` (:data:`PIECES`), in order: what the tokenizer looks up, one id each."""
    return re.findall(PIECES, text)


def word_tokenizer(corpus: Iterable[str], folder: str | os.PathLike | None = None) -> PreTrainedTokenizerFast:
    """The tokenizer of ``corpus``'s pieces (plus the chat roles), saved to ``folder`` and loaded back from it with
    ``AutoTokenizer`` (so ``folder`` is a tokenizer folder like a checkpoint's); ``folder=None``: a temporary one,
    removed once the tokenizer is loaded (it lives in memory)."""
    if folder is None:
        with tempfile.TemporaryDirectory() as tmp:
            return word_tokenizer(corpus, tmp)
    found = set()
    for text in [*corpus, "system\n", "user\n", "assistant\n"]:
        found.update(pieces(text))
    vocab = {token: i for i, token in enumerate(SPECIAL)}
    for piece in sorted(found - set(SPECIAL)):
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


def is_word_tokenizer(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a tokenizer of :func:`word_tokenizer` (a word-level model with :data:`SPECIAL` at
    ids 0-3), as opposed to a Qwen checkpoint's."""
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path) or os.path.getsize(path) > MAX_WORD_TOKENIZER_BYTES:  # Qwen's is 7 MB: not parsed
        return False
    with open(path) as f:
        model = json.load(f).get("model", {})
    vocab = model.get("vocab", {})
    return model.get("type") == "WordLevel" and all(vocab.get(t) == i for i, t in enumerate(SPECIAL))


__all__ = ["CHAT_TEMPLATE", "ENDOFTEXT", "ENDOFTEXT_ID", "IM_END", "IM_END_ID", "IM_START", "IM_START_ID", "PIECES",
           "SPECIAL", "STOP_IDS", "UNK", "UNK_ID", "is_word_tokenizer", "load_word_tokenizer", "pieces",
           "word_tokenizer"]
