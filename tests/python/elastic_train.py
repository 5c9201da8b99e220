"""Elastic training that loses a rank: a small classifier of four Gaussian
clusters trained with hvd.elastic.run, TorchState, ElasticSampler and a
DistributedOptimizer, in an elastic job (HORA_ELASTIC=1). The rank that
started as HORA_TEST_KILL_RANK kills itself with SIGKILL at its step
HORA_TEST_KILL_STEP (under --launch: once the newcomers are in, and at the
end of training if it ends first); the others lose their collective,
restore the last commit, reset to one rank fewer and finish.

    elastic_train.py --launch NP [--kill-rank R] [--kill-step S] [--no-kill] [--no-secret]
                     [--join K [--join-after SECONDS]] [--step-ms MS]
        starts the job without MPI (HORA_BOOTSTRAP=tcp, a secret file) and
        judges it: prints PASS or FAIL elastic/kill_rank_np<NP>[+K_joining]
        and exits 0 on a pass (a launcher of its own: tests/launch/launch.sh
        stops the job once a process fails); --join starts K processes
        later that ask to join (admitted at a commit point, where every
        member raises HostsUpdatedInterrupt), and the members go on making
        commit points after training until they are in
    elastic_train.py
        one rank, started by a launcher that keeps the survivors (hora-info
        --elastic names them: e.g. mpirun --enable-recovery -x HORA_ELASTIC=1
        -x HORA_RENDEZVOUS=HOST:PORT)

Each survivor prints one line: its rank now and at start, the sizes it
has seen, its resets, the final loss and accuracy over the whole data set,
whether every rank ends with the same model, whether after every sync the
ranks' shares were what is left of the epoch, and whether the process set
made before a reset was refused after it (and made again). It exits 0
when all of these hold and the accuracy is reached.
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EPOCHS = 3
BATCH = 32
COMMIT_EVERY = 4  # batches
SAMPLES = 2048
ACCURACY = 0.9


def data():
    import torch
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(4, 8, generator=g) * 3
    labels = torch.arange(SAMPLES) % 4
    x = centers[labels] + torch.randn(SAMPLES, 8, generator=g)
    return torch.utils.data.TensorDataset(x, labels)


def rank_main():
    sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
    import torch
    import torch.nn.functional as F
    import hora.torch as hvd

    hvd.init()  # a newcomer (no HORA_RANK) returns once admitted at a commit point
    torch.set_num_threads(1)
    from hora import _lib
    started_as = -1 if _lib.load().hora_elastic_joined() else hvd.rank()  # -1: a newcomer
    step_s = float(os.environ.get("HORA_TEST_STEP_MS", "0")) / 1000
    # Under --launch: the rank to kill dies only once the job has been this
    # big (newcomers in: a kill does not race a join), and training ends at
    # this final size (or a minute on).
    peak_size = int(os.environ.get("HORA_TEST_PEAK_SIZE", "0"))
    final_size = int(os.environ.get("HORA_TEST_FINAL_SIZE", "0"))
    kill_rank = int(os.environ.get("HORA_TEST_KILL_RANK", "-1"))
    kill_step = int(os.environ.get("HORA_TEST_KILL_STEP", "0"))
    base_lr = 0.02

    dataset = data()
    torch.manual_seed(hvd.rank())  # different on every rank: the first sync evens them out
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=base_lr * hvd.size(), momentum=0.9),
        named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=1)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)

    seen = {"sizes": [hvd.size()], "resets": 0, "steps": 0, "old_set_refused": None,
            "split_ok": True}
    # A process set made before the loss: made again by the reset callback
    # (Horovod issue 4021); its old object must refuse to run.
    sets = {"pair": hvd.add_process_set([0, 1]) if hvd.size() >= 2 else None}

    def on_reset():
        seen["sizes"].append(hvd.size())
        seen["resets"] += 1
        for group in optimizer.param_groups:
            group["lr"] = base_lr * hvd.size()
        old = sets["pair"]
        if old is not None:
            try:
                hvd.allreduce(torch.ones(1), name="elastic_train.old_pair", process_set=old)
                seen["old_set_refused"] = False
            except ValueError as e:
                seen["old_set_refused"] = "elastic reset" in str(e)
        sets["pair"] = hvd.add_process_set([0, 1]) if hvd.size() >= 2 else None

    def maybe_die(ready):
        if (ready and kill_rank >= 0 and started_as == kill_rank and
                max(seen["sizes"]) >= peak_size):
            print("rank %d (started as %s): killing itself at step %d"
                  % (hvd.rank(), started_as, seen["steps"]), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    @hvd.elastic.run
    def train(state):
        pair = sets["pair"]
        if pair is not None and pair.included():
            n = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="elastic_train.pair",
                              process_set=pair)
            assert n.item() == 2, n
        # After every sync: the ranks' shares are what is left of the epoch,
        # equal in length, between them every sample left.
        shares = hvd.allgather_object(list(state.sampler), name="elastic_train.shares")
        if (set().union(*map(set, shares)) != set(state.sampler.remaining_indices) or
                len({len(x) for x in shares}) != 1):
            seen["split_ok"] = False
        while state.epoch < EPOCHS:
            for x, y in loader:
                seen["steps"] += 1
                maybe_die(seen["steps"] >= kill_step)
                time.sleep(step_s)
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                state.sampler.record_batch(state.batch, len(y))
                state.batch += 1
                if state.batch % COMMIT_EVERY == 0:
                    state.commit()
            state.epoch += 1
            state.batch = 0
            state.sampler.set_epoch(state.epoch)
            state.commit()
        # Commit points until the newcomers are in and the rank to kill has
        # died (here if training ended first). Counted, not timed: every
        # rank must make as many.
        for _ in range(1200):
            if not final_size or (hvd.size() == final_size and max(seen["sizes"]) >= peak_size):
                break
            maybe_die(True)
            time.sleep(0.05)
            state.check_host_updates()

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)
    state.register_reset_callbacks([on_reset])
    train(state)

    model.eval()
    with torch.no_grad():
        x, y = dataset.tensors
        out = model(x)
        loss = F.cross_entropy(out, y).item()
        accuracy = (out.argmax(1) == y).float().mean().item()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).unsqueeze(0)
    every = hvd.allgather(flat, name="elastic_train.models")
    same = all(torch.equal(every[r], every[0]) for r in range(hvd.size()))
    ok = (accuracy >= ACCURACY and same and seen["split_ok"] and
          seen["old_set_refused"] in (None, True))
    print("rank %d (started as %s): sizes %s, resets %d, steps %d, loss %.4f, accuracy %.4f, "
          "same model on every rank: %s, epoch split right after every sync: %s, old process "
          "set refused: %s, %s"
          % (hvd.rank(), started_as if started_as >= 0 else "a newcomer", seen["sizes"],
             seen["resets"], seen["steps"], loss, accuracy, "yes" if same else "NO",
             "yes" if seen["split_ok"] else "NO", seen["old_set_refused"],
             "ok" if ok else "FAILED"), flush=True)
    hvd.shutdown()
    return 0 if ok else 1


def free_port():
    # Below the ephemeral range, so no outgoing connection takes it meanwhile.
    for port in range(20000 + os.getpid() % 10000, 32000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port")


def launch(np, kill_rank, kill_step, limit, with_secret, join, join_after, step_ms):
    work = tempfile.mkdtemp(prefix="hora-elastic-")
    secret = os.path.join(work, "secret")
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32).hex().encode() + b"\n")
    os.close(fd)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_COMM", "PMI", "PMIX", "SLURM_", "HYDRA_", "MPI_LOCAL"))
           and k not in ("HORA_BOOTSTRAP", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                         "HORA_SECRET", "HORA_SECRET_FILE", "HORA_RANK", "HORA_SIZE")}
    env.update(HORA_BOOTSTRAP="tcp", HORA_RENDEZVOUS="127.0.0.1:%d" % free_port(),
               HORA_ELASTIC="1",
               HORA_TEST_KILL_RANK=str(kill_rank), HORA_TEST_KILL_STEP=str(kill_step),
               HORA_TEST_STEP_MS=str(step_ms),
               HORA_TEST_PEAK_SIZE=str(np + join),
               HORA_TEST_FINAL_SIZE=str(np + join - (kill_rank >= 0)))
    if with_secret:
        env["HORA_SECRET_FILE"] = secret
    procs = []

    def start(r, extra):
        out = open(os.path.join(work, "out.%d" % r), "w+")
        procs.append((subprocess.Popen([sys.executable, os.path.abspath(__file__)],
                                       env=dict(env, **extra), stdin=subprocess.DEVNULL,
                                       stdout=out, stderr=subprocess.STDOUT), out))

    for r in range(np):
        start(r, {"HORA_RANK": str(r), "HORA_SIZE": str(np)})
    if join:
        time.sleep(join_after)
        for r in range(np, np + join):  # no rank, no size: they ask to join
            start(r, {})
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and any(p.poll() is None for p, _ in procs):
        time.sleep(0.2)
    timed_out = [r for r, (p, _) in enumerate(procs) if p.poll() is None]
    for p, _ in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    bad = []
    for r, (p, out) in enumerate(procs):
        out.seek(0)
        text = out.read()
        out.close()
        for line in text.splitlines():
            print("[%d] %s" % (r, line))
        if r in timed_out:
            bad.append("rank %d still running after %d s" % (r, limit))
        elif r == kill_rank:
            if p.returncode != -signal.SIGKILL:
                bad.append("rank %d (to be killed) exited with %d" % (r, p.returncode))
        elif p.returncode != 0 or ", ok" not in text:
            bad.append("rank %d exited with %d" % (r, p.returncode))
    for f in os.listdir(work):
        os.unlink(os.path.join(work, f))
    os.rmdir(work)
    name = "elastic/%s_np%d%s" % ("kill_rank" if kill_rank >= 0 else "no_kill", np,
                                  "+%d_joining" % join if join else "")
    print(("PASS %s" % name) if not bad else ("FAIL %s: %s" % (name, "; ".join(bad))), flush=True)
    return 0 if not bad else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launch", type=int, metavar="NP", help="start a job of NP ranks and judge it")
    ap.add_argument("--kill-rank", type=int, default=2)
    ap.add_argument("--kill-step", type=int, default=22)
    ap.add_argument("--no-kill", action="store_true")
    ap.add_argument("--join", type=int, default=0, metavar="K",
                    help="start K more processes that ask to join, --join-after s later")
    ap.add_argument("--join-after", type=float, default=1.0)
    ap.add_argument("--step-ms", type=float, default=0, help="sleep in every step")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--no-secret", action="store_true",
                    help="start without HORA_SECRET_FILE (hora warns that anyone may join)")
    a = ap.parse_args()
    if a.launch is None:
        return rank_main()
    if a.launch < 1 or (not a.no_kill and not 0 <= a.kill_rank < a.launch):
        ap.error("--kill-rank must be a rank of the job")
    return launch(a.launch, -1 if a.no_kill else a.kill_rank, a.kill_step, a.timeout,
                  not a.no_secret, a.join, a.join_after, a.step_ms)


if __name__ == "__main__":
    sys.exit(main())
