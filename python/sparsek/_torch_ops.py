"""torch integration: cached plans, the products as ``torch.library`` custom ops with fake kernels
and autograd formulas, and the eager launch-only path.

    torch.ops.sparsek.bsr_mm(row_ptr, col_idx, values, rows, cols, trans, b, alpha, beta, c)
    torch.ops.sparsek.dense_bsr_mm(a, row_ptr, col_idx, values, rows, cols, trans, alpha, beta, c)
    torch.ops.sparsek.sampled_mm(a, b, row_ptr, col_idx, values, rows, cols, alpha, beta)

The ops are functional (fresh outputs, no mutation), so torch.compile and torch.export treat them as
opaque nodes whose output shapes come from the fake kernels. `c` (dense ops) gives the output's dtype
and shape and, when beta != 0, the C that beta scales; for sampled_mm the pattern's values play that
role. `trans` applies op = transpose to the sparse operand.

Plans: the first product on a pattern plans it (validation, schedule, upload: the library's plan())
and keeps the plan in a small cache attached to the pattern's row_ptr tensor, keyed by everything the
plan was made for: kind, op, the shapes, strides, dtypes and devices of every operand, and (for plans
that hold workspace, outside CUDA graph capture) the stream. A cached plan is used only while row_ptr
and col_idx are the same tensors at the same version counters: an in-place edit of the pattern
through torch makes the next call plan again (and validate the edited pattern) instead of running a
stale schedule. Later calls pass only data pointers: no allocation besides the output, no
synchronization, so they can be captured in CUDA graphs. Planning during a capture raises, saying
to run once before capturing.

Imported on the first use of a torch tensor with sparsek (sparsek itself never imports torch).
"""
from typing import Optional

import torch
from torch import Tensor

from . import _sparsek as _ext

if not hasattr(torch.library, "custom_op") or not hasattr(torch.library, "register_autograd"):
    raise ImportError(f"sparsek's torch integration needs torch >= 2.4 (torch.library.custom_op); "
                      f"found torch {torch.__version__}")

DSD, DDS, SDD = 0, 1, 2
_PLANS_PER_PATTERN = 32  # oldest dropped first (dynamic token counts make one plan per N)
_Parameter = torch.nn.Parameter
# Plans used while a CUDA graph was being captured. The graph keeps their workspace and schedule
# pointers, and when a graph dies is not visible from here: they stay alive for the process (a
# cache may drop or replace its own reference; the graph's replays then still find the memory).
_graph_plans: dict = {}


def _keep_for_graphs(plan):
    _graph_plans[id(plan)] = plan


def _capturing(t):
    """True while t's device's current stream is being captured into a CUDA graph."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


try:
    _raw_stream = torch._C._cuda_getCurrentRawStream  # what inductor's generated code calls
except AttributeError:  # a build without CUDA
    _raw_stream = None


def _stream(t: Tensor) -> int:
    if not t.is_cuda:
        return 0
    if _raw_stream is not None:
        return _raw_stream(t.device.index)
    return torch.cuda.current_stream(t.device).cuda_stream


def _sig(t):
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def _ptr(t):
    return 0 if t is None else t.data_ptr()


def _capture_error(what):
    return RuntimeError(
        f"sparsek: {what} has no plan yet, and planning cannot run while a CUDA graph is being "
        "captured (it validates the pattern on the host and uploads the schedule). Run the same call "
        "once before capturing (same shapes, dtypes and device), then capture: later calls only "
        "launch.")


# Plan tables of the ops that keep their plans per problem (attention, decode): small, oldest
# evicted first.
_MAX_PLANS = 64


def _entry(table, key, stream, capturing, what):
    """(key, entry) of a plan table for a call on `stream`; entries are (plan, has workspace, stream).
    A plan's workspace is used in one stream's order: a plan made on another stream is shared only
    when it has none, or inside a capture (the warm-up's plan: planning cannot run there, and says
    so). entry None: make one and _remember it under key. A plan used inside a capture is kept for
    the process (the graph holds its workspace; the table may evict it later)."""
    e = table.get(key)
    if e is not None and e[1] and e[2] != stream:
        own = table.get(key + (stream,))
        if own is not None or not capturing:
            key, e = key + (stream,), own
    if capturing:
        if e is None:
            raise _capture_error(what)
        _keep_for_graphs(e[0])
    return key, e


def _remember(table, key, entry):
    if len(table) >= _MAX_PLANS:
        table.popitem(last=False)
    table[key] = entry
    return entry


def _plan(kind, trans, row_ptr, col_idx, values, rows, cols, a, b, c, scales=None, dense_scales=None):
    """The cached plan for this call, made now on a miss (see the module doc). e4m3 products
    (_torch_fp8) pass the uint8 views of their codes and their scales."""
    stream = _stream(values)
    capturing = _capturing(values)
    key = (kind, trans, rows, cols, _sig(values), _sig(a), _sig(b), _sig(c), _sig(scales), _sig(dense_scales))
    plans = row_ptr.__dict__.get("_sparsek_plans")
    if plans is None:
        plans = row_ptr.__dict__["_sparsek_plans"] = {}
    e = plans.get(key)
    if e is not None and e[4] and e[5] != stream:
        # A plan's workspace is used in one stream's order: another stream gets its own plan.
        # NOTE: except inside a capture, where no plan can be made: the graph then shares the
        # plan of the stream that ran the call before (the warm-up stream). Replaying it while
        # the same product runs on that stream would share the workspace; don't.
        own = plans.get(key + (stream,))
        if own is not None or not capturing:
            key, e = key + (stream,), own
    if (e is not None and e[1] is col_idx and e[2] == row_ptr._version
            and e[3] == col_idx._version):
        if capturing:
            _keep_for_graphs(e[0])
        return e[0], stream
    if capturing:
        raise _capture_error(("bsr_mm", "dense_bsr_mm", "sampled_mm")[kind])
    rp, ci, v = row_ptr.detach(), col_idx.detach(), values.detach()
    # torch refuses DLPack export of tensors that require grad: the plan gets detached views.
    sc, dsc = (None if t is None else t.detach() for t in (scales, dense_scales))
    if kind == DSD:
        p = _ext.plan_dsd(rows, cols, rp, ci, v, b.detach(), c.detach(), int(trans), stream, scales=sc, b_scales=dsc)
    elif kind == DDS:
        p = _ext.plan_dds(a.detach(), rows, cols, rp, ci, v, c.detach(), int(trans), stream, a_scales=dsc, scales=sc)
    else:
        p = _ext.plan_sdd(a.detach(), b.detach(), rows, cols, rp, ci, v, stream)
    if len(plans) >= _PLANS_PER_PATTERN:
        plans.pop(next(iter(plans)))
    plans[key] = (p, col_idx, row_ptr._version, col_idx._version, p.workspace_bytes > 0, stream)
    return p, stream


def _launch(kind, trans, row_ptr, col_idx, values, rows, cols, a, b, c, alpha, beta, scales=None,
            dense_scales=None):
    p, stream = _plan(kind, trans, row_ptr, col_idx, values, rows, cols, a, b, c, scales, dense_scales)
    p.run(values.data_ptr(), _ptr(a), _ptr(b), _ptr(c), alpha, beta, stream, _ptr(scales), _ptr(dense_scales))


def _need_2d(x, name):
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch tensor like the BSR matrix's arrays, "
                        f"got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be a 2-D tensor, got shape {tuple(x.shape)}")


def _dense_result(c: Optional[Tensor], beta: float, shape, like: Tensor) -> Tensor:
    if c is None:
        if beta != 0:
            raise ValueError(f"beta={beta} needs c (the C that beta scales)")
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    if beta != 0:
        return c.clone(memory_format=torch.contiguous_format)
    # c's shape (not `shape`) so that a wrong c is reported by the library's shape check.
    return torch.empty(c.shape, dtype=c.dtype, device=c.device)


def _dsd(row_ptr, col_idx, values, rows, cols, trans, b, alpha, beta, c):
    _need_2d(b, "B")
    out = _dense_result(c, beta, (cols if trans else rows, b.shape[1]), b)
    _launch(DSD, trans, row_ptr, col_idx, values, rows, cols, None, b, out, alpha, beta)
    return out


def _dds(a, row_ptr, col_idx, values, rows, cols, trans, alpha, beta, c):
    _need_2d(a, "A")
    out = _dense_result(c, beta, (a.shape[0], rows if trans else cols), a)
    _launch(DDS, trans, row_ptr, col_idx, values, rows, cols, a, None, out, alpha, beta)
    return out


def _sdd(a, b, row_ptr, col_idx, values, rows, cols, alpha, beta):
    _need_2d(a, "A")
    _need_2d(b, "B")
    if beta != 0:
        out = values.clone(memory_format=torch.contiguous_format)
    else:
        out = torch.empty(values.shape, dtype=values.dtype, device=values.device)
    _launch(SDD, False, row_ptr, col_idx, out, rows, cols, a, b, None, alpha, beta)
    return out


# ---------------------------------------------------------------- custom ops

@torch.library.custom_op("sparsek::bsr_mm", mutates_args=())
def _bsr_mm_op(row_ptr: Tensor, col_idx: Tensor, values: Tensor, rows: int, cols: int, trans: bool,
               b: Tensor, alpha: float, beta: float, c: Optional[Tensor]) -> Tensor:
    return _dsd(row_ptr, col_idx, values, rows, cols, trans, b, alpha, beta, c)


@_bsr_mm_op.register_fake
def _(row_ptr, col_idx, values, rows, cols, trans, b, alpha, beta, c):
    dtype = c.dtype if c is not None else b.dtype
    return b.new_empty((cols if trans else rows, b.shape[1]), dtype=dtype)


@torch.library.custom_op("sparsek::dense_bsr_mm", mutates_args=())
def _dense_bsr_mm_op(a: Tensor, row_ptr: Tensor, col_idx: Tensor, values: Tensor, rows: int,
                     cols: int, trans: bool, alpha: float, beta: float,
                     c: Optional[Tensor]) -> Tensor:
    return _dds(a, row_ptr, col_idx, values, rows, cols, trans, alpha, beta, c)


@_dense_bsr_mm_op.register_fake
def _(a, row_ptr, col_idx, values, rows, cols, trans, alpha, beta, c):
    dtype = c.dtype if c is not None else a.dtype
    return a.new_empty((a.shape[0], rows if trans else cols), dtype=dtype)


@torch.library.custom_op("sparsek::sampled_mm", mutates_args=())
def _sampled_mm_op(a: Tensor, b: Tensor, row_ptr: Tensor, col_idx: Tensor, values: Tensor,
                   rows: int, cols: int, alpha: float, beta: float) -> Tensor:
    return _sdd(a, b, row_ptr, col_idx, values, rows, cols, alpha, beta)


@_sampled_mm_op.register_fake
def _(a, b, row_ptr, col_idx, values, rows, cols, alpha, beta):
    return torch.empty_like(values, memory_format=torch.contiguous_format)


# ---------------------------------------------------------------- autograd
#
# Gradients of the dense operands and of the sparse operand's values (on its own pattern), each
# one of the three products again:
#   DSD  C = a*op(A)B + b*C0:  dB = a*op(A)^T dC (DSD, op flipped);  dA = a*dC B^T on A's blocks
#        (SDD; with op = T: a*B dC^T);  dC0 = b*dC
#   DDS  C = a*A op(B) + b*C0: dA = a*dC op(B)^T (DDS, op flipped);  dB = a*A^T dC on B's blocks
#        (SDD; with op = T: a*dC^T A);  dC0 = b*dC
#   SDD  C = a*(AB)|P + b*P:   dA = a*dC B^T (DSD with dC as the sparse operand);
#        dB = a*A^T dC (DDS);  dP = b*dC
# Incoming gradients are cast to the inputs' dtype (a float32 C of float16 inputs) and made row- or
# column-major when they are not (an expanded gradient has zero strides).

def _dense_grad(g, dtype):
    g = g.to(dtype)
    rows, cols = g.shape
    s0, s1 = g.stride()
    if (cols <= 1 or s1 == 1) and (rows <= 1 or s0 >= max(cols, 1)):
        return g
    if (rows <= 1 or s0 == 1) and (cols <= 1 or s1 >= max(rows, 1)):
        return g
    return g.contiguous()


def _save(ctx, inputs, names, tensors):
    ctx.save_for_backward(*tensors)
    for n, v in zip(names, inputs):
        setattr(ctx, n, v)


def _bsr_mm_setup(ctx, inputs, output):
    row_ptr, col_idx, values, rows, cols, trans, b, alpha, beta, c = inputs
    _save(ctx, (rows, cols, trans, alpha, beta), ("rows", "cols", "trans", "alpha", "beta"),
          (row_ptr, col_idx, values, b))


def _bsr_mm_backward(ctx, grad):
    row_ptr, col_idx, values, b = ctx.saved_tensors
    rows, cols, trans, alpha = ctx.rows, ctx.cols, ctx.trans, ctx.alpha
    need = ctx.needs_input_grad
    g = _dense_grad(grad, values.dtype)
    d_values = d_b = d_c = None
    if need[2]:
        x, y = (b, g.mT) if trans else (g, b.mT)
        d_values = torch.ops.sparsek.sampled_mm(x, y, row_ptr, col_idx, values, rows, cols, alpha, 0.0)
    if need[6]:
        d_b = torch.ops.sparsek.bsr_mm(row_ptr, col_idx, values, rows, cols, not trans, g, alpha,
                                       0.0, None)
    if need[9]:
        d_c = grad * ctx.beta
    return None, None, d_values, None, None, None, d_b, None, None, d_c


def _dense_bsr_mm_setup(ctx, inputs, output):
    a, row_ptr, col_idx, values, rows, cols, trans, alpha, beta, c = inputs
    _save(ctx, (rows, cols, trans, alpha, beta), ("rows", "cols", "trans", "alpha", "beta"),
          (a, row_ptr, col_idx, values))


def _dense_bsr_mm_backward(ctx, grad):
    a, row_ptr, col_idx, values = ctx.saved_tensors
    rows, cols, trans, alpha = ctx.rows, ctx.cols, ctx.trans, ctx.alpha
    need = ctx.needs_input_grad
    g = _dense_grad(grad, values.dtype)
    d_a = d_values = d_c = None
    if need[0]:
        d_a = torch.ops.sparsek.dense_bsr_mm(g, row_ptr, col_idx, values, rows, cols, not trans,
                                             alpha, 0.0, None)
    if need[3]:
        x, y = (g.mT, a) if trans else (a.mT, g)
        d_values = torch.ops.sparsek.sampled_mm(x, y, row_ptr, col_idx, values, rows, cols, alpha, 0.0)
    if need[9]:
        d_c = grad * ctx.beta
    return d_a, None, None, d_values, None, None, None, None, None, d_c


def _sampled_mm_setup(ctx, inputs, output):
    a, b, row_ptr, col_idx, values, rows, cols, alpha, beta = inputs
    _save(ctx, (rows, cols, alpha, beta), ("rows", "cols", "alpha", "beta"), (a, b, row_ptr, col_idx))


def _sampled_mm_backward(ctx, grad):
    a, b, row_ptr, col_idx = ctx.saved_tensors
    rows, cols, alpha = ctx.rows, ctx.cols, ctx.alpha
    need = ctx.needs_input_grad
    gv = grad.to(a.dtype).contiguous()  # dC's values: the sparse operand of the two products below
    d_a = d_b = d_values = None
    if need[0]:
        d_a = torch.ops.sparsek.bsr_mm(row_ptr, col_idx, gv, rows, cols, False, b.mT, alpha, 0.0, None)
    if need[1]:
        d_b = torch.ops.sparsek.dense_bsr_mm(a.mT, row_ptr, col_idx, gv, rows, cols, False, alpha,
                                             0.0, None)
    if need[4]:
        d_values = grad * ctx.beta
    return d_a, d_b, None, None, d_values, None, None, None, None


torch.library.register_autograd("sparsek::bsr_mm", _bsr_mm_backward, setup_context=_bsr_mm_setup)
torch.library.register_autograd("sparsek::dense_bsr_mm", _dense_bsr_mm_backward,
                                setup_context=_dense_bsr_mm_setup)
torch.library.register_autograd("sparsek::sampled_mm", _sampled_mm_backward,
                                setup_context=_sampled_mm_setup)


# ---------------------------------------------------------------- what sparsek.bsr_mm & co. call

# torch's own test for an active torch.func transform (private: a torch without it has none to test).
_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)


def _eager(*tensors):
    """True outside torch.compile and torch.func transforms, for plain tensors: a call may then skip
    the custom-op dispatch (tens of microseconds of host time)."""
    if torch.compiler.is_compiling() or _functorch_active():
        return False
    return all(t is None or type(t) is Tensor or type(t) is _Parameter for t in tensors)


def _direct(*tensors):
    """True when a call may skip the custom-op dispatch and launch directly: eager (above), and no
    autograd graph to record."""
    if not _eager(*tensors):
        return False
    return not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in tensors)


def _shares_memory(x, *others):
    s = x.untyped_storage().data_ptr()
    return any(o is not None and o.untyped_storage().data_ptr() == s for o in others)


def _check_tensor(x, name):
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch tensor like the BSR matrix's arrays, "
                        f"got {type(x).__name__}")


def _into(out, result):
    if out is None:
        return result
    if tuple(out.shape) != tuple(result.shape):
        raise ValueError(f"out has shape {tuple(out.shape)}, the product is {tuple(result.shape)}")
    out.copy_(result)
    return out


def bsr_mm(a, trans, b, alpha, beta, out):
    _check_tensor(b, "b")
    if out is not None:
        _check_tensor(out, "out")
    rows, cols = a.shape
    if _direct(a.values, b, out) and (out is None or not _shares_memory(out, b, a.values)):
        # Writes straight into out (beta reads it in place).
        return _dsd_into(a, trans, b, alpha, beta, out)
    r = torch.ops.sparsek.bsr_mm(a.row_ptr, a.col_idx, a.values, rows, cols, trans, b, alpha, beta, out)
    return _into(out, r)


def _dsd_into(a, trans, b, alpha, beta, out):
    rows, cols = a.shape
    if out is None:
        return _dsd(a.row_ptr, a.col_idx, a.values, rows, cols, trans, b, alpha, beta, None)
    _need_2d(b, "B")
    _launch(DSD, trans, a.row_ptr, a.col_idx, a.values, rows, cols, None, b, out, alpha, beta)
    return out


def dense_bsr_mm(a, b, trans, alpha, beta, out):
    _check_tensor(a, "a")
    if out is not None:
        _check_tensor(out, "out")
    rows, cols = b.shape
    if _direct(a, b.values, out) and (out is None or not _shares_memory(out, a, b.values)):
        if out is None:
            return _dds(a, b.row_ptr, b.col_idx, b.values, rows, cols, trans, alpha, beta, None)
        _need_2d(a, "A")
        _launch(DDS, trans, b.row_ptr, b.col_idx, b.values, rows, cols, a, None, out, alpha, beta)
        return out
    r = torch.ops.sparsek.dense_bsr_mm(a, b.row_ptr, b.col_idx, b.values, rows, cols, trans, alpha,
                                       beta, out)
    return _into(out, r)


def sampled_mm(a, b, pattern, alpha, beta):
    """The result's values (sparsek.sampled_mm wraps them in a BSRMatrix or copies them into out)."""
    _check_tensor(a, "a")
    _check_tensor(b, "b")
    rows, cols = pattern.shape
    if _direct(a, b, pattern.values):
        return _sdd(a, b, pattern.row_ptr, pattern.col_idx, pattern.values, rows, cols, alpha, beta)
    return torch.ops.sparsek.sampled_mm(a, b, pattern.row_ptr, pattern.col_idx, pattern.values, rows,
                                        cols, alpha, beta)


def bsr_of_sparse_tensor(t):
    """A BSRMatrix over a torch sparse_bsr tensor, kept on the tensor while its index arrays are
    unchanged (the plans of the matrix then survive from call to call)."""
    from ._bsr import BSRMatrix

    crow, col = t.crow_indices(), t.col_indices()  # aliases: they share the version counters
    cached = t.__dict__.get("_sparsek_bsr")
    if cached is not None and cached[1] == crow._version and cached[2] == col._version:
        return cached[0]
    m = BSRMatrix.from_torch(t)
    t.__dict__["_sparsek_bsr"] = (m, crow._version, col._version)
    return m


from ._torch_fp8 import fp8_product, quantize  # noqa: E402,F401  (registers the fp8 ops with the others)
