"""sparsek.nn.BlockSparseLinear: forward and backward against nn.Linear on the dense weight, pruning,
state_dict, autocast, torch.compile, training, errors. CPU everywhere; CUDA cases skip without a GPU.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import sparsek.nn  # noqa: E402
from sparsek.nn import BlockSparseLinear  # noqa: E402

from conftest import torch_cuda  # noqa: E402

HAS_CUDA, NO_CUDA = torch_cuda()
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA)


def reference(layer):
    """An nn.Linear (float64) holding the layer's dense weight and bias."""
    lin = torch.nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None,
                          dtype=torch.float64)
    with torch.no_grad():
        lin.weight.copy_(layer.to_dense().double())
        if layer.bias is not None:
            lin.bias.copy_(layer.bias.double())
    return lin


def close(got, want, tol=2e-5):
    got, want = got.detach(), want.detach()
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol * max(1.0, float(want.abs().max())))


@pytest.mark.parametrize("method", ["dds", "dsd"])
@pytest.mark.parametrize("block,density", [((32, 32), 0.5), ((16, 64), 0.25), ((64, 16), 1.0)])
def test_forward_backward_match_dense(block, density, method):
    torch.manual_seed(0)
    layer = BlockSparseLinear(128, 192, block, density=density, method=method,
                              generator=torch.Generator().manual_seed(1))
    ref = reference(layer)
    x = torch.randn(3, 5, 128, requires_grad=True)
    xd = x.detach().double().requires_grad_(True)
    y = layer(x)
    yd = ref(xd)
    assert y.shape == (3, 5, 192)
    close(y, yd)
    g = torch.randn_like(yd)
    y.backward(g.float())
    yd.backward(g)
    close(x.grad, xd.grad)
    mb, kb = 192 // block[0], 128 // block[1]
    blocks = ref.weight.grad.reshape(mb, block[0], kb, block[1]).permute(0, 2, 1, 3)
    stored = torch.zeros(mb, kb, dtype=torch.bool)
    rp = layer.row_ptr.tolist()
    for r in range(mb):
        stored[r, layer.col_idx[rp[r]:rp[r + 1]].long()] = True
    close(layer.values.grad, blocks[stored])  # the weight's gradient on the stored blocks only
    close(layer.bias.grad, ref.bias.grad)


def test_density_keeps_k_blocks_per_row_and_mask():
    layer = BlockSparseLinear(256, 128, (32, 64), density=0.5, bias=False)
    counts = layer.row_ptr.diff()
    assert torch.all(counts == 2) and layer.values.shape == (8, 32, 64) and layer.bias is None
    mask = np.zeros((4, 4), bool)
    mask[0, 3] = mask[2, 0] = mask[2, 1] = True
    m = BlockSparseLinear(256, 128, (32, 64), mask=mask)
    assert m.row_ptr.tolist() == [0, 1, 1, 3, 3] and m.col_idx.tolist() == [3, 0, 1]
    x = torch.randn(2, 256)
    close(m(x), reference(m)(x.double()))  # empty block rows give the bias alone


def test_from_dense_prunes_by_block_magnitude():
    torch.manual_seed(0)
    lin = torch.nn.Linear(128, 64)
    with torch.no_grad():
        lin.weight.mul_(0.01)
        lin.weight[:32, 64:96] = 5.0   # the largest block of block row 0
        lin.weight[32:, :32] = -4.0    # ... and of block row 1
    per_row = BlockSparseLinear.from_dense(lin, block=(32, 32), density=0.25)
    assert per_row.col_idx.tolist() == [2, 0]
    assert torch.equal(per_row.to_dense()[:32, 64:96], lin.weight[:32, 64:96])
    assert torch.equal(per_row.bias, lin.bias)
    glob = BlockSparseLinear.from_dense(lin, block=(32, 32), density=0.25, per_row=False)
    assert glob.row_ptr.tolist() == [0, 1, 2] and glob.col_idx.tolist() == [2, 0]
    full = BlockSparseLinear.from_dense(lin, block=(32, 32), density=1.0)
    x = torch.randn(4, 128)
    close(full(x), lin(x), 1e-5)
    with pytest.raises(TypeError, match="expects a torch.nn.Linear"):
        BlockSparseLinear.from_dense(torch.nn.Conv1d(2, 2, 1), block=(32, 32), density=0.5)


def test_state_dict_round_trip():
    a = BlockSparseLinear(128, 64, (32, 32), density=0.5, generator=torch.Generator().manual_seed(3))
    b = BlockSparseLinear(128, 64, (32, 32), density=0.5, generator=torch.Generator().manual_seed(4))
    x = torch.randn(6, 128)
    b(x)  # b has a plan for its own pattern
    sd = a.state_dict()
    assert set(sd) == {"row_ptr", "col_idx", "values", "bias"}
    b.load_state_dict(sd)  # same nnzb, another pattern: copied in place (the plan is redone)
    assert torch.equal(b.col_idx, a.col_idx)
    assert torch.equal(b(x), a(x))


def test_autocast_bf16_on_cpu():
    layer = BlockSparseLinear(128, 64, (32, 32), density=0.5)
    x = torch.randn(8, 128)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16 and layer.values.dtype == torch.float32
    close(y.float(), reference(layer)(x.double()), 3e-2)
    y.float().sum().backward()
    assert layer.values.grad.dtype == torch.float32


def test_torch_compile_fullgraph_trains():
    torch.manual_seed(0)
    layer = BlockSparseLinear(64, 96, (32, 32), density=0.5)
    ref = reference(layer)
    x = torch.randn(10, 64)
    torch._dynamo.reset()
    f = torch.compile(lambda x: layer(x).square().sum(), fullgraph=True)
    loss = f(x)
    loss.backward()
    lossd = ref(x.double()).square().sum()
    lossd.backward()
    close(loss, lossd, 1e-4)
    close(layer.bias.grad, ref.bias.grad, 1e-4)


def test_training_reduces_the_loss():
    torch.manual_seed(0)
    model = torch.nn.Sequential(BlockSparseLinear(64, 128, (16, 16), density=0.5), torch.nn.ReLU(),
                                BlockSparseLinear(128, 16, (16, 16), density=0.5))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.randn(256, 64)
    target = torch.randn(256, 16)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.7 * losses[0]


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="exactly one of density= or mask="):
        BlockSparseLinear(64, 64, (32, 32))
    with pytest.raises(ValueError, match=r"density must be in \(0, 1\], got 1.5"):
        BlockSparseLinear(64, 64, (32, 32), density=1.5)
    with pytest.raises(TypeError, match="in_features must be an int, got float 64.7"):
        BlockSparseLinear(64.7, 64, (32, 32), density=0.5)
    with pytest.raises(ValueError, match="rows=96 is not a multiple of bm=64|not a multiple"):
        BlockSparseLinear(64, 96, (64, 32), density=0.5)
    with pytest.raises(ValueError, match=r"mask must have shape .*\(2, 2\)"):
        BlockSparseLinear(64, 64, (32, 32), mask=np.ones((3, 2), bool))
    with pytest.raises(ValueError, match="method must be one of"):
        BlockSparseLinear(64, 64, (32, 32), density=0.5, method="fast")
    layer = BlockSparseLinear(64, 64, (32, 32), density=0.5)
    with pytest.raises(ValueError, match=r"in_features=64 as its last dimension, got shape \(3, 65\)"):
        layer(torch.randn(3, 65))
    with pytest.raises(ValueError, match="dtype float64 is not supported"):
        layer(torch.randn(3, 64, dtype=torch.float64))


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_layer_and_auto_method(dtype):
    torch.manual_seed(0)
    layer = BlockSparseLinear(512, 768, (64, 64), density=0.25, device="cuda", dtype=dtype)
    x = torch.randn(256, 512, device="cuda", dtype=dtype, requires_grad=True)
    y = layer(x)
    assert layer.method in ("dds", "dsd") and set(layer.measured_ms) == {"dds", "dsd"}
    ref = reference(layer).cuda()
    close(y, ref(x.detach().double()), 2e-2)
    y.float().sum().backward()
    xd = x.detach().double().requires_grad_(True)
    ref(xd).sum().backward()
    close(x.grad, xd.grad, 2e-2)
    # float32 weights on the GPU under autocast.
    l32 = BlockSparseLinear(512, 768, (64, 64), density=0.25, device="cuda")
    with torch.autocast("cuda", dtype=dtype):
        assert l32(torch.randn(8, 512, device="cuda")).dtype == dtype


# ---------------------------------------------------------------- the examples

def _example(name, *args):
    import os
    import subprocess
    import sys
    root = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python")
    return subprocess.run([sys.executable, os.path.join(root, name), *args], capture_output=True,
                          text=True, timeout=600)


def test_example_train_mlp_on_cpu():
    r = _example("train_mlp.py", "--steps", "8", "--cpu", "--hidden", "256")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "step   7" in r.stdout and "loss" in r.stdout.splitlines()[-1]


@cuda_only
def test_example_serve_cuda_graph():
    r = _example("serve_cuda_graph.py", "--requests", "5")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "served from one CUDA graph" in r.stdout
