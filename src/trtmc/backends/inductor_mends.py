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


def mend_inductor() -> None:
    """Give Inductor's `CantSplit` default arguments where its class demands them. Idempotent; nothing changes where
    the class demands none or torch has no such class."""
    try:
        from torch._inductor.codegen.simd import CantSplit
    except ImportError:  # a torch without Inductor's SIMD code generation has nothing to mend
        return
    try:
        CantSplit()
    except TypeError:  # the class demands the arguments a bare raise leaves out (torch 2.11)
        CantSplit.__init__ = _with_defaults(CantSplit.__init__)


def _with_defaults(init):
    """torch 2.11's `CantSplit.__init__(self, expr, remaining)`, with both None when a caller leaves them out."""

    @functools.wraps(init)
    def defaulted(self, expr=None, remaining=None):
        init(self, expr, remaining)

    return defaulted
