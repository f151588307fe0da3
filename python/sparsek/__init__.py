"""sparsek: block-sparse (BSR) matrix products for NVIDIA Hopper, from NumPy, PyTorch and CuPy.

    import numpy as np, sparsek
    A = np.random.rand(256, 512).astype(np.float32)
    A[:, 128:] = 0                                        # whole zero blocks are not stored
    Ab = sparsek.BSRMatrix.from_dense(A, block=(32, 32))
    C = sparsek.bsr_mm(Ab, np.ones((512, 64), np.float32))  # == A @ ones

Arrays stay in their framework and on their device (NumPy → the CPU backend; torch/CuPy CUDA
tensors → the GPU on the framework's current stream). Bad input raises ValueError with the library's
message. With torch the products are also ``torch.ops.sparsek.*`` custom ops with autograd, and
``sparsek.nn.BlockSparseLinear`` is a layer. torch is not imported by ``import sparsek``: the torch
integration loads when torch is in use (imported before sparsek, or on the first torch tensor).

Block-sparse attention: ``O, LSE = sparsek.attention(q, k, v, layout, causal=False)`` with a
``sparsek.BlockLayout`` or a FlexAttention ``BlockMask``; ``sparsek.gate(q, k, topk)`` chooses a
layout from the content (``sparsek.nn.TopKGate`` learns the scores).

Serving: ``O, LSE = sparsek.decode_attention(q, k_cache, v_cache, page_table, seq_lens, cu_seqlens_q,
selection=None)`` attends a batch of requests' new tokens over a paged KV cache, optionally only
selected pages per key/value head; ``sparsek.select_pages(q, summaries, ...)`` chooses those pages
from per-page key summaries that ``sparsek.update_page_summaries`` keeps.

fp8 (e4m3): ``W8 = W.quantize()`` (one scale per stored block), ``x8, xs = sparsek.quantize_e4m3(x)``
(one per row), ``sparsek.dense_bsr_mm(x8, W8.T, a_scales=xs)``; ``BlockSparseLinear.to_fp8()``.
"""
from . import _cuda_libs  # noqa: F401  (first: finds the CUDA libraries the extension links)
from . import _arrays, _openblas

with _openblas.hint():  # OpenBLAS picks its kernels when the extension loads it
    from . import _sparsek
from ._attention import BlockLayout, attention, block_mask_from_layout, gate, layout_from_block_mask
from ._bsr import BSRMatrix, BSRTranspose
from ._decode import decode_attention, page_summaries, plan_decode, select_pages, update_page_summaries
from ._fp8 import dequantize_e4m3, quantize_e4m3
from ._ops import bsr_mm, dense_bsr_mm, sampled_mm

_arrays.torch_loaded()  # registers torch.ops.sparsek.* now if the caller already imported torch

__version__ = _sparsek.version()

__all__ = ["BSRMatrix", "BSRTranspose", "bsr_mm", "dense_bsr_mm", "sampled_mm", "BlockLayout", "attention",
           "gate", "layout_from_block_mask", "block_mask_from_layout", "decode_attention", "plan_decode",
           "page_summaries", "update_page_summaries", "select_pages",
           "quantize_e4m3", "dequantize_e4m3",
           "__version__"]
