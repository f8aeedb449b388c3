"""Running the benchmarks on a bare accelerator machine: jax, flax, optax, orbax, chex, jaxtyping and numpy only.

Importing ``agentjax`` pulls in packages that such a machine may not have, though no benchmark uses them:

=================================  =====================================================================
package                            imported by
=================================  =====================================================================
``safetensors``                    ``agentjax.models.hf`` (every ``agentjax.models`` import runs it)
``transformers``, ``tokenizers``   ``agentjax.models.tokenizer`` (idem)
``tensorboardX``                   ``agentjax.train.metrics`` (every ``agentjax.train`` import runs it)
=================================  =====================================================================

(``rich``, which ``agentjax.train.metrics`` and ``model_gpu.py``'s table use, is a dependency of flax: ``flax.linen``
imports it, so wherever flax imports, rich does.)

:func:`stub_missing` puts a placeholder module in ``sys.modules`` for each of them that is not installed (an
installed one is left alone), so the imports succeed; touching anything in a placeholder beyond looking it up
(calling it, instantiating it) raises ``ModuleNotFoundError`` naming the package. The benchmarks use random
token ids instead of the tokenizer.

``python experiments/bench/bare.py model_gpu [ARGS]`` runs ``model_gpu.py``'s ``main`` with ``ARGS`` after
:func:`stub_missing` (``model_gpu.py`` itself imports ``agentjax.models``).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

# module -> its submodules that agentjax imports
OPTIONAL = {
    "safetensors": ("safetensors.numpy",),
    "tokenizers": (),
    "transformers": (),
    "tensorboardX": (),
}


class _MissingMeta(type):
    """Metaclass of placeholders: attribute look-ups give more placeholders, calls raise."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}", cls._package)

    def __call__(cls, *args, **kwargs):
        raise ModuleNotFoundError(f"{cls.__qualname__} needs the package {cls._package!r}, which is not installed "
                                  "(experiments/bench/bare.py put a placeholder in its place)", name=cls._package)


def _placeholder(qualname: str, package: str) -> type:
    return _MissingMeta(qualname.rsplit(".", 1)[-1], (), {"__qualname__": qualname, "_package": package})


class _StubModule(types.ModuleType):
    """A placeholder module: every public attribute is a placeholder class."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{self.__name__}.{name}", self.__name__.split(".")[0])


def stub_missing() -> list[str]:
    """Registers placeholders for the packages of :data:`OPTIONAL` that are not installed; returns their names."""
    stubbed = []
    for top, subs in OPTIONAL.items():
        if top in sys.modules or importlib.util.find_spec(top) is not None:
            continue
        for name in (top, *subs):
            module = _StubModule(name, f"placeholder: {top!r} is not installed")
            module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=name == top)
            module.__path__ = []
            sys.modules[name] = module
            if name != top:
                setattr(sys.modules[top], name.rsplit(".", 1)[-1], module)
            stubbed.append(name)
    return stubbed


def plain_table(rows: list[dict], columns: tuple[str, ...], title: str = "") -> None:
    """Prints ``rows`` (dicts) as a fixed-width text table of ``columns`` (missing values blank)."""

    def cell(v) -> str:
        if v is None:
            return ""
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    if title:
        print(title)
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))


def run_model_gpu(argv: list[str]) -> None:
    """``model_gpu.py``'s ``main`` on ``argv``, with placeholders for the missing packages."""
    stub_missing()
    import model_gpu  # experiments/bench is sys.path[0] when this file runs as a script

    sys.argv = ["model_gpu.py", *argv]
    model_gpu.main()


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "model_gpu":
        sys.exit("usage: python experiments/bench/bare.py model_gpu [model_gpu.py arguments]")
    run_model_gpu(sys.argv[2:])
