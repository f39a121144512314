from __future__ import annotations

import pytest

from support import save_timm_checkpoint


@pytest.fixture(scope="session")
def timm_checkpoint(tmp_path_factory):
    """`timm_checkpoint("ghostnet_100")` -> folder with random weights in the HF layout (cached per session)."""
    cache: dict[tuple, object] = {}

    def make(arch: str, **kwargs):
        key = (arch, tuple(sorted(kwargs.items())))
        if key not in cache:
            folder = tmp_path_factory.mktemp(arch.replace("/", "_"))
            cache[key] = save_timm_checkpoint(arch, folder, **kwargs)
        return cache[key]

    return make
