"""The CUDA engine's lowerings: the candidates a build times at each batch size, the choice it records, and
the compiled graph that runs the chosen one.

The plain lowering runs depthwise convolutions as fused taps and 1x1 convolutions on 1x1 maps as products
where those measured faster (`torch_lowering`); the cuDNN-fused one also runs each half-precision convolution
with its bias, residual add and ReLU as one cuDNN call (`fused_convolutions`); the depthwise-kernel one runs
the depthwise convolutions the plain one leaves to cuDNN on trtmc's Triton kernels (`depthwise_kernel`); the
GEMM-templates one lets Inductor pick each matrix product's kernel among its Triton templates and
cuBLAS by timing them (in transformers, at batch 1). A build compiles each candidate, replays it in a CUDA
graph, times them interleaved under the GPU's timing lock (`gpu_lock`) and records the choice in the engine's
record (`LOWERINGS`); loading compiles the recorded one from the caches.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Mapping

import torch

from ..graph import Graph, Node, OpKind
from . import Progress
from .fused_convolutions import fused_convolutions
from .gelu_products import gelu_products
from .gpu_lock import device_lock, share_gpu_with_timing, timing_alone
from .inductor_mends import mend_inductor
from .torch_lowering import (
    channels_last_weights, depthwise_taps_nodes, is_depthwise, patch_product_nodes, to_fx, vector_product_nodes,
)

log = logging.getLogger(__name__)


LOWERINGS = "lowerings"  # the engine record's key: per batch size, the lowering chosen at build and why
INDUCTOR_OPTIONS = "inductor_options"  # the engine record's key: the Inductor options the build compiled with
PATCH_PRODUCTS = "patch_products"  # the engine record's key: the patch embeddings the build ran as matrix products
GELU_PRODUCTS = "gelu_products"  # the engine record's key: the GELUs the build ran with their product (cuBLASLt)
PLAIN, FUSED, KERNEL, GEMM = "plain", "cudnn-fused", "depthwise-kernel", "gemm-templates"
# A candidate replaces the plain lowering only when its quickest replay is at least this much faster: two
# compiles of the same graph time within ~1% of each other (benchmarks/NOTES.md, run 6).
MIN_GAIN = 0.01


# Inductor's programmatic dependent launch (`triton.enable_pdl`, Hopper and later): each Triton kernel is launched
# before the one it follows has finished and waits in-kernel for its inputs, which a batch-1 engine of ~60-150
# kernels of 2-5 us could use. Off: measured (run 27, H100, `gpu_session.sh pdl`) on the expert at batch 1,
# ghostnet_100 0.988x and efficientnet_b0 1.004x, the same kernels; a replay there is only ~30 us over its kernels' sum.
LAUNCH_DEPENDENTS_EARLY = False
PDL = "triton.enable_pdl"

# trtmc's Triton depthwise kernels (`depthwise_kernel`) as a candidate where cuDNN runs at least `MIN_ON_KERNEL`
# depthwise convolutions, at batch sizes above 1 only where the window kernel runs at least `MIN_ON_KERNEL` of
# them (stride 1, up to 9x9; `on_window`): at batch 1 cuDNN takes ~8 us for each (edgenext_small, run 19), a few
# times what the map's bytes need; fewer than 4 of them cannot pay for the candidate's compile (~30 s of a build).
# Measured (`gpu_session.sh dwtriton`, H100): run 21, batch 1, the flat kernel: edgenext_small 0.516 -> 0.465 ms,
# convnext_tiny 0.555 -> 0.489, efficientnet_b0 0.422 -> 0.412, ghostnet_100 (2 on the kernel) 0.341 -> 0.358, every
# model slower at batch 128 (run 28 with the tile of run 22: edgenext_small -1.4%, fastvit_t8 +3.9%). Run 29, the
# row kernel for stride 1 with its taps laid out for it (`taps_major_weights`), batch 1: convnext_tiny 0.552 ->
# 0.449, edgenext_small 0.513 -> 0.433, fastvit_t8 0.585 -> 0.515; batch 128: convnext_tiny 7.874 -> 7.724,
# edgenext_small 5.531 -> 5.124, fastvit_t8 8.821 -> 8.652, each with 7x7 depthwise convolutions (networks of 3x3
# and 5x5 ones are not measured at batch 128 in their engines, and one at a time overpredicted convnext_tiny's gain
# fourfold). Since run 31 the window kernel runs them (one at a time at batch 128: convnext_tiny's 18 in 1,422 us
# against the row kernel's 2,243, edgenext_small's 21 in 505 against 777; edgenext's 3x3 ones 2-3x quicker than
# cuDNN's, so since run 32 networks of 3x3 and 5x5 ones are offered the candidate at batch 128 too, where before
# only those with four 7x7 or wider were; the strided ones still run on the flat kernel in it, as in mixnet_s's and
# fastvit_t8's engines since run 30). A build times the candidate against the plain lowering and keeps the faster.
# Run 32 (the bench's builds, H100, batch 128): of the 13 networks newly offered it, it timed quicker than the plain
# lowering on 5 (xception65 -10.2%, tf_efficientnetv2_s -4.5%, mobileone_s1 -3.6%, mobilenetv4_conv_small -3.4%,
# efficientvit_b1 -0.2%) and slower on 8 (+2.3% lcnet_100 to +18.2% hardcorenas_a; ghostnet_100 +9.6%,
# efficientnet_b0 +5.5%); only tf_efficientnetv2_s kept it, the cuDNN-fused lowering being quicker still on three.
DEPTHWISE_KERNEL_AT_BUILD = True
MIN_ON_KERNEL = 4

# Inductor's Triton GEMM templates beside cuBLAS (`max_autotune_gemm`: each matrix product's choices benchmarked
# at compile, the winner's bias and activation fused into its epilogue) as a candidate where the graph has at
# least `MIN_GEMMS` matrix products (transformers: 37-52 in the bench's; convolutional networks have one, their
# classifier), at batch sizes up to `GEMM_TEMPLATES_MAX_BATCH`. Measured on timm's model under torch.compile
# (tools/autotune_probe.py, run 24, H100): vit_base_patch16_224 at batch 1 0.617 -> 0.575 ms, for 39.7 s of
# compile against 2.5 s; batch 128 not yet measured. A load that hits the bundle's caches gets the chosen
# kernels without benchmarking; one that misses them (another GPU, another torch) autotunes again.
# Autotuning costs per distinct GEMM shape, so the candidate is offered only where at most `MAX_GEMM_SHAPES`
# shapes serve the products. Run 25 (H100, the bench's 14-process prepare) offered it to 7 transformers: it won
# where 5 shapes serve 49 products (vit_base_patch16_224 0.566 -> 0.522 ms, beit_base_patch16_224 0.614 -> 0.569;
# builds 181 and 81 s, against 24 and 14 s in run 24) and where 13-20 do it cost 100-275 s of build for at most
# 10% (levit_128s, 17 shapes: 0.295 -> 0.266 ms, 275 s against 13; swin_tiny 2%, edgenext_small 1%;
# swinv2_tiny and mobilevit_s kept plain after 184 and 201 s).
GEMM_TEMPLATES_AT_BUILD = True
GEMM_TEMPLATES_MAX_BATCH = 1
MIN_GEMMS = 24
MAX_GEMM_SHAPES = 8
GEMM_TEMPLATE_OPTIONS = {"max_autotune_gemm": True, "max_autotune_gemm_backends": "ATEN,TRITON"}


# Patchifying convolutions (ViT's, BEiT's, ConvNeXt's and Swin's stems, ConvNeXt's downsampling) as one matrix
# product each, in every lowering (`torch_lowering.patch_product_nodes`, where the measurements are), not a candidate
# timed at build (a whole compile per batch size).
PATCH_PRODUCTS_AT_BUILD = True

# Every GELU after a half-precision linear op or 1x1 convolution computed with that product, its bias and the GELU
# as one cuBLASLt call (`gelu_products`), in every lowering, not a candidate timed at build (a whole compile per batch
# size). Measured by `tools/gelu_products_probe.py` on an H100 (run 40, benchmarks/NOTES.md): batch 128 convnext_tiny
# 6.88 -> 5.34 ms, vit_base_patch16_224 10.34 -> 9.37, edgenext_small 4.56 -> 3.60; batch 1 4-6% quicker; logits
# within 1.2e-3 of the separate kernels', relative to the largest, the same top-1.
GELU_PRODUCTS_AT_BUILD = True


def inductor_options(capability: tuple[int, int]) -> dict[str, Any]:
    """The Inductor options a CUDA build asks for on a GPU of this compute capability (`CompiledCuda` keeps those
    this torch has; the engine record holds them under `INDUCTOR_OPTIONS`, so loading compiles as the build did and
    hits the bundle's caches)."""
    return {PDL: True} if LAUNCH_DEPENDENTS_EARLY and capability >= (9, 0) else {}


def known_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options this torch's Inductor has; each one it lacks is dropped with a warning (a bundle built by
    another torch then compiles without it: slower to load, same answers)."""
    if not options:
        return {}
    import torch._inductor.config

    known = torch._inductor.config.get_config_copy()
    dropped = sorted(set(options) - set(known))
    if dropped:
        log.warning("this torch's Inductor has no option %s; compiling without it", ", ".join(dropped))
    return {key: value for key, value in options.items() if key in known}


@dataclass(frozen=True)
class Lowering:
    """How the CUDA engine lowers the graph at one batch size: the depthwise convolutions run as taps, the
    1x1 convolutions on 1x1 maps as products, and either (`fused`) each convolution with its bias, residual add
    and ReLU as one cuDNN call (`fused_convolutions`) or (`depthwise_kernel`) the depthwise convolutions that are
    not taps on trtmc's Triton kernel (`depthwise_kernel`); with `gemm_templates`, Inductor times its Triton GEMM
    templates against cuBLAS for each matrix product (`GEMM_TEMPLATE_OPTIONS`)."""

    taps: frozenset[str]
    products: frozenset[str]
    patches: frozenset[str] = frozenset()
    fused: bool = False
    depthwise_kernel: bool = False
    gemm_templates: bool = False
    gelus: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.fused and self.depthwise_kernel:
            raise ValueError("a lowering runs its convolutions fused by cuDNN or its depthwise ones on trtmc's "
                             "kernel, not both: no build times that pair")

    @property
    def rewritten(self) -> frozenset[str]:
        """The convolutions this lowering runs as other ops (taps, products, patch products): none is cuDNN's to
        fuse."""
        return self.taps | self.products | self.patches

    def module(self, graph: Graph, device: torch.device) -> torch.nn.Module:
        fusions, kernels = {}, {}
        if self.fused:
            fusions.update(fused_convolutions(graph, exclude=self.rewritten))
        elif self.depthwise_kernel:
            from .depthwise_kernel import depthwise_kernels, taps_major_weights  # imports Triton: only here

            kernels = depthwise_kernels(graph, exclude=self.taps)
            fusions.update(kernels)
        if self.gelus:
            fusions.update({k: v for k, v in gelu_products(graph, exclude=self.rewritten).items() if k in self.gelus})
        fx = to_fx(graph, quantized_gemms=True, depthwise_taps=self.taps, vector_products=self.products,
                   patch_products=self.patches, fusions=fusions)
        module = channels_last_weights(fx.eval().to(device), graph)
        return taps_major_weights(module, kernels) if self.depthwise_kernel else module

    def inductor_options(self) -> dict[str, Any]:
        """The Inductor options this lowering adds to the build's own (`inductor_options`)."""
        return dict(GEMM_TEMPLATE_OPTIONS) if self.gemm_templates else {}


def lowering_candidates(graph: Graph, batch: int, depthwise_kernel: bool | None = None,
                        gemm_templates: bool | None = None,
                        patches: frozenset[str] = frozenset(),
                        gelus: frozenset[str] = frozenset()) -> dict[str, Lowering]:
    """The lowerings a build times at `batch`: the plain one (taps and products where measured faster, run 9
    and 11) and, where the graph has ReLUs after half-precision convolutions, the same with those fused, except
    where the plain lowering runs most depthwise convolutions as taps (at batch 1): there the ReLU before a
    depthwise convolution already fuses into its taps' kernel. Run 13 measured the fused candidate there faster
    on 2 of 7 networks, by at most 4% (ghostnet_100 0.320 -> 0.313 ms, mobilenetv4_conv_small 0.145 -> 0.139),
    and slower on the other 5, for a second compile of the graph (ghostnet_100: 43 s of a 139 s build).
    `depthwise_kernel` (default `DEPTHWISE_KERNEL_AT_BUILD`; a loaded engine passes True, so that a bundle whose
    build chose it runs it) also offers the depthwise-kernel lowering where cuDNN would run at least
    `MIN_ON_KERNEL` depthwise convolutions (above batch 1, at least `MIN_ON_KERNEL` that the window kernel runs).
    `gemm_templates` (default `GEMM_TEMPLATES_AT_BUILD`) likewise offers the GEMM-templates lowering up to
    `GEMM_TEMPLATES_MAX_BATCH` where
    the graph has at least `MIN_GEMMS` matrix products of at most `MAX_GEMM_SHAPES` shapes (`gemm_templates_pay`);
    True (a loaded engine) offers it wherever the graph has a matrix product, so that a bundle whose build drew
    those lines elsewhere loads the lowering it chose. It rides on the depthwise kernel wherever the kernel's own
    conditions hold (a transformer with depthwise convolutions, edgenext_small's, would otherwise have to pick
    one of the two); those conditions are the graph's alone, not `depthwise_kernel`'s, so that a load rebuilds
    the lowering its build timed. Every candidate runs the `patches` (`CompiledCuda.patches`) as matrix products and
    the `gelus` (`CompiledCuda.gelus`) with their products as one call."""
    plain = Lowering(depthwise_taps_nodes(graph, batch), vector_product_nodes(graph, batch), patches, gelus=gelus)
    candidates = {PLAIN: plain}
    depthwise = [node.name for node in graph.nodes if is_depthwise(node, graph)]
    mostly_taps = bool(depthwise) and 2 * len(plain.taps) >= len(depthwise)
    if not mostly_taps and fused_convolutions(graph, exclude=plain.rewritten):
        candidates[FUSED] = replace(plain, fused=True)
    on_cudnn = [graph.node(name) for name in depthwise if name not in plain.taps]
    kernel_pays = len(on_cudnn if batch == 1 else _on_window(on_cudnn, graph)) >= MIN_ON_KERNEL
    offered = DEPTHWISE_KERNEL_AT_BUILD if depthwise_kernel is None else depthwise_kernel
    if offered and kernel_pays:
        candidates[KERNEL] = replace(plain, depthwise_kernel=True)
    if gemm_templates is None:
        offered = GEMM_TEMPLATES_AT_BUILD and batch <= GEMM_TEMPLATES_MAX_BATCH and gemm_templates_pay(graph)
    else:
        offered = gemm_templates and gemm_count(graph) > 0
    if offered:
        candidates[GEMM] = replace(plain, depthwise_kernel=kernel_pays, gemm_templates=True)
    return candidates


def _on_window(convolutions: list[Node], graph: Graph) -> list[Node]:
    """Those of these depthwise convolutions that the window kernel runs (stride 1, no dilation, up to 9x9)."""
    from .depthwise_kernel import on_window  # imports Triton: only where a graph has depthwise convolutions

    return [n for n in convolutions
            if on_window(graph.weights[n.attrs.weight].shape[2:], n.attrs.stride, n.attrs.dilation)]


def _gemms(graph: Graph) -> list[Node]:
    """The graph's matrix products: its linear and matmul ops (attention is its own kernel, SDPA's)."""
    return [node for node in graph.nodes if node.kind in (OpKind.LINEAR, OpKind.MATMUL)]


def gemm_count(graph: Graph) -> int:
    """How many matrix products the graph has (`_gemms`)."""
    return len(_gemms(graph))


def gemm_shapes(graph: Graph) -> int:
    """How many distinct matrix products the graph's are, each autotuned once: the op kind and attributes with
    its operands' and its result's shapes."""
    shapes = {node.name: node.type.shape for node in graph.nodes}
    return len({(node.kind, node.attrs if node.kind is OpKind.MATMUL else None,
                 tuple(shapes[i] for i in node.inputs), node.type.shape) for node in _gemms(graph)})


def gemm_templates_pay(graph: Graph) -> bool:
    """Whether autotuning the graph's GEMMs can pay for its compile: many products over few shapes."""
    return gemm_count(graph) >= MIN_GEMMS and gemm_shapes(graph) <= MAX_GEMM_SHAPES


@dataclass(frozen=True)
class LoweringChoice:
    """What a build measured at one batch size: each candidate's quickest replay round (ms per replay) or its error."""

    chosen: str
    ms: Mapping[str, float]
    errors: Mapping[str, str]

    def to_json(self) -> dict[str, Any]:
        return {"chosen": self.chosen, "ms": {k: round(v, 5) for k, v in self.ms.items()}, "errors": dict(self.errors)}


def choose_lowering(compiled: "CompiledCuda", graph: Graph, example: torch.Tensor, progress: Progress) -> LoweringChoice:
    """Compile every candidate lowering at the example's batch size, replay each in a CUDA graph, time them interleaved, and
    keep the fastest (the plain one unless another is `MIN_GAIN` faster). A candidate that fails to compile
    or capture is recorded with its error; the plain one must work. The timing holds the GPU's timing lock
    (`gpu_lock`): builds running side by side compile together but time one at a time, and no process's Inductor
    benchmarks its kernels meanwhile."""
    batch = example.shape[0]
    candidates = lowering_candidates(graph, batch, patches=compiled.patches, gelus=compiled.gelus)
    lock = device_lock(example.device.index or 0)
    share_gpu_with_timing(lock)  # this build's autotuning never runs while another build times
    if len(candidates) == 1:  # nothing to choose: compile the plain lowering, as before there were candidates
        progress(f"compiling with Inductor for CUDA, batch {batch}")
        with torch.no_grad():
            compiled.module_for(candidates[PLAIN], example.device)(example)
        return LoweringChoice(PLAIN, {}, {})
    graphs, errors = {}, {}
    for name, lowering in candidates.items():
        progress(f"compiling with Inductor for CUDA, batch {batch}" + ("" if name == PLAIN else f" ({name})"))
        try:
            graphs[name], _ = captured(compiled.module_for(lowering, example.device), example)
        except Exception as exc:
            if name == PLAIN:
                raise
            log.info("the %s lowering at batch %d failed", name, batch, exc_info=True)
            errors[name] = f"{type(exc).__name__}: {exc}"
    with timing_alone(lock, lambda s: progress(f"batch {batch}: waited {s:.1f} s for the GPU (other builds' "
                                               "timing or benchmarks) to be free")):
        ms = replay_ms(graphs)
    del graphs
    torch.cuda.empty_cache()
    fastest = min(ms, key=ms.get)
    chosen = fastest if ms[fastest] < ms[PLAIN] * (1 - MIN_GAIN) else PLAIN
    failed = "".join(f"; {name} failed ({error[:200]})" for name, error in errors.items())
    progress(f"batch {batch}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in ms.items()) + f"; kept {chosen}{failed}")
    return LoweringChoice(chosen, ms, errors)


def captured(module, example: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """`module` called three times on a side stream (compiling, warm from the caches where they answer, and
    settling its allocations outside capture), then one call captured in a CUDA graph: (graph, its output)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(stream):
        for _ in range(3):
            module(example)
    torch.cuda.current_stream().wait_stream(stream)
    cuda_graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(cuda_graph):
        out = module(example)
    return cuda_graph, out


def replay_ms(graphs: Mapping[str, torch.cuda.CUDAGraph], rounds: int = 9, round_ms: float = 10.0) -> dict[str, float]:
    """Each graph's quickest round, in ms per replay: rounds of back-to-back replays lasting about `round_ms`,
    timed with CUDA events, the graphs interleaved round by round (the bench's protocol, shorter). The quickest
    round, not the median: work of other processes on the GPU (a parallel prepare's compiles autotune their
    kernels on it) only ever slows a round, and run 14 saw a candidate's median moved 3.2x by it."""

    def timed(cuda_graph: torch.cuda.CUDAGraph, calls: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            cuda_graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    calls = {name: max(1, round(round_ms / max(timed(g, 1), 1e-3))) for name, g in graphs.items()}
    samples: dict[str, list[float]] = {name: [] for name in graphs}
    for _ in range(rounds):
        for name, cuda_graph in graphs.items():
            samples[name].append(timed(cuda_graph, calls[name]) / calls[name])
    return {name: min(s) for name, s in samples.items()}


class CompiledCuda:
    """The graph compiled for CUDA, one `torch.compile` per distinct `Lowering`: the depthwise convolutions run
    as fused taps (`depthwise_taps_nodes`: more of them at batch 1 than at larger batches), the 1x1
    convolutions on 1x1 maps as products and a sum (`vector_product_nodes`: at batch 1), and, where the build
    measured it faster, convolutions with their bias, residual add and ReLU as one cuDNN call (`chosen`: batch
    size -> candidate name, from the engine's record; `lowering_candidates`). A batch size is compiled at its
    first call. Every lowering runs the `patches` (patchifying convolutions) as matrix products
    (`patch_product_nodes`) and the `gelus` with their products as one cuBLASLt call (`gelu_products`). fp8/int8
    graphs run their quantized 1x1 convolutions and linear ops as FP8 / INT8 GEMMs (the quantize ops feeding them
    fuse into their producers' kernels), not fp16 ops on dequantized values."""

    def __init__(self, graph: Graph, chosen: Mapping[int, str] | None = None,
                 options: Mapping[str, Any] | None = None, patches: frozenset[str] = frozenset(),
                 gelus: frozenset[str] = frozenset()) -> None:
        self._graph = graph
        self._chosen = dict(chosen or {})
        self.patches = patches
        self.gelus = gelus
        self.options = known_options(options or {})
        self._by_lowering: dict[Lowering, torch.nn.Module] = {}
        self._by_batch: dict[int, torch.nn.Module] = {}

    def choose(self, batch: int, name: str) -> None:
        """Run `batch` with the candidate lowering `name` from now on."""
        self._chosen[batch] = name
        self._by_batch.pop(batch, None)

    @property
    def launches_own_kernels(self) -> bool:
        """Whether a chosen lowering calls trtmc's own Triton kernels (`depthwise_kernel`)."""
        return any(self.chosen_lowering(batch).depthwise_kernel for batch in self._chosen)

    def chosen_lowering(self, batch: int, name: str | None = None) -> Lowering:
        """The lowering `batch` runs: the one chosen for it (`choose`, or the engine's record), else the plain one;
        or the candidate `name`."""
        candidates = lowering_candidates(self._graph, batch, depthwise_kernel=True, gemm_templates=True,
                                         patches=self.patches, gelus=self.gelus)
        name = name or self._chosen.get(batch, PLAIN)
        if name not in candidates:
            raise RuntimeError(f"the engine was built with the {name!r} lowering at batch {batch}, which this "
                               f"graph does not offer ({', '.join(candidates)}); rebuild the bundle")
        return candidates[name]

    def options_for(self, lowering: Lowering) -> dict[str, Any]:
        """The Inductor options `lowering` compiles with: the build's, then the lowering's own."""
        return {**self.options, **known_options(lowering.inductor_options())}

    def module_for(self, lowering: Lowering, device: torch.device) -> torch.nn.Module:
        if lowering not in self._by_lowering:
            mend_inductor()
            options = self.options_for(lowering)
            self._by_lowering[lowering] = torch.compile(lowering.module(self._graph, device), dynamic=False,
                                                        options=options or None)
        return self._by_lowering[lowering]

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        batch = pixels.shape[0]
        if batch in self._by_batch:
            return self._by_batch[batch](pixels)
        lowering = self.chosen_lowering(batch)
        module = self.module_for(lowering, pixels.device)
        try:
            out = module(pixels)  # the first call compiles (from the bundle's caches)
        except Exception:
            name = self._chosen.get(batch, PLAIN)
            if name == PLAIN:
                raise
            # The plain lowering is in the bundle's caches too: a chosen candidate that does not run here (another
            # cuDNN, say) costs its speed, not the engine.
            log.warning("the %s lowering chosen at build does not run here at batch %d; running the plain one",
                        name, batch, exc_info=True)
            module = self.module_for(self.chosen_lowering(batch, PLAIN), pixels.device)
            out = module(pixels)
        self._by_batch[batch] = module
        return out


def compile_cuda(graph: Graph, record: Mapping[str, Any] | None = None,
                 options: Mapping[str, Any] | None = None) -> CompiledCuda:
    """The compiled graph, with the lowering each batch size was built with (`LOWERINGS` in the engine's record;
    bundles from before that record run the plain lowering), the Inductor options it was compiled with
    (`INDUCTOR_OPTIONS` in the record; a build passes `options`, from `inductor_options`) and the patch embeddings
    it ran as matrix products (`PATCH_PRODUCTS` in the record, none in bundles from before it; a build, passing no
    record, runs `patch_product_nodes(graph)` so where `PATCH_PRODUCTS_AT_BUILD`), and likewise the GELUs it ran with
    their products (`GELU_PRODUCTS`, `gelu_products(graph)` where `GELU_PRODUCTS_AT_BUILD`)."""
    building, record = record is None, record or {}
    if building and PATCH_PRODUCTS_AT_BUILD:
        patches = patch_product_nodes(graph)
    else:
        patches = frozenset(record.get(PATCH_PRODUCTS, ()))
    if building and GELU_PRODUCTS_AT_BUILD:
        gelus = frozenset(gelu_products(graph, exclude=patches))
    else:
        gelus = frozenset(record.get(GELU_PRODUCTS, ()))
    chosen = {int(batch): c["chosen"] for batch, c in record.get(LOWERINGS, {}).items()}
    return CompiledCuda(graph, chosen, record.get(INDUCTOR_OPTIONS, options), patches, gelus)
