"""DSD over several GPUs, through a ``torch.distributed`` process group with the NCCL backend (and
context-parallel attention: ``ContextParallelAttention`` at the end of this module).

Every rank holds the whole block-sparse matrix ``A`` (a BSRMatrix of torch CUDA tensors on its own
GPU) and calls the product together with the other ranks; ``A``'s block rows are split into one
range per rank by prefix sums of stored blocks (equal work within one block row, not equal row
counts), and each rank computes its rows of ``C``. With ``all_gather=True`` (the default) every
rank's ``C`` then holds all rows; with ``broadcast_from=r`` rank r's ``B`` is copied to every rank
first. sparsek runs its collectives on the process group's own NCCL communicator (torch's
``ProcessGroupNCCL.comm_ptr()``), on torch's current stream; it never creates a communicator.

    import torch, torch.distributed as dist, sparsek, sparsek.distributed
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    A = sparsek.BSRMatrix.from_dense(W, block=(128, 128))      # the same W on every rank
    mm = sparsek.distributed.DistributedDSD(A)                  # plans on the first call
    C = mm(B)                                                   # == A @ B on every rank

The first call plans (a collective that synchronizes); later calls with the same shapes, strides,
dtypes and pattern only launch, so they can be captured in a CUDA graph. NCCL is loaded from the
process (torch's copy) or ``$SPARSEK_NCCL_LIBRARY``.
"""
import os

from . import _arrays as A
from . import _sparsek as _ext
from ._bsr import BSRMatrix

__all__ = ["DistributedDSD", "dsd", "ContextParallelAttention", "partition_block_rows", "nccl_version", "NcclError"]

# An NCCL call failed (a RuntimeError; the message names the call and NCCL's error, e.g. an invalid
# communicator).
NcclError = _ext.NcclError


def _point_at_torchs_nccl():
    """Lets the library find the NCCL that torch loaded (the nvidia-nccl wheel) unless told otherwise."""
    if os.environ.get("SPARSEK_NCCL_LIBRARY"):
        return
    try:
        import nvidia.nccl
    except ImportError:
        return  # a system NCCL on the loader's path, or the library's named error
    for base in getattr(nvidia.nccl, "__path__", []):
        lib = os.path.join(base, "lib", "libnccl.so.2")
        if os.path.exists(lib):
            os.environ["SPARSEK_NCCL_LIBRARY"] = lib
            return


def nccl_version():
    """The version of the NCCL sparsek loads (e.g. 22807), or NotImplementedError saying why not."""
    _point_at_torchs_nccl()
    return _ext.nccl_version()


def partition_block_rows(row_ptr, ranks):
    """Block-row bounds (ranks + 1 integers) that split a pattern's stored blocks evenly: rank r
    owns block rows ``[bounds[r], bounds[r + 1])``. row_ptr: host integers (a NumPy array, a CPU
    tensor or a sequence), a valid BSR row_ptr (starts at 0, never decreases; checked, as ranks >= 1
    is)."""
    import numpy as np
    from ._bsr import _as_int32
    ranks = A.dim(ranks, "ranks", A.INT32_MAX)  # the library counts ranks in an int
    row_ptr = row_ptr.detach().cpu().numpy() if A.is_torch(row_ptr) else np.asarray(row_ptr)
    if row_ptr.ndim != 1 or row_ptr.shape[0] < 1:
        raise ValueError(f"row_ptr must be a 1-D array of mb + 1 >= 1 entries, got shape {row_ptr.shape}")
    # _as_int32 refuses values an int32 cannot hold (a plain cast would wrap them silently).
    rp = np.ascontiguousarray(_as_int32(row_ptr, "row_ptr"))
    return list(_ext.partition_block_rows(rp, int(rp.shape[0]) - 1, ranks))


def _comm_ptr(group):
    """The ncclComm_t of torch's process group on the current device, as an integer."""
    import torch
    import torch.distributed as dist
    group = group if group is not None else dist.group.WORLD
    if dist.get_backend(group) != "nccl":
        raise ValueError(f"the process group's backend is {dist.get_backend(group)!r}; "
                         "sparsek.distributed needs 'nccl'")
    backend = group._get_backend(torch.device("cuda"))
    get = getattr(backend, "comm_ptr", None) or getattr(backend, "_comm_ptr", None)
    if get is None:
        raise NotImplementedError("this torch does not expose the NCCL communicator of a process group "
                                  "(ProcessGroupNCCL.comm_ptr); torch >= 2.6 does")
    ptr = get()
    if not ptr:  # torch makes its communicator at the first collective (unless given device_id)
        dist.barrier(group=group, device_ids=[torch.cuda.current_device()])
        ptr = get()
    if not ptr:
        raise RuntimeError("the process group has no NCCL communicator on this device yet")
    return int(ptr)


class DistributedDSD:
    """``C = alpha * A @ B + beta * C`` over the ranks of an NCCL process group (see the module).

    a: a BSRMatrix of torch CUDA tensors on this rank's current device (the whole matrix, the same on
    every rank). Every rank calls the object with B (K x N) of the same shape, stride and dtype.
    """

    def __init__(self, a, *, group=None, broadcast_from=None, all_gather=True):
        self.broadcast_from = -1 if broadcast_from is None else A.dim(broadcast_from, "broadcast_from", A.INT32_MAX)
        self.all_gather = A.flag(all_gather, "all_gather")
        if not isinstance(a, BSRMatrix) or not A.is_torch(a.values) or not a.values.is_cuda:
            raise TypeError("a must be a sparsek.BSRMatrix of torch CUDA tensors")
        self.a = a
        self.group = group
        self._plan = None
        self._key = None

    @property
    def rows(self):
        """This rank's rows of C, ``(first, end)`` (after the first call)."""
        if self._plan is None:
            return None
        bm = self.a.block[0]
        b = self._plan.bounds
        return (b[self._plan.rank] * bm, b[self._plan.rank + 1] * bm)

    def __call__(self, b, *, out=None, alpha=1.0, beta=0.0):
        import torch
        a = self.a
        if not A.is_torch(b) or b.ndim != 2:
            raise TypeError("b must be a 2-D torch tensor")
        alpha, beta = A.scalar(alpha, "alpha"), A.scalar(beta, "beta")
        if out is None:
            if beta != 0:
                raise ValueError(f"beta={beta} needs out= (the C that beta scales); got out=None")
            out = torch.empty((a.shape[0], b.shape[1]), dtype=b.dtype, device=b.device)
        stream = A.stream_of(a.values)
        key = (a.row_ptr.data_ptr(), a.col_idx.data_ptr(), tuple(b.shape), b.stride(), b.dtype,
               tuple(out.shape), out.stride(), out.dtype, b.device)
        if key != self._key:  # collective: every rank re-plans on the same call
            _point_at_torchs_nccl()
            self._plan = _ext.plan_dsd_distributed(a.shape[0], a.shape[1], a.row_ptr, a.col_idx, a.values, b, out,
                                                   _comm_ptr(self.group), self.broadcast_from, self.all_gather,
                                                   stream)
            self._key = key
        from ._torch_ops import _capturing, _keep_for_graphs
        if _capturing(b):
            _keep_for_graphs(self._plan)  # a later re-plan must not free what the graph holds
        self._plan.run(a.values.data_ptr(), b.data_ptr(), out.data_ptr(), alpha, beta, stream)
        return out


def dsd(a, b, *, group=None, broadcast_from=None, all_gather=True, out=None, alpha=1.0, beta=0.0):
    """One-shot ``DistributedDSD(a, ...)(b, ...)``: plans on every call (a synchronizing
    collective); keep a DistributedDSD to plan once and run many times."""
    return DistributedDSD(a, group=group, broadcast_from=broadcast_from, all_gather=all_gather)(
        b, out=out, alpha=alpha, beta=beta)


class ContextParallelAttention:
    """Block-sparse attention over one sequence split across ranks (context parallelism).

    Rank r holds the query rows ``q_rows(r)`` of q (and of o, lse, dout, dq) and the key/value rows
    ``kv_rows(r)`` of k and v (and dk, dv), as contiguous [B, H, rows, D] arrays; each rank receives
    from the others only the key/value blocks its query rows name in the layout, computes attention
    over the blocks it holds while they arrive, then over the received ones, and merges the two. The
    backward returns the received blocks' dk and dv to their holders, which add them in rank order.

    layout: a BlockLayout or a FlexAttention BlockMask of the whole sequence; its contents are read
    once, here (a new layout needs a new object). q_shape: (B, Hq, Sq, D) of the whole sequence;
    kv_shape: (B, Hkv, Skv, D), default q_shape. With causal, self-attention only (Sq == Skv).

    Two ways to run it:
      - ``group=`` (default: torch's WORLD group, the ``nccl`` backend): one rank per process, over the
        group's NCCL communicator (a collective: every rank constructs it with the same arguments);
        ``forward(q, k, v)`` and ``backward(...)`` take this rank's shards (torch CUDA tensors).
      - ``ranks=N``: N ranks run one after another in this process, the transfers plain copies (NumPy
        arrays or CPU tensors on the CPU backend, or CUDA tensors all on ``device``): to check a split
        without several GPUs. ``forward_all([(q, k, v), ...])`` and ``backward_all(...)``.

    One rank gives attention()'s bits exactly; several give the same bits from run to run, but differ
    from one GPU's by about the dtype's rounding (two partial results are merged, and dk, dv arrive
    rounded before they are added).
    """

    def __init__(self, layout, q_shape, kv_shape=None, *, dtype, causal=False, scale=None, group=None, ranks=None,
                 device=None):
        import numpy as np
        from ._attention import as_layout, _scale
        layout = as_layout(layout)
        q_shape = tuple(A.dim(x, "q_shape") for x in q_shape)
        kv_shape = q_shape if kv_shape is None else tuple(A.dim(x, "kv_shape") for x in kv_shape)
        if len(q_shape) != 4 or len(kv_shape) != 4:
            raise ValueError(f"q_shape and kv_shape are (B, H, S, D), got {q_shape} and {kv_shape}")
        if isinstance(dtype, str) or type(dtype).__module__.startswith("torch"):
            dtype_name = str(dtype).replace("torch.", "")
        else:
            try:
                dtype_name = np.dtype(dtype).name
            except TypeError:
                dtype_name = repr(dtype)
        if dtype_name not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"dtype must be float32, float16 or bfloat16, got {dtype!r}")

        def host(x):
            if x is None:
                return None
            x = x.detach().cpu().numpy() if A.is_torch(x) else np.asarray(x)
            return np.ascontiguousarray(x, dtype=np.int32)

        arrays = [host(x) for x in layout.arrays()]
        comm, n, dev = 0, 0, -1
        if ranks is not None:
            if group is not None:
                raise ValueError("pass group= (one rank per process) or ranks= (every rank here), not both")
            n = A.dim(ranks, "ranks", A.INT32_MAX)
            if device is not None:
                import torch
                dev = torch.device(device).index if torch.device(device).index is not None else torch.cuda.current_device()
        else:
            import torch
            _point_at_torchs_nccl()
            dev = torch.cuda.current_device()
            comm = _comm_ptr(group)
        self.shapes = (q_shape, kv_shape)
        self.dtype = dtype
        self.device = dev
        self._plans = _ext.plan_attention_cp(q_shape[0], q_shape[1], kv_shape[1], q_shape[2], kv_shape[2], q_shape[3],
                                             dtype_name, dev, *arrays, layout.block, A.flag(causal, "causal"),
                                             _scale(scale), comm, n)

    def _index(self, rank):
        if rank is None:
            if self._plans.size != 1:
                raise ValueError("this object runs several ranks: name one (rank=...)")
            return 0
        return A.dim(rank, "rank", A.INT32_MAX)

    def q_rows(self, rank=None):
        """``(begin, end)``: the query rows rank holds (this process's rank with ``group=``)."""
        return tuple(self._plans.q_rows(self._index(rank)))

    def kv_rows(self, rank=None):
        """``(begin, end)``: the key/value rows rank holds."""
        return tuple(self._plans.kv_rows(self._index(rank)))

    def recv_bytes(self, rank=None):
        """K and V bytes rank receives per run (the backward sends as many back)."""
        return self._plans.recv_bytes(self._index(rank))

    def _streams(self, like):
        return [A.stream_of(like)] * self._plans.size

    def forward_all(self, shards):
        """Per rank ``(q, k, v)`` -> per rank ``(o, lse)`` (every rank of this process)."""
        shards = list(shards)
        q, k, v = ([s[i] for s in shards] for i in range(3))
        o = [A.empty(x, A.shape_of(x), x.dtype) for x in q]
        lse = [A.empty(x, A.shape_of(x)[:3], _f32(x)) for x in q]
        self._plans.run(q, k, v, o, lse, self._streams(q[0]) if q else [])
        return list(zip(o, lse))

    def forward(self, q, k, v):
        """This rank's ``(o, lse)`` from its shards (one rank per process)."""
        return self.forward_all([(q, k, v)])[0]

    def backward_all(self, shards, deterministic=True):
        """Per rank ``(q, k, v, o, lse, dout)`` -> per rank ``(dq, dk, dv)``."""
        shards = list(shards)
        q, k, v, o, lse, dout = ([s[i] for s in shards] for i in range(6))
        dq = [A.empty(x, A.shape_of(x), x.dtype) for x in q]
        dk = [A.empty(x, A.shape_of(x), x.dtype) for x in k]
        dv = [A.empty(x, A.shape_of(x), x.dtype) for x in v]
        self._plans.run_backward(q, k, v, o, lse, dout, dq, dk, dv, A.flag(deterministic, "deterministic"),
                                 self._streams(q[0]) if q else [])
        return list(zip(dq, dk, dv))

    def backward(self, q, k, v, o, lse, dout, deterministic=True):
        """This rank's ``(dq, dk, dv)`` (one rank per process)."""
        return self.backward_all([(q, k, v, o, lse, dout)], deterministic)[0]


def _f32(like):
    if A.is_torch(like):
        import torch
        return torch.float32
    import numpy as np
    return np.float32
