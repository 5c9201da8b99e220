"""hvd.metrics(): hora_get_stats as a dict of plain numbers, keyed by the C
field names, whose counters grow by what the operations run did."""
import os
import re

import torch

import hora.torch as hvd

HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include", "hora.h")


def _c_fields():
    """hora_stats's field names, in order, from include/hora.h."""
    with open(HEADER) as f:
        text = re.sub(r"/\*.*?\*/", " ", f.read(), flags=re.S)
    body = re.search(r"typedef\s+struct\s+hora_stats\s*\{(.*?)\}\s*hora_stats\s*;", text, re.S)
    assert body, "include/hora.h has no hora_stats"
    names = []
    for decl in body.group(1).split(";"):
        words = decl.replace(",", " , ").split()
        if words:
            names += [w for w in words[1:] if w != ","]
    return names


def test_metrics_are_plain_numbers_keyed_by_the_c_fields():
    m = hvd.metrics()
    assert list(m) == [n for n in _c_fields() if n != "struct_size"]
    for k, v in m.items():
        assert type(v) in (int, float), "%s is a %s" % (k, type(v).__name__)
        assert v >= 0, "%s = %r" % (k, v)
    assert isinstance(m["negotiate_seconds"], float) and isinstance(m["allreduces"], int)


def test_counters_grow_by_the_operations_run():
    n, count = 5, 100
    before = hvd.metrics()
    for i in range(n):
        hvd.allreduce(torch.ones(count), name="metrics.sum.%d" % i, op=hvd.Sum)
    hvd.broadcast(torch.ones(2, 3, dtype=torch.float64), root_rank=0, name="metrics.bcast")
    after = hvd.metrics()
    grew = {k: after[k] - before[k] for k in before}
    assert grew["allreduces"] == n, grew
    assert grew["broadcasts"] == 1, grew
    assert grew["operations"] == n + 1, grew
    assert grew["bytes"] == n * count * 4 + 6 * 8, grew
    for k in ("negotiate_seconds", "communicate_seconds", "cycles", "cache_hits"):
        assert grew[k] >= 0, (k, grew)


def test_fused_batches_counted():
    before = hvd.metrics()
    handles = [hvd.allreduce_async(torch.ones(8), name="metrics.fuse.%d" % i, op=hvd.Sum)
               for i in range(4)]
    for h in handles:
        hvd.synchronize(h)
    after = hvd.metrics()
    assert after["allreduces"] - before["allreduces"] == 4
    batches = after["fused_batches"] - before["fused_batches"]
    tensors = after["fused_tensors"] - before["fused_tensors"]
    # However the four were grouped, each fused batch holds 2 or more of them.
    assert 2 * batches <= tensors <= 4, (batches, tensors)


def test_step_stats_count_optimizer_steps():
    """DistributedOptimizer.step() ends a step (hora_step_mark): compute and
    exposed communication add up to the step's time."""
    model = torch.nn.Linear(64, 8)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())

    def step():
        opt.zero_grad()
        model(torch.ones(4, 64)).sum().backward()
        opt.step()

    step()  # ends an earlier test's step, or starts the first
    before = hvd.step_stats()
    for _ in range(3):
        step()
    after = hvd.step_stats()
    assert after["steps"] - before["steps"] == 3, (before, after)
    seconds = after["seconds"] - before["seconds"]
    wait = after["wait_seconds"] - before["wait_seconds"]
    compute = after["compute_seconds"] - before["compute_seconds"]
    assert seconds > 0 and wait >= 0 and abs(seconds - wait - compute) < 1e-6, after
    # One rank allreduces nothing (Horovod's optimizer leaves out its hooks).
    grads = (64 * 8 + 8) * 4 if hvd.size() > 1 else 0
    assert after["last_bytes"] == grads, after
    assert after["bytes"] - before["bytes"] == 3 * grads, after
