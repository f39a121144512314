"""Mends for defects of the PyTorch releases trtmc compiles with, applied in each process before Inductor compiles.

One so far: torch 2.11's Inductor checks whether a kernel's iteration ranges split into a candidate tiling by raising
`CantSplit`, whose class takes two arguments (the expression and what remained), while one of its `raise` sites gives
none. The check (`SIMDKernel.is_compatible`) catches `CantSplit` to answer "does not fit"; the bare raise fails with a
TypeError first, and the whole compile with it. Run 41 (an H100) met it compiling timm's swinv2_tiny_window8_256 as
the bench's expert baseline, run 14 (an H200) too, where runs 18-36 compiled the same model: which tilings Inductor
tries varies. torch 2.14's raises all give the two arguments. The mend gives the class defaults, so the check answers
"does not fit" as the later release does; a compile that worked before never reached that raise, so its kernels do
not change.
"""

from __future__ import annotations

import functools
import inspect


def mend_inductor() -> None:
    """Give Inductor's `CantSplit` default arguments where its class demands them. Idempotent; nothing changes where
    the class demands none or torch has no such class."""
    try:
        from torch._inductor.codegen import simd
    except ImportError:  # a torch without Inductor's SIMD code generation has nothing to mend
        return
    cant_split = getattr(simd, "CantSplit", None)
    if cant_split is None or getattr(cant_split, "_trtmc_mended", False):
        return
    demanded = _demanded_arguments(cant_split.__init__)
    if demanded:
        cant_split.__init__ = _with_defaults(cant_split.__init__, demanded)
    cant_split._trtmc_mended = True


def _demanded_arguments(init) -> int:
    """How many positional arguments after `self` `init` demands (those without a default)."""
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    parameters = list(inspect.signature(init).parameters.values())[1:]
    return sum(p.kind in positional and p.default is inspect.Parameter.empty for p in parameters)


def _with_defaults(init, demanded: int):
    """`init`, with its `demanded` positional arguments all None when a caller gives no argument at all."""

    @functools.wraps(init)
    def defaulted(self, *args, **kwargs):
        if not args and not kwargs:
            args = (None,) * demanded
        init(self, *args, **kwargs)

    return defaulted
