"""DSD over several GPUs, through a ``torch.distributed`` process group with the NCCL backend.

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

__all__ = ["DistributedDSD", "dsd", "partition_block_rows", "nccl_version", "NcclError"]

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
