"""broadcast_parameters, broadcast_optimizer_state, broadcast_object,
allgather_object, the timeline calls, and the loader's error."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch
import torch.nn as nn

import hora.torch as hvd


def test_broadcast_parameters_from_every_root():
    for root in range(hvd.size()):
        torch.manual_seed(hvd.rank())
        model = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5))
        torch.manual_seed(root)
        want = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5))
        hvd.broadcast_parameters(model.state_dict(), root_rank=root)
        for (k, a), (_, b) in zip(model.state_dict().items(), want.state_dict().items()):
            assert torch.equal(a, b), k
        torch.manual_seed(hvd.rank())
        m2 = nn.Linear(3, 3)
        hvd.broadcast_parameters(list(m2.named_parameters()), root_rank=root)
        torch.manual_seed(root)
        assert torch.equal(m2.weight, nn.Linear(3, 3).weight)
    with pytest.raises(ValueError, match="invalid params"):
        hvd.broadcast_parameters(42, root_rank=0)


@pytest.mark.parametrize("make_opt", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.9)),
    lambda p: torch.optim.RMSprop(p, lr=0.01),
], ids=["sgd", "adam", "rmsprop"])
def test_broadcast_optimizer_state(make_opt):
    torch.manual_seed(0)
    model = nn.Linear(6, 2)
    opt = make_opt(model.parameters())
    if hvd.rank() == 0:
        # The root has state; the others have none yet.
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4, 6)).sum().backward()
            opt.step()
        opt.param_groups[0]["lr"] = 0.123
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    sd = opt.state_dict()
    assert opt.param_groups[0]["lr"] == 0.123
    flat = []
    for pid in sorted(sd["state"]):
        for k in sorted(sd["state"][pid]):
            v = sd["state"][pid][k]
            flat.append(v.reshape(-1).double() if torch.is_tensor(v)
                        else torch.tensor([float(v)], dtype=torch.float64))
    assert flat, "the root's state did not arrive"
    mine = torch.cat(flat)
    every = hvd.allgather(mine.unsqueeze(0), name="optstate.check")
    assert all(torch.equal(every[r], every[0]) for r in range(hvd.size()))
    # Training goes on from the broadcast state.
    opt.zero_grad()
    model(torch.ones(2, 6)).sum().backward()
    opt.step()


def test_objects_with_lambdas_travel_where_cloudpickle_is_there():
    pytest.importorskip("cloudpickle")
    k = 1 + hvd.rank()  # a closure over the root's value
    f = hvd.broadcast_object((lambda v: v + k) if hvd.rank() == 0 else None, 0, name="lambda")
    assert f(1) == 2


def test_broadcast_and_allgather_objects():
    obj = {"rank": hvd.rank(), "list": list(range(hvd.rank() + 2)), "s": "x" * hvd.rank()}
    for root in range(hvd.size()):
        got = hvd.broadcast_object(obj if hvd.rank() == root else None, root_rank=root,
                                   name="obj.%d" % root)
        assert got == {"rank": root, "list": list(range(root + 2)), "s": "x" * root}
    every = hvd.allgather_object(obj)
    assert every == [{"rank": r, "list": list(range(r + 2)), "s": "x" * r}
                     for r in range(hvd.size())]


def test_timeline_start_and_stop():
    path = os.path.join(tempfile.gettempdir(), "hora-py-timeline-%d.json" % os.getpid())
    path = hvd.broadcast_object(path, 0, name="timeline.path")
    hvd.start_timeline(path, mark_cycles=True)
    for i in range(3):
        hvd.allreduce(torch.ones(16), name="timeline.t%d" % i)
    hvd.stop_timeline()
    hvd.barrier()
    if hvd.rank() == 0:
        with open(path) as f:
            events = json.load(f)
        text = json.dumps(events)
        assert "timeline.t2" in text
        os.unlink(path)
    hvd.barrier()


def test_a_missing_library_names_where_it_looked(tmp_path):
    # A copy of the package away from the build tree, pointed at nothing.
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "hora")
    shutil.copytree(src, tmp_path / "pkg" / "hora", ignore=shutil.ignore_patterns("_installed.py"))
    env = dict(os.environ, HORA_LIBRARY="/nonexistent/libhora.so.0",
               PYTHONPATH=str(tmp_path / "pkg"), LD_LIBRARY_PATH="")
    p = subprocess.run([sys.executable, "-c", "import hora._lib as L; L.load()"], env=env,
                       capture_output=True, text=True, cwd=str(tmp_path))
    if p.returncode == 0:
        pytest.skip("a libhora is installed on the system's library path")
    assert "cannot load libhora" in p.stderr, p.stderr
    assert "/nonexistent/libhora.so.0 (HORA_LIBRARY): no such file" in p.stderr, p.stderr
    assert "the system's library path" in p.stderr
