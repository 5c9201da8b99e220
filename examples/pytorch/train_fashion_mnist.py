#!/usr/bin/python3
"""A small CNN on Fashion-MNIST, trained data-parallel with hora.torch.

Written as a Horovod script (only the import differs): each rank trains on
its own, deliberately uneven, shard of the training set; gradients are
averaged by hvd.DistributedOptimizer (optionally in fp16, optionally over
several backward passes); a rank out of data calls hvd.join() and keeps
serving the others' allreduces; the parameters are then broadcast from the
rank that joined last, and the test set is scored by all ranks together.

    mpirun -np 4 /usr/bin/python3 examples/pytorch/train_fashion_mnist.py

Reads Debian's dataset-fashion-mnist files directly (no download).
"""
import argparse
import gzip
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import hora.torch as hvd  # noqa: E402  (was: import horovod.torch as hvd)


def print_steps(epoch, before, after):
    """hora's figures for the epoch's optimizer steps (hvd.step_stats(), not
    in Horovod): compute against exposed communication."""
    n = after["steps"] - before["steps"]
    if n <= 0:
        return
    seconds = after["seconds"] - before["seconds"]
    wait = after["wait_seconds"] - before["wait_seconds"]
    comm = after["communicate_seconds"] - before["communicate_seconds"]
    bus = after["bus_bytes"] - before["bus_bytes"]
    print("epoch %d: %d steps of %.1f ms: %.1f ms compute, %.1f ms exposed communication "
          "(%.0f%%); %.0f KiB reduced per step at %.2f GB/s bus bandwidth"
          % (epoch, n, 1e3 * seconds / n, 1e3 * (seconds - wait) / n, 1e3 * wait / n,
             100 * wait / seconds if seconds > 0 else 0,
             (after["bytes"] - before["bytes"]) / n / 1024, bus / comm * 1e-9 if comm > 0 else 0),
          flush=True)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--batch-size", type=int, default=64, help="per rank and backward pass")
    p.add_argument("--test-batch-size", type=int, default=1000)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--lr", type=float, default=0.002, help="Adam's step size, before scaling")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--fp16-allreduce", action="store_true", help="fp16 compression")
    p.add_argument("--accum-steps", type=int, default=1,
                   help="backward passes per optimizer step (backward_passes_per_step)")
    p.add_argument("--even", action="store_true", help="equal shards instead of uneven ones")
    p.add_argument("--log-interval", type=int, default=0, help="batches between loss lines")
    return p.parse_args()


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return torch.frombuffer(bytearray(data[4 + 4 * ndim:]), dtype=torch.uint8).view(*dims)


def load(data_dir, split):
    prefix = "train" if split == "train" else "t10k"
    try:
        images = read_idx(os.path.join(data_dir, "%s-images-idx3-ubyte.gz" % prefix))
        labels = read_idx(os.path.join(data_dir, "%s-labels-idx1-ubyte.gz" % prefix))
    except FileNotFoundError as e:
        sys.exit("%s (install dataset-fashion-mnist, or pass --data-dir)" % e)
    x = (images.float().div_(255.0).sub_(0.2860).div_(0.3530)).unsqueeze(1)
    return x, labels.long()


def shard_bounds(n, ranks, rank, even):
    """Rank r's slice of n samples; uneven shards grow by 10% per rank."""
    weights = [1.0] * ranks if even else [1.0 + 0.1 * r for r in range(ranks)]
    edges = [0]
    for w in weights:
        edges.append(edges[-1] + w)
    cut = [round(n * e / edges[-1]) for e in edges]
    return cut[rank], cut[rank + 1]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5)
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.drop = nn.Dropout(0.25)
        self.fc1 = nn.Linear(32 * 4 * 4, 96)
        self.fc2 = nn.Linear(96, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = self.drop(x.flatten(1))
        return self.fc2(F.relu(self.fc1(x)))


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(float(value)), name=name).item()


def evaluate(model, x, y, batch):
    model.eval()
    lo, hi = shard_bounds(len(x), hvd.size(), hvd.rank(), even=True)
    correct = loss = 0.0
    with torch.no_grad():
        for i in range(lo, hi, batch):
            out = model(x[i:min(i + batch, hi)])
            t = y[i:min(i + batch, hi)]
            loss += F.cross_entropy(out, t, reduction="sum").item()
            correct += (out.argmax(1) == t).sum().item()
    total = hvd.allreduce(torch.tensor([correct, loss, float(hi - lo)], dtype=torch.float64),
                          name="test.sums", op=hvd.Sum)
    return (total[0] / total[2]).item(), (total[1] / total[2]).item()


def main():
    args = parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    # Ranks of one host share its cores.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    train_x, train_y = load(args.data_dir, "train")
    test_x, test_y = load(args.data_dir, "test")
    lo, hi = shard_bounds(len(train_x), hvd.size(), hvd.rank(), args.even)

    model = Net()
    # Adam's step grows with the square root of the effective batch.
    lr = args.lr * (hvd.size() * args.accum_steps) ** 0.5
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         backward_passes_per_step=args.accum_steps)
    if hvd.rank() == 0:
        print("hora.torch: %d ranks on %d host(s), shard sizes %s, batch %d x %d passes, lr %.4f%s"
              % (hvd.size(), hvd.cross_size(),
                 [b - a for a, b in (shard_bounds(len(train_x), hvd.size(), r, args.even)
                                     for r in range(hvd.size()))],
                 args.batch_size, args.accum_steps, lr,
                 ", fp16 allreduce" if args.fp16_allreduce else ""), flush=True)
    start = time.time()
    acc = 0.0
    for epoch in range(1, args.epochs + 1):
        steps_before = hvd.step_stats()
        model.train()
        g = torch.Generator().manual_seed(args.seed * 1000 + epoch * 100 + hvd.rank())
        order = lo + torch.randperm(hi - lo, generator=g)
        batches = [order[i:i + args.batch_size] for i in range(0, len(order), args.batch_size)]
        running = 0.0
        for i, idx in enumerate(batches):
            if i % args.accum_steps == 0:
                optimizer.zero_grad()
            loss = F.cross_entropy(model(train_x[idx]), train_y[idx])
            (loss / args.accum_steps).backward()
            running += loss.item()
            if (i + 1) % args.accum_steps == 0 or i + 1 == len(batches):
                optimizer.step()
            if args.log_interval and hvd.rank() == 0 and (i + 1) % args.log_interval == 0:
                print("  epoch %d batch %d/%d loss %.4f" % (epoch, i + 1, len(batches),
                                                          running / (i + 1)), flush=True)
        # Out of data: serve the others' allreduces until every rank is here,
        # then continue from the model of the rank that trained longest.
        last = hvd.join()
        hvd.broadcast_parameters(model.state_dict(), root_rank=last)
        train_loss = metric_average(running / max(1, len(batches)), "train.loss")
        acc, test_loss = evaluate(model, test_x, test_y, args.test_batch_size)
        if hvd.rank() == 0:
            print("epoch %d: train loss %.4f, test loss %.4f, test accuracy %.4f, %.1f s "
                  "(last to join: rank %d)" % (epoch, train_loss, test_loss, acc,
                                               time.time() - start, last), flush=True)
            print_steps(epoch, steps_before, hvd.step_stats())
    if hvd.rank() == 0:
        print("final test accuracy %.4f after %d epochs in %.1f s on %d ranks"
              % (acc, args.epochs, time.time() - start, hvd.size()), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
