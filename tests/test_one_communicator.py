"""One communicator a process (World.communicator): every Trainer of a data-parallel process reduces
through the one its World made first, as every DDP model of a PyTorch process uses its process group,
and a Trainer built after another trains the run it trains in a process of its own. Two ranks under
mpiexec on the CPU."""
import os
import pathlib
import subprocess
import sys

import numpy as np

from tests.helpers.mpi_ranks import needs_mpi

ROOT = pathlib.Path(__file__).resolve().parents[1]

_RANKS = r"""
import sys
import numpy as np
import minidl as dl
from minidl import distributed, models, optim

world = distributed.init()
dev = dl.get_device("cpu")
rng = np.random.default_rng(0)
data = rng.integers(0, 256, (256, 28, 28), dtype=np.uint8), rng.integers(0, 10, 256)


def trained():
    t = dl.Trainer(models.get("lenet", device=dev, seed=0), optim.get("momentum", lr=0.01, momentum=0.9),
                   progress=False, log=lambda s: None, world=world)
    t.fit(data, more_steps=4, batch_size=16)
    return t


trainers = [trained() for _ in range(int(sys.argv[2]))]
colls = {id(t.reducer.coll) for t in trainers}
assert len(colls) == 1 and trainers[0].reducer.coll is world.communicator(dev), colls
if world.main:
    np.save(sys.argv[1], dev.to_host(trainers[-1].model.flat))
"""


@needs_mpi
def test_two_trainers_of_a_process_share_its_communicator_and_the_second_trains_as_if_alone(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1")
    runs = {}
    for n in (2, 1):
        p = subprocess.run(["mpiexec", "-n", "2", sys.executable, "-c", _RANKS, str(tmp_path / f"{n}.npy"), str(n)],
                           env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        runs[n] = np.load(tmp_path / f"{n}.npy")
    np.testing.assert_array_equal(runs[2], runs[1])


def test_a_world_makes_its_communicator_once_a_backend_and_again_once_it_is_closed():
    from types import SimpleNamespace

    from minidl.distributed import World
    made = []

    def communicator(comm):
        made.append(SimpleNamespace(comm=comm, closed=False))
        return made[-1]
    world = World(0, 2, comm="the MPI communicator")
    gpu, cpu = (SimpleNamespace(name=n, communicator=communicator) for n in ("cuda", "cpu"))
    first = world.communicator(gpu)
    assert world.communicator(gpu) is first and first.comm == "the MPI communicator" and len(made) == 1
    assert world.communicator(cpu) is not first and len(made) == 2
    first.closed = True                           # a benchmark destroyed it: the next Trainer gets another
    assert world.communicator(gpu) is made[2] and world.communicator(gpu) is made[2]


def test_the_shared_communicators_host_waits_hear_the_trainer_stepping():
    """MPI's requests are waited for on the host through the waits of the Reducer whose step runs, so
    a stop asked of that Trainer bounds a wait for ranks that never come, whichever Reducer was made last."""
    from types import SimpleNamespace

    import minidl as dl
    from minidl import distributed, models
    from minidl.graph import passes
    model = models.get("lenet", device=dl.get_device("cpu"), seed=0)
    net = model.lower(passes.training)
    coll = SimpleNamespace(waits=None, start=lambda *a, **k: None, wait=lambda: None)
    world = distributed.World(0, 2)
    first, second = (distributed.Reducer(world, model.device, communicator=coll, stop_asked=lambda: None)
                     for _ in range(2))
    assert coll.waits is second._waits
    first.watch(net)
    first.begin()
    assert coll.waits is first._waits
