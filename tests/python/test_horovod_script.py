"""A Horovod training script with only its import changed still runs."""
import torch
import torch.nn as nn

import hora.torch as hvd  # was: import horovod.torch as hvd


def test_the_horovod_seed_script_runs_unchanged():
    accum_steps = 2
    hvd.init()
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         backward_passes_per_step=accum_steps)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    g = torch.Generator().manual_seed(hvd.rank())
    for step in range(3 + hvd.rank()):  # uneven: rank r has 3 + r steps of data
        optimizer.zero_grad()
        for _ in range(accum_steps):
            x = torch.randn(4, 8, generator=g)
            (nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()) / accum_steps).backward()
        optimizer.step()
    last = hvd.join()  # a worker out of data keeps serving the others
    assert last == hvd.size() - 1
