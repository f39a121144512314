"""What Inductor's `realize_reads_threshold` does to a ViT's add-and-layer-norm kernels, on the CPU (no timing).

Inductor stores a reused pointwise result only when it reads more than `realize_reads_threshold` buffers (default 4),
so in a ViT each residual add is recomputed inside the next layer norms until the sum reads five maps; on the GPU
that made vit_base_patch16_224's 23 add-and-layer-norm kernels four kernels moving 3, 4, 5 and 7 maps
(benchmarks/NOTES.md, run 42). This compiles a small timm ViT with the default and with a threshold of 1 and prints,
for each add-and-layer-norm launch in order, its kernel's pointer arguments (inputs, outputs; the norm's weight and
bias are two of the inputs, the CPU kernels' mean and rstd two of the outputs, an updated-in-place buffer an output).

    python tools/realize_reads_probe.py [--arch vit_tiny_patch16_224] [--depth 8]
"""

from __future__ import annotations

import argparse
import re


def launches(code: str) -> list[tuple[int, int]]:
    """(inputs, outputs) per add-and-layer-norm launch, from the kernels' pybinding signatures in Inductor's code."""
    signatures = dict(re.findall(r"(cpp_fused_add_native_layer_norm_view_\d+) = async_compile\.cpp_pybinding\(\[([^\]]*)\]", code))
    shape = {}
    for name, text in signatures.items():
        args = [a.strip() for a in text.split(",")]
        shape[name] = (sum("const" in a for a in args), sum("*" in a and "const" not in a for a in args))
    return [shape[name] for name in re.findall(r"\n\s+(cpp_fused_add_native_layer_norm_view_\d+)\(", code)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="vit_tiny_patch16_224", help="a timm ViT (default vit_tiny_patch16_224)")
    parser.add_argument("--depth", type=int, default=8, help="blocks (default 8: two cycles of the default's four kernels)")
    args = parser.parse_args()

    import timm
    import torch
    import torch._inductor.config as inductor_config
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    model = timm.create_model(args.arch, depth=args.depth, pretrained=False).eval()
    pixels = torch.randn(2, *model.pretrained_cfg["input_size"])  # the ViT's own input size, as --arch may change it
    for threshold in (inductor_config.realize_reads_threshold, 1):
        torch._dynamo.reset()
        with inductor_config.patch(realize_reads_threshold=threshold, fx_graph_cache=False), torch.no_grad():
            _, codes = run_and_get_code(torch.compile(model), pixels)
        shapes = launches("\n".join(codes))
        print(f"realize_reads_threshold={threshold}: {len(shapes)} launches of {len(set(shapes))} argument shapes; "
              f"(inputs, outputs) in order: {shapes}")


if __name__ == "__main__":
    main()
