"""Reset callbacks and a newcomer: an elastic job of 2 ranks (hora's own
rendezvous, HORA_BOOTSTRAP=tcp) whose state has a reset callback that runs
a collective and makes a process set with hvd.add_process_set; a third
process joins mid-run.

As in Horovod (horovod/common/elastic.py, run_fn), the reset callbacks run
only on a process that went through a reset, after it and before the sync;
a newcomer runs none: its start-up code does what they do, in the same
order, so that its collectives meet the survivors' (docs/pytorch.md).

    elastic_callbacks.py --launch [--timeout SECONDS]
        starts the job and judges it, one PASS or FAIL line per check:
        every process ends with the same results and the set made at the
        join usable on its members (the newcomer one of them); the
        callbacks ran on the survivors once and on the newcomer never.
        Exits 0 when both pass.
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
NP = 2
STEPS = 20         # at the least
STEPS_JOINED = 10  # with the newcomer in, at the least
MAX_STEPS = 1200   # 50 ms each: the newcomer has a minute to arrive


def rank_main():
    sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
    import torch
    import hora.torch as hvd
    from hora import _lib

    hvd.init()  # a newcomer returns once admitted at a commit point
    torch.set_num_threads(1)
    newcomer = bool(_lib.load().hora_elastic_joined())
    seen = {"resets": 0, "sizes": []}
    sets = {}

    def membership():
        # A world collective, then a set of the two highest ranks: at the
        # join, ranks 1 and 2 (the newcomer).
        n = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="callbacks.count").item()
        seen["sizes"].append(int(n))
        sets["tail"] = hvd.add_process_set([hvd.size() - 2, hvd.size() - 1])

    def on_reset():
        seen["resets"] += 1
        membership()

    membership()  # on every process at start-up, the newcomer's too

    @hvd.elastic.run
    def train(state):
        while state.step < MAX_STEPS and (state.step < STEPS or state.joined < STEPS_JOINED):
            time.sleep(0.05)
            state.step += 1
            state.total += hvd.allreduce(torch.tensor([float(hvd.rank() + state.step)]),
                                         op=hvd.Sum, name="callbacks.step").item()
            tail = sets["tail"]
            if tail.included():
                n = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="callbacks.tail",
                                  process_set=tail).item()
                assert n == 2, n
            if hvd.size() == NP + 1:
                state.joined += 1
            state.commit()

    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0, joined=0, total=0.0)
    state.register_reset_callbacks([on_reset])
    train(state)

    tail = sets["tail"]
    n = (hvd.allreduce(torch.ones(1), op=hvd.Sum, name="callbacks.final", process_set=tail).item()
         if tail.included() else None)
    mine = (state.step, state.joined, state.total, tail.ranks, tail.process_set_id)
    every = hvd.allgather_object(mine, name="callbacks.results")
    same = all(x == every[0] for x in every)
    print("rank %d (%s): size %d, step %d, steps with the newcomer %d, total %.1f, set %s "
          "(id %s), its allreduce %s, resets %d, callback collectives at sizes %s, "
          "same results on every rank: %s"
          % (hvd.rank(), "a newcomer" if newcomer else "a survivor", hvd.size(), state.step,
             state.joined, state.total, tail.ranks, tail.process_set_id, n, seen["resets"],
             seen["sizes"], "yes" if same else "NO"), flush=True)
    results_ok = (same and hvd.size() == NP + 1 and state.joined >= STEPS_JOINED and
                  tail.ranks == [NP - 1, NP] and n == (2 if tail.included() else None) and
                  (hvd.rank() in tail.ranks) == tail.included())
    callbacks_ok = (seen["resets"], seen["sizes"]) == ((0, [NP + 1]) if newcomer else
                                                       (1, [NP, NP + 1]))
    print("RESULT %s %s %s" % ("newcomer" if newcomer else "survivor",
                               "ok" if results_ok else "bad", "ok" if callbacks_ok else "bad"),
          flush=True)
    hvd.shutdown()
    return 0 if results_ok and callbacks_ok else 1


def launch(limit):
    sys.path.insert(0, HERE)
    from elastic_train import free_port

    work = tempfile.mkdtemp(prefix="hora-callbacks-")
    secret = os.path.join(work, "secret")
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32).hex().encode() + b"\n")
    os.close(fd)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_COMM", "PMI", "PMIX", "SLURM_", "HYDRA_", "MPI_LOCAL"))
           and k not in ("HORA_BOOTSTRAP", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                         "HORA_SECRET", "HORA_SECRET_FILE", "HORA_RANK", "HORA_SIZE")}
    env.update(HORA_BOOTSTRAP="tcp", HORA_RENDEZVOUS="127.0.0.1:%d" % free_port(),
               HORA_ELASTIC="1", HORA_SECRET_FILE=secret)
    procs = []

    def start(extra):
        out = open(os.path.join(work, "out.%d" % len(procs)), "w+")
        procs.append((subprocess.Popen([sys.executable, os.path.abspath(__file__)],
                                       env=dict(env, **extra), stdin=subprocess.DEVNULL,
                                       stdout=out, stderr=subprocess.STDOUT), out))

    for r in range(NP):
        start({"HORA_RANK": str(r), "HORA_SIZE": str(NP)})
    time.sleep(1.0)
    start({})  # no rank, no size: it asks to join
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and any(p.poll() is None for p, _ in procs):
        time.sleep(0.2)
    timed_out = [i for i, (p, _) in enumerate(procs) if p.poll() is None]
    for p, _ in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()
    results, callbacks = [], []
    for i, (p, out) in enumerate(procs):
        out.seek(0)
        text = out.read()
        out.close()
        for line in text.splitlines():
            print("[%d] %s" % (i, line))
        who = "the newcomer" if i == NP else "rank %d" % i
        verdict = [line.split() for line in text.splitlines() if line.startswith("RESULT ")]
        if i in timed_out:
            results.append("%s still running after %d s" % (who, limit))
        elif not verdict or p.returncode not in (0, 1):
            results.append("%s exited with %d before its verdict" % (who, p.returncode))
        else:
            _, role, res, cbs = verdict[-1]
            if role != ("newcomer" if i == NP else "survivor"):
                results.append("%s says it is a %s" % (who, role))
            if res != "ok":
                results.append("%s ended with other results or an unusable set" % who)
            if cbs != "ok":
                callbacks.append("%s ran the callbacks other than Horovod's run_fn would" % who)
        if i in timed_out or not verdict:
            callbacks.append("%s gave no verdict" % who)
    for f in os.listdir(work):
        os.unlink(os.path.join(work, f))
    os.rmdir(work)
    for name, bad in (("elastic/reset_callback_set_and_collective_np2+1_joining", results),
                      ("elastic/reset_callbacks_on_survivors_only_np2+1_joining", callbacks)):
        print(("PASS %s" % name) if not bad else ("FAIL %s: %s" % (name, "; ".join(bad))),
              flush=True)
    return 0 if not results and not callbacks else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launch", action="store_true", help="start the job and judge it")
    ap.add_argument("--timeout", type=int, default=120)
    a = ap.parse_args()
    return launch(a.timeout) if a.launch else rank_main()


if __name__ == "__main__":
    sys.exit(main())
