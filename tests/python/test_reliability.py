"""Bad input from Python, named by argument and value: boolean flags that are not booleans, integers
beyond what the library's types hold, read-only outputs, a layout without its arrays, attention
extents of 0, a row_ptr that is not one, NCCL failures; and the backward reading the forward's LSE.
NumPy tests run everywhere; the torch ones skip without torch."""
import math

import numpy as np
import pytest

import sparsek
import sparsek.distributed as sd
from sparsek import _sparsek as _ext

from conftest import block_sparse_dense, dense_operand


def attention_args(rng, B=1, H=1, S=128, D=64, block=64):
    """q, k, v [B, H, S, D] float32 and a layout of every block (causal-ready)."""
    q, k, v = (rng.standard_normal((B, H, S, D)).astype(np.float32) for _ in range(3))
    nq = -(-S // block)
    num = np.full((1, 1, nq), nq, np.int32)
    idx = np.ascontiguousarray(np.broadcast_to(np.arange(nq, dtype=np.int32), (1, 1, nq, nq)))
    return q, k, v, sparsek.BlockLayout(num, idx, block=block)


def small_matrix(rng):
    dense, _ = block_sparse_dense(rng, 64, 64, 32, 32, density=0.6)
    return dense, sparsek.BSRMatrix.from_dense(dense, block=(32, 32))


# ---------------------------------------------------------------- boolean flags

NOT_BOOLS = ["False", "True", 0, 1, None, 0.0, [], np.array([True])]


@pytest.mark.parametrize("value", NOT_BOOLS, ids=repr)
def test_numpy_api_flags_must_be_booleans(rng, value):
    q, k, v, lay = attention_args(rng)
    _, a = small_matrix(rng)
    calls = {
        "causal": lambda: sparsek.attention(q, k, v, lay, causal=value),
        "check_layout": lambda: sparsek.attention(q, k, v, lay, check_layout=value),
        "causal ": lambda: sparsek.gate(q, k, 1, block=64, causal=value),
        "return_scores": lambda: sparsek.gate(q, k, 1, block=64, return_scores=value),
        "check": lambda: sparsek.BSRMatrix(a.row_ptr, a.col_idx, a.values, a.shape, check=value),
        "all_gather": lambda: sd.DistributedDSD(a, all_gather=value),
        "all_gather ": lambda: sd.dsd(a, np.ones((64, 4), np.float32), all_gather=value),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match=rf"^{name.strip()} must be True or False, got {type(value).__name__} "):
            call()


def test_causal_string_false_is_not_causal_attention(rng):
    # The silent wrong answer: causal="False" used to run causal attention. NumPy booleans work.
    q, k, v, lay = attention_args(rng)
    with pytest.raises(TypeError, match="causal must be True or False, got str 'False'"):
        sparsek.attention(q, k, v, lay, causal="False")
    o_np, _ = sparsek.attention(q, k, v, lay, causal=np.bool_(True))
    o_py, _ = sparsek.attention(q, k, v, lay, causal=True)
    o_no, _ = sparsek.attention(q, k, v, lay, causal=False)
    assert np.array_equal(o_np, o_py) and not np.array_equal(o_py, o_no)


def test_torch_api_flags_must_be_booleans(rng):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import sparsek.nn
    from sparsek.xformers import BlockSparseAttentionOp, Inputs
    q, k, v, lay = attention_args(rng)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    tlay = sparsek.BlockLayout(torch.from_numpy(lay.kv_num_blocks), torch.from_numpy(lay.kv_indices), block=64)
    lin = torch.nn.Linear(64, 64)
    gate = sparsek.nn.TopKGate(64, block=64, topk=1)
    calls = {
        "causal": lambda: sparsek.attention(tq, tk, tv, tlay, causal="False"),
        "check_layout": lambda: sparsek.attention(tq, tk, tv, tlay, check_layout="no"),
        "return_scores": lambda: sparsek.gate(tq, tk, 1, block=64, return_scores=1),
        "causal ": lambda: sparsek.block_mask_from_layout(tlay, 128, 128, causal="False"),
        "bias": lambda: sparsek.nn.BlockSparseLinear(64, 64, (32, 32), density=0.5, bias="False"),
        "per_row": lambda: sparsek.nn.BlockSparseLinear.from_dense(lin, (32, 32), 0.5, per_row=0),
        "causal  ": lambda: sparsek.nn.TopKGate(64, block=64, causal="True"),
        "return_scores ": lambda: gate(tq, tk, return_scores="yes"),
        "needs_gradient": lambda: BlockSparseAttentionOp.apply(
            Inputs(tq.transpose(1, 2), tk.transpose(1, 2), tv.transpose(1, 2), attn_bias=tlay), needs_gradient="no"),
        "causal   ": lambda: BlockSparseAttentionOp.apply(
            Inputs(tq.transpose(1, 2), tk.transpose(1, 2), tv.transpose(1, 2), attn_bias=tlay, causal="False")),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match=rf"^{name.strip()} must be True or False, got "):
            call()
    reasons = BlockSparseAttentionOp.not_supported_reasons(
        Inputs(tq.transpose(1, 2), tk.transpose(1, 2), tv.transpose(1, 2), attn_bias=tlay, causal="False"))
    assert any("causal must be True or False, got str 'False'" in r for r in reasons), reasons


# ---------------------------------------------------------------- integers the library cannot hold

def test_integers_too_large_for_the_library_are_named(rng):
    q, k, _, _ = attention_args(rng)
    dense, a = small_matrix(rng)
    cases = [
        (lambda: sparsek.gate(q, k, 2**31, block=64), "topk=2147483648 is too large"),
        (lambda: sparsek.gate(q, k, 1, block=64, sink=2**40), "sink=1099511627776 is too large"),
        (lambda: sparsek.gate(q, k, 1, block=64, local=2**31), "local=2147483648 is too large"),
        (lambda: sparsek.gate(q, k, 1, block=2**31), "block=2147483648 is too large"),
        (lambda: sd.partition_block_rows(a.row_ptr, 2**31), "ranks=2147483648 is too large"),
        (lambda: sparsek.BSRMatrix(a.row_ptr, a.col_idx, a.values, (2**63, 64)),
         r"shape\[0\]=9223372036854775808 is too large"),
        (lambda: sparsek.BSRMatrix.from_dense(dense, block=(2**31, 32)), r"block\[0\]=2147483648 is too large"),
        (lambda: sd.DistributedDSD(a, broadcast_from=2**31), "broadcast_from=2147483648 is too large"),
    ]
    for call, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            call()


# ---------------------------------------------------------------- read-only outputs, missing arrays, empty extents

def test_read_only_outputs_are_named(rng):
    dense, a = small_matrix(rng)
    b = dense_operand(rng, 64, 8)
    frozen = np.zeros((64, 8), np.float32)
    frozen.setflags(write=False)
    with pytest.raises(ValueError, match=r"out is a read-only array \(shape \(64, 8\)\)"):
        sparsek.bsr_mm(a, b, out=frozen)
    with pytest.raises(ValueError, match="out is a read-only array"):
        sparsek.dense_bsr_mm(dense_operand(rng, 8, 64), a, out=np.broadcast_to(np.float32(0), (8, 64)))
    values = a.values.copy()
    values.setflags(write=False)
    out = sparsek.BSRMatrix(a.row_ptr, a.col_idx, values, a.shape)
    with pytest.raises(ValueError, match="out.values is a read-only array"):
        sparsek.sampled_mm(dense_operand(rng, 64, 16), dense_operand(rng, 16, 64), a, out=out)


def test_a_layout_needs_both_of_its_arrays(rng):
    _, _, _, lay = attention_args(rng)
    with pytest.raises(TypeError, match="kv_num_blocks is required, got None"):
        sparsek.BlockLayout(None, lay.kv_indices, block=64)
    with pytest.raises(TypeError, match="kv_indices is required, got None"):
        sparsek.BlockLayout(lay.kv_num_blocks, None, block=64)


def test_attention_extents_of_zero_are_named(rng):
    q, k, v, lay = attention_args(rng)
    for args, pattern in [
        ((q[:0], k[:0], v[:0]), r"q has shape \(0, 1, 128, 64\): its batch \(dimension 0\) is 0"),
        ((q, k[:, :0], v[:, :0]), r"k has shape \(1, 0, 128, 64\): its heads \(dimension 1\) is 0"),
        ((q, k, v[:, :, :0]), r"v has shape \(1, 1, 0, 64\): its sequence length \(dimension 2\) is 0"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            sparsek.attention(*args, lay)


def test_gate_of_an_empty_batch_is_empty(rng):
    q, k, _, _ = attention_args(rng)
    lay = sparsek.gate(q[:0], k[:0], 1, block=64)
    assert lay.kv_num_blocks.shape == (0, 1, 2) and lay.kv_indices.shape == (0, 1, 2, 2)


# ---------------------------------------------------------------- partition

def test_partition_refuses_a_row_ptr_that_is_not_one():
    for rp, pattern in [
        ([0, 9, 3, 1], r"row_ptr\[2\]=3 is less than row_ptr\[1\]=9"),
        ([2, 4, 6], r"row_ptr\[0\]=2 must be 0"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            sd.partition_block_rows(np.array(rp, np.int32), 2)
    with pytest.raises(ValueError, match="row_ptr holds values that do not fit in int32"):
        sd.partition_block_rows(np.array([0, 2**32 + 1], np.int64), 2)  # a plain cast would read [0, 1]
    with pytest.raises(ValueError, match="row_ptr must be a 1-D array"):
        sd.partition_block_rows(np.zeros((2, 2), np.int32), 2)
    with pytest.raises(ValueError, match="row_ptr must hold integers, got dtype float64"):
        sd.partition_block_rows([0, 1.5, 2], 2)
    assert sd.partition_block_rows(np.array([0, 1, 2], np.int64), 2) == [0, 1, 2]
    assert sd.partition_block_rows([0, 1, 2], 2) == [0, 1, 2]


# ---------------------------------------------------------------- NCCL

def test_nccl_failures_raise_ncclerror(rng):
    try:
        sd.nccl_version()
    except NotImplementedError as e:
        pytest.skip(str(e))
    assert issubclass(sd.NcclError, RuntimeError)
    _, a = small_matrix(rng)
    b = dense_operand(rng, 64, 8)
    c = np.zeros((64, 8), np.float32)
    fake = np.zeros(1 << 21, np.uint64)  # zeroed memory: not a communicator NCCL recognises
    with pytest.raises(sd.NcclError, match=r"NCCL: ncclCommCount failed: .*ncclInvalidArgument"):
        _ext.plan_dsd_distributed(64, 64, a.row_ptr, a.col_idx, a.values, b, c, fake.ctypes.data, -1, False, 0)


# ---------------------------------------------------------------- the backward reads the forward's LSE

def test_backward_takes_p_from_the_given_lse(rng):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    q, k, v, lay = attention_args(rng)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    num, idx = torch.from_numpy(lay.kv_num_blocks), torch.from_numpy(lay.kv_indices)
    o, lse = sparsek.attention(tq, tk, tv, sparsek.BlockLayout(num, idx, block=64), causal=True)
    dout = torch.from_numpy(rng.standard_normal(q.shape).astype(np.float32))
    scale = 1 / math.sqrt(64)

    def grads(l):
        return torch.ops.sparsek.attention_backward(tq, tk, tv, o, l, dout, num, idx, None, None, 64, True, scale)

    base = grads(lse)
    half = grads(lse + math.log(2))  # P halves: so does every gradient
    for g, h in zip(base, half):
        torch.testing.assert_close(h, g / 2, rtol=1e-5, atol=1e-6)
    nan = lse.clone()
    nan[0, 0, 5] = float("nan")
    dq = grads(nan)[0]
    assert torch.isnan(dq[0, 0, 5]).all() and torch.equal(dq[0, 0, 6:], base[0][0, 0, 6:])
