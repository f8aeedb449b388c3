"""The tokenizer of a run (``RunConfig.tokenizer``): the Qwen tokenizer, a tokenizer folder, or a word-level one.

``RunConfig.tokenizer`` is one of

- ``None``: the offline Qwen2.5 tokenizer (:func:`agentjax.models.load_tokenizer`);
- ``"words:<env>"``: a word-level tokenizer (:mod:`agentjax.models.word_tokenizer`) over :func:`word_corpus` of the
  env — every word its observations can contain (``Env.vocabulary()``, which such an env defines: envs/mdp), its
  prompt templates of both styles (:mod:`agentjax.agents.prompts`, :mod:`agentjax.agents.compact`), the history
  records and the constrained reply format. The corpus is fixed by the code, so the same spec gives the same ids in
  every process (a resumed run, ``agentjax eval``): nothing is written to disk. The credit-testbed MDPs' tiny preset
  uses ``"words:mdp"`` (about 200 tokens instead of Qwen's 151,936 rows);
- a folder: a word tokenizer saved by :func:`~agentjax.models.word_tokenizer.word_tokenizer`, or a Qwen checkpoint's
  tokenizer (:func:`agentjax.models.load_tokenizer`).
"""

from __future__ import annotations

import re
from typing import Any

from agentjax.agents.compact import PROMPT_STYLES, templates
from agentjax.agents.prompts import PromptTemplate, render_history
from agentjax.models.tokenizer import load_tokenizer
from agentjax.models.word_tokenizer import is_word_tokenizer, load_word_tokenizer, word_tokenizer
from agentjax.rollout.collect import CollectConfig
from agentjax.train.runconfig import ENVS, WORDS_PREFIX

_FIELD = re.compile(r"\{\w+\}")
_WORD = re.compile(r"[^\W\d]+")


def _texts(template: PromptTemplate) -> list[str]:
    """The fixed text of a template (its format fields blanked)."""
    parts = (template.first_turn, template.with_history, template.action_hint, template.admissible_block,
             template.action_item, template.action_sep, template.system or "")
    return [_FIELD.sub(" ", p) for p in parts]


def word_corpus(env: str) -> list[str]:
    """The texts a word tokenizer of ``env`` is built from (module docstring): every word alone and after a space,
    the ten digits alike, the templates' texts, a history record, the constrained reply format, a lone space."""
    if env not in ENVS:
        raise ValueError(f"words:{env}: unknown env; one of {sorted(ENVS)}")
    cls = ENVS[env].env_class()
    if not hasattr(cls, "vocabulary"):
        raise ValueError(f"words:{env}: {cls.__name__} has no vocabulary() (the words its observations can contain); "
                         "a word tokenizer needs one")
    texts = [" ".join(str(i) for i in range(10)) + " 0123456789", " "]
    texts += [f"{w} {w}" for w in cls.vocabulary()]
    for style in PROMPT_STYLES:
        if env in templates(style):
            texts += _texts(templates(style)[env])
    texts += [render_history([("o", "a")], 1), CollectConfig().constrained_format.replace("{action}", " ")]
    texts += [f"{w} {w}" for text in list(texts) for w in _WORD.findall(text)]
    return sorted(set(texts))


def run_tokenizer(spec: str | None) -> Any:
    """The tokenizer of ``RunConfig.tokenizer`` (module docstring)."""
    if spec is None:
        return load_tokenizer()
    if spec.startswith(WORDS_PREFIX):
        return word_tokenizer(word_corpus(spec.removeprefix(WORDS_PREFIX)))
    if is_word_tokenizer(spec):
        return load_word_tokenizer(spec)
    return load_tokenizer(spec)


__all__ = ["run_tokenizer", "word_corpus"]
