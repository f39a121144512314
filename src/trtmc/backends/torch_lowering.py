"""Lowering the graph to PyTorch: one function per op kind, and an FX graph built from them.

`GraphModule(graph)` is a plain `nn.Module` whose weights are buffers already cast to the dtype of
the node that reads them (`Node.weight_dtype`: quantize/dequantize scales stay float32);
`to_fx(graph)` traces it into a flat `torch.fx.GraphModule`, which is what Inductor compiles.
Dimension 0 stays free, so one module serves every batch size. Quantized 1x1 convolutions and linear
ops can run as `torch._scaled_mm` (FP8) and `torch._int_mm` (INT8) GEMMs (`GraphModule(graph,
quantized_gemms=True)`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol

import torch
import torch.nn.functional as F

from ..graph import Activation, Binary, DType, Graph, Node, OpKind, PoolMode, Reduction
from ..precision import PRECISIONS, precision_of

TORCH_DTYPES = {p.dtype: p.torch_dtype for p in PRECISIONS.values()}
HALF_DTYPES = (DType.F16, DType.BF16)

Lowering = Callable[[Node, list[torch.Tensor], Callable[[str], torch.Tensor]], torch.Tensor]
LOWERINGS: dict[OpKind, Lowering] = {}


def lowering(kind: OpKind):
    def register(fn: Lowering) -> Lowering:
        if kind in LOWERINGS:
            raise RuntimeError(f"torch lowering for {kind.value} registered twice")
        LOWERINGS[kind] = fn
        return fn

    return register


def _pad_if_asymmetric(x: torch.Tensor, padding: tuple[int, int, int, int], value: float = 0.0):
    """torch's conv and pool pad symmetrically; TF "SAME" needs an explicit pad when it is not."""
    top, left, bottom, right = padding
    if top == bottom and left == right:
        return x, (top, left)
    return F.pad(x, (left, right, top, bottom), value=value), (0, 0)


@lowering(OpKind.INPUT)
def _input(node, args, w):
    return args[0]


@lowering(OpKind.CONSTANT)
def _constant(node, args, w):
    return w(node.attrs.weight)


def _weight(node, args, w) -> torch.Tensor:
    """A convolution's or linear op's weight: its stored one, or its second input (a dequantized weight)."""
    return args[1] if node.attrs.weight is None else w(node.attrs.weight)


@lowering(OpKind.CONV2D)
def _conv2d(node, args, w):
    a = node.attrs
    x, padding = _pad_if_asymmetric(args[0], a.padding)
    bias = w(a.bias) if a.bias else None
    return F.conv2d(x, _weight(node, args, w), bias, a.stride, padding, a.dilation, a.groups)


@lowering(OpKind.SCALE)
def _scale(node, args, w):
    a = node.attrs
    view = [1] * len(node.type.shape)
    view[a.axis] = -1
    return args[0] * w(a.scale).reshape(view) + w(a.shift).reshape(view)


_ACTIVATIONS: dict[Activation, Callable[[torch.Tensor], torch.Tensor]] = {
    Activation.RELU: F.relu,
    Activation.RELU6: F.relu6,
    Activation.SILU: F.silu,
    Activation.GELU: F.gelu,
    Activation.GELU_TANH: lambda x: F.gelu(x, approximate="tanh"),
    Activation.HARD_SWISH: F.hardswish,
    Activation.HARD_SIGMOID: F.hardsigmoid,
    Activation.SIGMOID: torch.sigmoid,
    Activation.TANH: torch.tanh,
    Activation.SQRT: torch.sqrt,
}


@lowering(OpKind.ACTIVATION)
def _activation(node, args, w):
    if node.attrs.fn is Activation.LEAKY_RELU:
        return F.leaky_relu(args[0], node.attrs.negative_slope)
    return _ACTIVATIONS[node.attrs.fn](args[0])


@lowering(OpKind.POOL2D)
def _pool2d(node, args, w):
    a = node.attrs
    if a.mode is PoolMode.MAX:
        x, padding = _pad_if_asymmetric(args[0], a.padding, value=float("-inf"))
        return F.max_pool2d(x, a.kernel, a.stride, padding)
    if a.padding[0] == a.padding[2] and a.padding[1] == a.padding[3]:
        return F.avg_pool2d(args[0], a.kernel, a.stride, a.padding[:2], count_include_pad=a.count_include_pad)
    # Asymmetric: pad explicitly with zeros, and divide by the real window sizes if pads don't count.
    pad = (a.padding[1], a.padding[3], a.padding[0], a.padding[2])
    y = F.avg_pool2d(F.pad(args[0], pad), a.kernel, a.stride)
    if a.count_include_pad:
        return y
    ones = F.pad(torch.ones_like(args[0][:1, :1]), pad)
    return y / F.avg_pool2d(ones, a.kernel, a.stride)


@lowering(OpKind.REDUCE)
def _reduce(node, args, w):
    a = node.attrs
    x = args[0]
    if a.op is Reduction.MEAN:
        return x.mean(dim=a.axes, keepdim=a.keepdim)
    if a.op is Reduction.SUM:
        return x.sum(dim=a.axes, keepdim=a.keepdim)
    return x.amax(dim=a.axes, keepdim=a.keepdim)


_BINARY = {
    Binary.ADD: torch.add,
    Binary.SUB: torch.sub,
    Binary.MUL: torch.mul,
    Binary.DIV: torch.div,
    Binary.MAX: torch.maximum,
    Binary.MIN: torch.minimum,
}


@lowering(OpKind.ELEMENTWISE)
def _elementwise(node, args, w):
    return _BINARY[node.attrs.op](args[0], args[1])


@lowering(OpKind.CONCAT)
def _concat(node, args, w):
    return torch.cat(args, dim=node.attrs.axis)


@lowering(OpKind.SLICE)
def _slice(node, args, w):
    a = node.attrs
    return args[0].narrow(a.axis, a.start, a.stop - a.start)


@lowering(OpKind.LINEAR)
def _linear(node, args, w):
    a = node.attrs
    return F.linear(args[0], _weight(node, args, w), w(a.bias) if a.bias else None)


@lowering(OpKind.MATMUL)
def _matmul(node, args, w):
    b = args[1].transpose(-1, -2) if node.attrs.transpose_b else args[1]
    return torch.matmul(args[0], b)


@lowering(OpKind.SOFTMAX)
def _softmax(node, args, w):
    return torch.softmax(args[0], dim=node.attrs.axis)


@lowering(OpKind.NORMALIZATION)
def _normalization(node, args, w):
    a = node.attrs
    x = args[0]
    rank = len(node.type.shape)
    if a.axis == rank - 1:
        return F.layer_norm(x, (x.shape[-1],), w(a.weight), w(a.bias), a.eps)
    # Normalising a middle axis (channels of an NCHW map): move it last and back.
    x = x.movedim(a.axis, -1)
    x = F.layer_norm(x, (x.shape[-1],), w(a.weight), w(a.bias), a.eps)
    return x.movedim(-1, a.axis)


@lowering(OpKind.GROUP_NORM)
def _group_norm(node, args, w):
    a = node.attrs
    return F.group_norm(args[0], a.groups, w(a.weight), w(a.bias), a.eps)


@lowering(OpKind.RESHAPE)
def _reshape(node, args, w):
    return args[0].reshape((-1,) + tuple(node.attrs.shape))


@lowering(OpKind.TRANSPOSE)
def _transpose(node, args, w):
    return args[0].permute(node.attrs.perm)


@lowering(OpKind.CAST)
def _cast(node, args, w):
    return args[0].to(TORCH_DTYPES[node.attrs.dtype])


@torch.fx.wrap  # a leaf of the FX trace: the strides it reads exist only once tensors (or fake ones) flow
def _dense_last_dim(t: torch.Tensor) -> torch.Tensor:
    """`t`, copied row-major when its last dimension is strided. The fused attention kernels read rows of unit
    stride; given any other, torch falls back to the math path, whose products run fp16 in fp32 (edgenext's
    cross-covariance attentions, whose rows run along the tokens: six fp32 GEMMs, 45 us of its 534 on the H100)."""
    return t if t.stride(-1) == 1 else t.contiguous()


@lowering(OpKind.ATTENTION)
def _attention(node, args, w):
    # Inductor keeps this one call; on CUDA it runs flash, memory-efficient or cuDNN attention (each
    # keeps the softmax statistics in fp32), on a CPU torch's flash kernel, which accumulates in fp32.
    a = node.attrs
    bias = w(a.bias) if a.bias else None
    q, k, v = (_dense_last_dim(t) for t in args[:3])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=a.scale)


def _quantization_scale(node, w) -> torch.Tensor:
    """A quantize/dequantize scale (float32), shaped to broadcast along the node's axis."""
    a = node.attrs
    if a.axis is None:
        return w(a.scale)
    view = [1] * len(node.type.shape)
    view[a.axis] = -1
    return w(a.scale).reshape(view)


@lowering(OpKind.QUANTIZE)
def _quantize(node, args, w):
    # Divided in float32 whatever the input's dtype, as TensorRT's quantize computes.
    return precision_of(node.attrs.format).to_grid(args[0].float() / _quantization_scale(node, w))


@lowering(OpKind.DEQUANTIZE)
def _dequantize(node, args, w):
    return (args[0].float() * _quantization_scale(node, w)).to(TORCH_DTYPES[node.type.dtype])


@dataclass(frozen=True)
class QuantizedGemm:
    """A quantized op run as one GEMM on its stored operands: `torch._scaled_mm` for FP8,
    `torch._int_mm` for INT8."""

    format: DType  # F8E4M3 or I8
    activation: str  # the QUANTIZE node: the GEMM's rows (pixels or tokens) by input channels
    weight: str  # the quantized constant: [out, in(, 1, 1)]
    input_scale: str
    weight_scale: str


# cuBLASLt's low-precision GEMMs need input and output widths that are multiples of 16 (FP8; INT8
# needs 8), and torch._int_mm more than 16 rows on CUDA: INT8 GEMMs are kept to ops with at least
# 17 rows per image (pixels of a map, tokens), so that batch 1 qualifies too.
GEMM_WIDTH_MULTIPLE = 16
INT8_MIN_ROWS = 17


def _rows_per_image(node) -> int:
    shape = node.type.shape
    return shape[2] * shape[3] if node.kind is OpKind.CONV2D else math.prod(shape[1:-1])


def find_quantized_gemms(graph: Graph) -> dict[str, QuantizedGemm]:
    """The quantized ops of `graph` that `_quantized_gemm` can run, keyed by op name: linear ops and
    1x1 convolutions (stride 1, unpadded, ungrouped) with a per-tensor input scale, input and output
    widths that are multiples of `GEMM_WIDTH_MULTIPLE`, and, for INT8, `INT8_MIN_ROWS` rows per image."""
    nodes = {n.name: n for n in graph.nodes}
    found = {}
    for node in graph.nodes:
        if node.kind not in (OpKind.CONV2D, OpKind.LINEAR) or node.attrs.weight is not None:
            continue
        x_dq, w_dq = nodes[node.inputs[0]], nodes[node.inputs[1]]
        q = nodes[x_dq.inputs[0]] if x_dq.kind is OpKind.DEQUANTIZE else x_dq
        if q.kind is not OpKind.QUANTIZE or q.attrs.axis is not None or w_dq.attrs.format is not q.attrs.format:
            continue
        out_c, in_c = w_dq.type.shape[:2]
        a = node.attrs
        pointwise = node.kind is OpKind.LINEAR or (
            w_dq.type.shape[2:] == (1, 1) and a.stride == (1, 1) and a.padding == (0, 0, 0, 0) and a.groups == 1
        )
        wide = in_c % GEMM_WIDTH_MULTIPLE == 0 and out_c % GEMM_WIDTH_MULTIPLE == 0
        rows_ok = q.attrs.format is DType.F8E4M3 or (q.attrs.format is DType.I8 and _rows_per_image(node) >= INT8_MIN_ROWS)
        if pointwise and wide and rows_ok:
            found[node.name] = QuantizedGemm(q.attrs.format, q.name, w_dq.inputs[0], x_dq.attrs.scale, w_dq.attrs.scale)
    return found


@torch.fx.wrap  # one node of the traced graph: whether the CPU fallback runs depends on the tensors' device
def row_scaled_mm(rows, matrix, scale_a, scale_b, out_dtype):
    """`torch._scaled_mm` of FP8 `rows` and `matrix`, scaled by `scale_a` per row and `scale_b` per column.
    Some PyTorch releases' CPU kernel scales per tensor only (2.11's does), so there (tests run engines on the CPU)
    the row scale, one value for all rows, scales the fp32 product and the column scales follow, rounded once to
    `out_dtype` as on CUDA."""
    if rows.device.type == "cpu" and not _cpu_scales_rows():
        one = scale_a.new_ones(())
        product = torch._scaled_mm(rows, matrix, scale_a=scale_a[0, 0], scale_b=one, out_dtype=torch.float32)
        return (product * scale_b).to(out_dtype)
    return torch._scaled_mm(rows, matrix, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)


@functools.cache
def _cpu_scales_rows() -> bool:
    """Whether this PyTorch's CPU `_scaled_mm` takes row-wise scales (it asserts per-tensor scales where not)."""
    rows = torch.ones(2, 16).to(torch.float8_e4m3fn)
    try:
        torch._scaled_mm(rows, rows.t(), scale_a=torch.ones(2, 1), scale_b=torch.ones(1, 2), out_dtype=torch.float32)
    except RuntimeError:
        return False
    return True


def _quantized_gemm(gemm: QuantizedGemm, node, args, w):
    """`node` as one GEMM of its quantized input rows and quantized kernel, accumulated in fp32 (FP8)
    or int32 (INT8), the input and per-channel weight scales applied once to the sum, then the bias.
    A 1x1 convolution's rows are its pixels (NHWC: a view when the input is channels-last, as on CUDA)."""
    x, kernel = args
    out_c, in_c = kernel.shape[0], kernel.shape[1]
    conv = node.kind is OpKind.CONV2D
    out_dtype = TORCH_DTYPES[node.type.dtype]
    rows = x.permute(0, 2, 3, 1).reshape(-1, in_c) if conv else x.reshape(-1, in_c)
    matrix = kernel.reshape(out_c, in_c).t()
    if gemm.format is DType.I8:
        scales = w(gemm.input_scale).reshape(1, 1) * w(gemm.weight_scale).reshape(1, out_c)
        y = (torch._int_mm(rows, matrix).float() * scales).to(out_dtype)
    else:
        # Row-wise scaling: one scale per row (all equal: the input's) and one per output channel.
        # The row count is the batch's, known at run time only: expand_as traces where expand(n, 1) cannot.
        scale_a = w(gemm.input_scale).reshape(1, 1).expand_as(rows[:, :1]).contiguous()
        scale_b = w(gemm.weight_scale).reshape(1, -1).expand(1, out_c).contiguous()
        y = row_scaled_mm(rows, matrix, scale_a, scale_b, out_dtype)
    if node.attrs.bias:
        y = y + w(node.attrs.bias)
    if conv:
        return y.reshape(-1, node.type.shape[2], node.type.shape[3], out_c).permute(0, 3, 1, 2)
    return y.reshape((-1,) + node.type.shape[1:])


# Attention kernels read a bias whose rows start at multiples of 8 elements in place; any other bias
# (swin's windows of 49 tokens) torch and Inductor copy into such a layout before every call. A bias
# is therefore stored with its last dim padded to the alignment and read as a view of its first
# columns: the same values, rows already aligned.
ATTENTION_BIAS_ALIGNMENT = 8


def _padded_last_dim(tensor: torch.Tensor, multiple: int) -> torch.Tensor:
    return F.pad(tensor, (0, -tensor.shape[-1] % multiple))


def buffer_name(key: str) -> str:
    """The name of the module buffer (or parameter) that holds the graph weight `key`."""
    return "w_" + "".join(c if c.isalnum() else "_" for c in key)


def _conv2d_half_via_fp32(node, args, w):
    """A half-precision convolution as GPU kernels compute it: exact products of the half values,
    fp32 accumulation, one rounding of the result. CPUs run native fp16/bf16 convolutions 8-12x
    slower than fp32, so CPU reference runs (the parity tests) take this path."""
    a = node.attrs
    x, padding = _pad_if_asymmetric(args[0].float(), a.padding)
    bias = w(a.bias).float() if a.bias else None
    weight = _weight(node, args, w).float()
    return F.conv2d(x, weight, bias, a.stride, padding, a.dilation, a.groups).to(args[0].dtype)


def is_depthwise(node: Node, graph: Graph) -> bool:
    """A convolution with one stored 2-D kernel per channel (weight [C, 1, kh, kw], groups = C)."""
    a = node.attrs
    if node.kind is not OpKind.CONV2D or a.weight is None:
        return False
    shape = graph.weights[a.weight].shape
    return shape[1] == 1 and a.groups == shape[0] > 1


# What Inductor fuses a producer through: one-input elementwise ops and views.
_FUSES_THROUGH = (OpKind.SCALE, OpKind.ACTIVATION, OpKind.CAST, OpKind.TRANSPOSE, OpKind.RESHAPE)
# Ops that Inductor generates as reduction loops: a norm's statistics are a reduction like a mean's.
_MEANS = (OpKind.REDUCE, OpKind.POOL2D)
_REDUCTIONS = (*_MEANS, OpKind.SOFTMAX, OpKind.NORMALIZATION, OpKind.GROUP_NORM)


def _feeds_a_reduction(node: Node, consumers: dict[str, list[Node]], reductions: tuple[OpKind, ...]) -> bool:
    """Whether `node`'s output reaches a reduction, a pooling or a norm through one-input elementwise ops
    and views only (a squeeze-excite's mean, ConvNeXt's layer norm after its 7x7 depthwise convolution):
    Inductor would fuse taps there into the reduction's loop. Measured on the H200: convnext_tiny's 18
    depthwise convolutions as taps feeding their layer norms ran batch 1 at 0.835 ms against 0.579 on
    cuDNN (benchmarks/NOTES.md, runs 7 and 11)."""
    for consumer in consumers[node.name]:
        if consumer.kind in reductions:
            return True
        if consumer.kind in _FUSES_THROUGH and _feeds_a_reduction(consumer, consumers, reductions):
            return True
    return False


# Below this many channels cuDNN runs a depthwise convolution with its slow direct kernel at any batch (run 9:
# ghostnet_100's two 8-channel 3x3 layers at 112x112, batch 128: 271 us each; as taps 84 us).
TAPS_BELOW_CHANNELS = 16
# The widest kernel run as taps: a 7x7 kernel is 49 taps, a 9x9 81, and Inductor's compile time grows with every
# one. mixnet_s at batch 1 (42 convolutions up to 9x9, 1,266 taps) compiled for 266 s of a 322 s build under the
# bench's parallel prepare (run 15), over issue 12's 2 minutes for a build; up to 5x5 (29 convolutions, 469 taps)
# its batch-1 compile went 83.6 -> 36.2 s alone on the H200 and its build 86.7 s, for 0.665 -> 0.774 ms, still 1.18x
# the expert (run 16). ConvNeXt's 7x7 kernels stay on cuDNN anyway, feeding their norms.
TAPS_MAX_KERNEL = 5


def depthwise_taps_nodes(
    graph: Graph, batch: int, max_kernel: int = TAPS_MAX_KERNEL, into_norms: bool = False
) -> frozenset[str]:
    """The depthwise convolutions the compiled CUDA engine runs as fused taps (`_depthwise_taps`) at a batch
    size: at batch 1 every one that does not feed a reduction; at larger batches only those of fewer than
    `TAPS_BELOW_CHANNELS` channels; at any batch none with a kernel wider than `max_kernel`. `into_norms`
    (for tools/depthwise_taps_probe.py) counts only means and poolings as reductions, as runs 9-10 did.

    Measured on the H200 (run 9, tools/depthwise_taps_probe.py, fp16, all depthwise convolutions not
    feeding a reduction as taps): batch 1 ghostnet_100 0.440 -> 0.348 ms (191 -> 152 kernels) and
    tf_efficientnet_lite0 0.250 -> 0.212 ms (101 -> 69); batch 128 ghostnet_100 2.71 -> 2.33 ms (the two
    8-channel layers) but lite0 2.57 -> 3.64 ms (its wide layers run slower as taps than on cuDNN). With every
    depthwise convolution as taps, efficientnet_b0 went 0.415 -> 0.441 and 3.18 -> 7.63 ms: Inductor fused
    the taps into its squeeze-excite means, whose reduction loops run them slowly."""
    consumers = graph.consumers()
    reductions = _MEANS if into_norms else _REDUCTIONS
    taps = set()
    for n in graph.nodes:
        if not is_depthwise(n, graph) or _feeds_a_reduction(n, consumers, reductions):
            continue
        channels, _, *kernel = graph.weights[n.attrs.weight].shape
        if max(kernel) <= max_kernel and (batch == 1 or channels < TAPS_BELOW_CHANNELS):
            taps.add(n.name)
    return frozenset(taps)


def _depthwise_taps(node, args, w):
    """A depthwise convolution as the sum of its kernel's shifted taps, each a strided view of the padded
    input times one weight per channel: pointwise ops that Inductor fuses into one Triton kernel with
    the ops around it, where an extern cuDNN call fuses with nothing. Shapes come from the graph (FX
    traces proxies)."""
    a = node.attrs
    top, left, bottom, right = a.padding
    x = F.pad(args[0], (left, right, top, bottom)) if any(a.padding) else args[0]
    weight = w(a.weight)  # [C, 1, kh, kw]
    kh, kw = weight.shape[2], weight.shape[3]
    (sh, sw), (dh, dw) = a.stride, a.dilation
    out_h, out_w = node.type.shape[2], node.type.shape[3]
    out = None
    for i in range(kh):
        for j in range(kw):
            tap = x[:, :, i * dh : i * dh + (out_h - 1) * sh + 1 : sh, j * dw : j * dw + (out_w - 1) * sw + 1 : sw]
            term = tap * weight[:, 0, i, j].reshape(1, -1, 1, 1)
            out = term if out is None else out + term
    return out + w(a.bias).reshape(1, -1, 1, 1) if a.bias else out


def _is_product_on_a_1x1_map(node: Node, graph: Graph) -> bool:
    """A dense 1x1 convolution whose input is a 1x1 map (a squeeze-excite's two, a head after global pooling):
    one matrix-vector product per image."""
    a = node.attrs
    if node.kind is not OpKind.CONV2D or a.weight is None or a.groups != 1 or any(a.padding):
        return False
    source = graph.node(node.inputs[0]).type.shape
    return graph.weights[a.weight].shape[2:] == (1, 1) and tuple(source[2:]) == (1, 1)


def vector_product_nodes(graph: Graph, batch: int) -> frozenset[str]:
    """The 1x1 convolutions on 1x1 maps the compiled CUDA engine runs as products and a sum
    (`_vector_product`) at a batch size: every one at batch 1, where each extern convolution and the
    pointwise kernel after it are two launches of a few microseconds for a few thousand multiply-adds
    (ghostnet_100 has 15, efficientnet_b0 32); none at larger batches, where they are GEMMs worth a library."""
    if batch > 1:
        return frozenset()
    return frozenset(n.name for n in graph.nodes if _is_product_on_a_1x1_map(n, graph))


def _vector_product(node, args, w):
    """A 1x1 convolution on a 1x1 map as its products and their sum over the input channels, computed in
    float32 as a tensor core computes them (a product of two fp16 or bf16 values is exact in float32, and
    the sum accumulates in float32): a reduction that Inductor generates with the bias and the activation
    after it in one Triton kernel, where an extern cuDNN call fuses with nothing. Shapes come from the graph
    (FX traces proxies)."""
    a = node.attrs
    weight = w(a.weight).float().flatten(1)[None]  # [1, Cout, Cin]
    y = (args[0].float().flatten(1)[:, None] * weight).sum(-1)  # [N, Cout]
    if a.bias:
        y = y + w(a.bias).float()
    return y.to(args[0].dtype)[..., None, None]


# cuDNN runs a half-precision convolution of a channels-last map with fewer than 8 channels by padding the map and
# the weight to 8 channels (two `nhwcAddPaddingKernel` calls) and an Ampere-era implicit-GEMM kernel: ViT's patch
# embedding (16x16 stride 16, 3 -> 768 channels) took 710 + 88 us of trtmc's 10.56 ms at batch 128 (run 6, H200,
# tools/fp8_probe.py) and 708 + 115 us of the expert's 11.09 ms (run 26, H100): ~42 TFLOP/s for what is one
# [25088 x 768] by [768 x 768] matrix product; at batch 1 cuDNN's kernel for it took 76 us. As that product
# (`_patch_product`) the engine ran vit_base at batch 128 in 10.53 ms against 11.23 and at batch 1 in 0.553 against
# 0.639 (run 26, H100, `benchmarks/results/2026-12-06-h100-run26-patches/`). Wider maps gain too: ConvNeXt's and
# EdgeNeXt's 2x2 stride-2 downsampling (96-384 channels) as products took convnext_tiny's depthwise-kernel engine
# from 6.825 to 6.680 ms at batch 128 and 0.4226 to 0.4124 at batch 1, edgenext_small's from 4.532 to 4.485 and
# 0.4291 to 0.4266 (run 39, H100, `benchmarks/results/2026-12-07-h100-run39-downsample/`), so every patchifying
# convolution is one, whatever its channels (until run 39 only those of fewer than 8).


def _is_patchifying(node: Node, graph: Graph) -> bool:
    """A dense half-precision convolution that cuts its map into whole, non-overlapping patches (kernel = stride > 1,
    no padding, no dilation, the map a multiple of the patch): ViT's and BEiT's patch embeddings, ConvNeXt's and
    Swin's 4x4 stems, ConvNeXt's 2x2 downsampling."""
    a = node.attrs
    if node.kind is not OpKind.CONV2D or a.weight is None or a.groups != 1 or any(a.padding):
        return False
    if node.type.dtype not in HALF_DTYPES:  # the products are measured in half precision only
        return False
    kh, kw = graph.weights[a.weight].shape[2:]
    height, width = graph.node(node.inputs[0]).type.shape[2:]
    return (tuple(a.stride) == (kh, kw) != (1, 1) and tuple(a.dilation) == (1, 1)
            and height % kh == 0 and width % kw == 0)


def patch_product_nodes(graph: Graph) -> frozenset[str]:
    """The patchifying convolutions the compiled CUDA engine runs as one matrix product (`_patch_product`)."""
    return frozenset(n.name for n in graph.nodes if _is_patchifying(n, graph))


def _patch_product(node, args, w):
    """A patch embedding as the matrix product it is: the map's patches as rows (kernel rows, kernel columns,
    channels: the order of a channels-last map and of the engine's channels-last weight, so that only the
    pixels are copied, once) times the weight, plus the bias, in one library GEMM; the result rows are the
    output map's pixels, channels-last. Shapes come from the graph and the stored weight (FX traces proxies)."""
    a = node.attrs
    weight = w(a.weight)  # [Cout, Cin, kh, kw]
    out_channels, channels, kh, kw = weight.shape
    out_h, out_w = node.type.shape[2], node.type.shape[3]
    patches = args[0].reshape(-1, channels, out_h, kh, out_w, kw).permute(0, 2, 4, 3, 5, 1)
    rows = patches.reshape(-1, kh * kw * channels)
    y = F.linear(rows, weight.permute(0, 2, 3, 1).reshape(out_channels, -1), w(a.bias) if a.bias else None)
    return y.reshape(-1, out_h, out_w, out_channels).permute(0, 3, 1, 2)


class Fusion(Protocol):
    """Several nodes computed by one call (`fused_convolutions.FusedConvolution`): `lower` gives the value of the
    node it is keyed by, from the values computed so far; the `absorbed` nodes are not computed on their own."""

    absorbed: frozenset[str]

    def lower(self, values: dict[str, torch.Tensor], w: Callable[[str], torch.Tensor]) -> torch.Tensor: ...


class GraphModule(torch.nn.Module):
    """Runs a graph op by op; the weights are buffers in the dtype of the node that reads them.

    `half_convolutions_in_fp32` selects `_conv2d_half_via_fp32` for fp16/bf16 convolutions (CPU
    reference runs); engines never set it. `quantized_gemms` runs the ops `find_quantized_gemms(graph)`
    finds as FP8 or INT8 GEMMs instead of convolutions of dequantized values (same numbers up to the
    summation order, checked on the CPU); the CUDA inductor engine sets it. `depthwise_taps` names the
    depthwise convolutions to run as sums of shifted taps (`_depthwise_taps`), for Inductor to fuse; the
    compiled CUDA engine passes `depthwise_taps_nodes(graph, batch)`. `vector_products` names the 1x1
    convolutions on 1x1 maps to run as products and a sum (`_vector_product`; the engine passes
    `vector_product_nodes(graph, batch)`). `patch_products` names the patch embeddings to run as one matrix
    product (`_patch_product`; the engine passes `patch_product_nodes(graph)`). `fusions` computes each node it
    names with the nodes before it that the fusion absorbs, as one call (the compiled CUDA engine's cuDNN
    convolutions with their bias, residual add and ReLU: `fused_convolutions.fused_convolutions(graph)`).
    """

    def __init__(
        self, graph: Graph, *, half_convolutions_in_fp32: bool = False, quantized_gemms: bool = False,
        depthwise_taps: frozenset[str] = frozenset(), vector_products: frozenset[str] = frozenset(),
        patch_products: frozenset[str] = frozenset(), fusions: Mapping[str, Fusion] | None = None,
    ) -> None:
        super().__init__()
        self.half_convolutions_in_fp32 = half_convolutions_in_fp32
        self._gemms = find_quantized_gemms(graph) if quantized_gemms else {}
        self._taps = depthwise_taps
        self._products = vector_products
        self._patches = patch_products
        self._fusions = dict(fusions or {})
        self._absorbed = frozenset().union(*(f.absorbed for f in self._fusions.values()))
        missing = [k.value for k in OpKind if k not in LOWERINGS]
        if missing:
            raise NotImplementedError(f"no torch lowering for {', '.join(missing)}")
        self.graph_ir = graph
        self._buffers_by_key: dict[str, str] = {}
        self._widths: dict[str, int] = {}  # key -> the last-dim width of a buffer stored padded
        registered: set[str] = set()
        for node in graph.nodes:
            for key in node.weight_keys():
                name = buffer_name(key)
                if name not in registered:
                    registered.add(name)
                    # A copy in canonical strides: numpy calls a view C-contiguous whatever the stride of its
                    # size-1 axes (vit's pos_embed[:, 1:] keeps the 197-token stride on its batch axis), torch
                    # keeps that stride, and Inductor's cache keys hold it, so the build's compile would not be
                    # the one a bundle's freshly read weights look up (vit_base's load missed, run 16).
                    tensor = torch.from_numpy(graph.weights[key]).to(
                        TORCH_DTYPES[node.weight_dtype(key)], copy=True, memory_format=torch.contiguous_format)
                    if node.kind is OpKind.ATTENTION and tensor.shape[-1] % ATTENTION_BIAS_ALIGNMENT:
                        # A parameter, not a buffer: FX traces what is read from a parameter, so the
                        # view stays an op of the graph over the padded tensor (a buffer's view would
                        # be baked in as a constant of its own, which moving the module makes dense).
                        self._widths[key] = tensor.shape[-1]
                        padded = _padded_last_dim(tensor, ATTENTION_BIAS_ALIGNMENT)
                        self.register_parameter(name, torch.nn.Parameter(padded, requires_grad=False))
                    else:
                        self.register_buffer(name, tensor)
                self._buffers_by_key[key] = name
        self.input_name = graph.inputs[0].name

    def _weight(self, key: str) -> torch.Tensor:
        tensor = getattr(self, self._buffers_by_key[key])
        return tensor[..., : self._widths[key]] if key in self._widths else tensor

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        values: dict[str, torch.Tensor] = {}
        for node in self.graph_ir.nodes:
            if node.name in self._absorbed:
                continue
            if node.name in self._fusions:
                values[node.name] = self._fusions[node.name].lower(values, self._weight)
                continue
            args = [pixels] if node.kind is OpKind.INPUT else [values[i] for i in node.inputs]
            lower = LOWERINGS[node.kind]
            if self.half_convolutions_in_fp32 and node.kind is OpKind.CONV2D and node.type.dtype is not DType.F32:
                lower = _conv2d_half_via_fp32
            if node.name in self._taps:
                lower = _depthwise_taps
            if node.name in self._products:
                lower = _vector_product
            if node.name in self._patches:
                lower = _patch_product
            if node.name in self._gemms:
                gemm = self._gemms[node.name]
                args, lower = [values[gemm.activation], values[gemm.weight]], functools.partial(_quantized_gemm, gemm)
            values[node.name] = lower(node, args, self._weight)
        outputs = [values[o] for o in self.graph_ir.outputs]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def to_fx(
    graph: Graph, *, quantized_gemms: bool = False, depthwise_taps: frozenset[str] = frozenset(),
    vector_products: frozenset[str] = frozenset(), patch_products: frozenset[str] = frozenset(),
    fusions: Mapping[str, Fusion] | None = None,
) -> torch.fx.GraphModule:
    """A flat FX graph of the whole network (the op-by-op loop unrolled by tracing)."""
    return torch.fx.symbolic_trace(GraphModule(
        graph, quantized_gemms=quantized_gemms, depthwise_taps=depthwise_taps, vector_products=vector_products,
        patch_products=patch_products, fusions=fusions))


# The ops whose 4-D constants are convolution weights, or become them (a quantized weight's dequantize).
_CONVOLUTION_SIDE = (OpKind.CONV2D, OpKind.QUANTIZE, OpKind.DEQUANTIZE)


def channels_last_weights(module: torch.nn.Module, graph: Graph) -> torch.nn.Module:
    """`module` (from `to_fx(graph)`) with its convolution weights channels-last, to meet channels-last
    activations in cuDNN; every other constant keeps its row-major layout. `Module.to(memory_format=)`
    would convert every 4-D buffer: swin's attention biases [1, windows x heads, 49, 49] then had a
    last-dim stride of 192, and Inductor copies a bias that is not dense along its last dim before
    every attention call.

    `.to(memory_format=)`, as `Module.to` does, not `.contiguous(memory_format=)`: a 1x1 weight is
    contiguous in both formats, so `.contiguous` keeps its row-major strides, and a convolution of a
    row-major input (efficientvit's attention output, reshaped) with such a weight stays row-major, and
    so does the rest of its stage (seen in tools/graph_diff.py against timm, whose convolution there comes
    out channels-last)."""
    convolution_side = {k for n in graph.nodes if n.kind in _CONVOLUTION_SIDE for k in n.weight_keys()}
    for key in sorted(convolution_side):
        name = buffer_name(key)
        tensor = getattr(module, name, None)  # tracing keeps only the buffers the forward reads
        if tensor is not None and tensor.dim() == 4:
            setattr(module, name, tensor.to(memory_format=torch.channels_last))
    return module
