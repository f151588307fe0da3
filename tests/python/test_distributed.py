"""sparsek.distributed: the partition from Python (any machine), and a one-rank NCCL process group
whose distributed product equals the one-GPU product bit for bit (a GPU and NCCL needed)."""
import numpy as np
import pytest

import sparsek
import sparsek.distributed as sd

from conftest import block_sparse_dense, dense_operand, torch_cuda


def test_partition_balances_stored_blocks():
    row_ptr = np.cumsum([0, 6, 1, 1, 1, 1, 1, 1]).astype(np.int32)
    assert sd.partition_block_rows(row_ptr, 2) == [0, 1, 7]
    assert sd.partition_block_rows(np.zeros(11, np.int32), 4) == [0, 2, 5, 7, 10]  # nnzb = 0
    with pytest.raises(ValueError, match="ranks=0 must be >= 1"):
        sd.partition_block_rows(row_ptr, 0)


def test_not_a_torch_cuda_matrix_is_refused(rng):
    dense, _ = block_sparse_dense(rng, 64, 64, 32, 32)
    with pytest.raises(TypeError, match="BSRMatrix of torch CUDA tensors"):
        sd.DistributedDSD(sparsek.BSRMatrix.from_dense(dense, block=(32, 32)))


def test_one_rank_group_matches_one_gpu(rng, tmp_path):
    torch = pytest.importorskip("torch")
    usable, why = torch_cuda()
    if not usable:
        pytest.skip(why)
    try:
        sd.nccl_version()
    except NotImplementedError as e:
        pytest.skip(str(e))
    import torch.distributed as dist
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    try:
        dense, _ = block_sparse_dense(rng, 512, 256, 64, 64, integers=False)
        A = sparsek.BSRMatrix.from_dense(torch.from_numpy(dense).half().cuda(), block=(64, 64))
        B = torch.from_numpy(dense_operand(rng, 256, 200, integers=False)).half().cuda()
        mm = sd.DistributedDSD(A, broadcast_from=0, all_gather=True)
        C = mm(B)
        C = mm(B)  # planned once
        assert mm.rows == (0, 512)
        assert torch.equal(C, sparsek.bsr_mm(A, B))
    finally:
        dist.destroy_process_group()


def test_the_example_says_how_many_gpus_it_needs():
    # Run where there are fewer GPUs than ranks: a clear message and exit status 1, no traceback.
    torch = pytest.importorskip("torch")
    import os
    import subprocess
    import sys
    world = (torch.cuda.device_count() if torch.cuda.is_available() else 0) + 1
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, WORLD_SIZE=str(world), LOCAL_RANK="0")
    p = subprocess.run([sys.executable, os.path.join(root, "examples", "python", "distributed_dsd.py")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    assert f"this example needs {world} GPU" in p.stderr and "Traceback" not in p.stderr, p.stderr
