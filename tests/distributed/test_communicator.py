"""Device communicators over real gloo process groups, and their selection.

Two spawned processes join one group through ``forkless.distributed.parallel_state`` (as
workers do) and run every collective of the built-in gloo communicator; the parent checks
what each rank got.
"""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest
import torch

from forkless.distributed import available_device_communicators, resolve_device_communicator
from forkless.distributed.parallel_state import get_tp_group, pp_groups, tp_groups
from tests.server.conftest import free_port


def _rank_main(rank: int, init_method: str, out: str) -> None:
    from forkless.distributed import parallel_state as ps

    torch.set_num_threads(1)
    ps.init_parallel_state(world_size=2, rank=rank, tensor_parallel_size=2, pipeline_parallel_size=1,
                           init_method=init_method, device=torch.device("cpu"), dist_backend="gloo",
                           communicator="gloo")
    tp = ps.get_tp_group()
    comm = tp.communicator
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 * rank  # rank r: r*10 + [[0,1,2],[3,4,5]]
    got = {
        "type": type(comm).__name__,
        "rank_in_group": tp.rank_in_group,
        "all_reduce": tp.all_reduce(x.clone()).tolist(),
        "all_gather_last": tp.all_gather(x, dim=-1).tolist(),
        "all_gather_first": tp.all_gather(x, dim=0).tolist(),
        "gather": None if (g := tp.gather(x, dst=1, dim=-1)) is None else g.tolist(),
        "reduce_scatter": tp.reduce_scatter(torch.arange(4, dtype=torch.float32) + rank, dim=0).tolist(),
        "broadcast": tp.broadcast(x.clone(), src=1).tolist(),
    }
    if rank == 0:
        tp.send(torch.tensor([7.0, 8.0]))  # to the next rank
    else:
        got["recv"] = tp.recv((2,), torch.float32).tolist()
    ps.destroy_parallel_state()
    Path(out, f"rank{rank}.json").write_text(json.dumps(got))


def test_gloo_communicator_collectives_between_two_processes(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=_rank_main, args=(r, init, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0, p.exitcode
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["type"] == r1["type"] == "GlooCommunicator"
    assert (r0["rank_in_group"], r1["rank_in_group"]) == (0, 1)
    assert r0["all_reduce"] == r1["all_reduce"] == [[10, 12, 14], [16, 18, 20]]
    assert r0["all_gather_last"] == r1["all_gather_last"] == [[0, 1, 2, 10, 11, 12], [3, 4, 5, 13, 14, 15]]
    assert r0["all_gather_first"] == [[0, 1, 2], [3, 4, 5], [10, 11, 12], [13, 14, 15]]
    assert r0["gather"] is None and r1["gather"] == r0["all_gather_last"]  # only on dst
    # sum over ranks of [0,1,2,3] + r = [1,3,5,7]; rank 0 keeps the first half
    assert (r0["reduce_scatter"], r1["reduce_scatter"]) == ([1, 3], [5, 7])
    assert r0["broadcast"] == r1["broadcast"] == [[10, 11, 12], [13, 14, 15]]
    assert r1["recv"] == [7.0, 8.0]


def test_one_worker_has_no_group_and_no_collective() -> None:
    group = get_tp_group()
    assert group.world_size == 1 and group.communicator is None
    x = torch.ones(3)
    assert group.all_reduce(x) is x and group.all_gather(x) is x  # not even a copy
    with pytest.raises(RuntimeError, match="no peer"):
        group.send(x)


def test_rank_layout_is_vllms() -> None:
    # rank = pp_rank * tp_size + tp_rank
    assert tp_groups(2, 2) == [[0, 1], [2, 3]]
    assert pp_groups(2, 2) == [[0, 2], [1, 3]]
    assert tp_groups(4, 1) == [[0, 1, 2, 3]] and pp_groups(4, 1) == [[0], [1], [2], [3]]


def test_communicator_selection_by_name_path_and_backend() -> None:
    from forkless.distributed import DeviceCommunicatorBase
    from forkless.distributed.gloo import GlooCommunicator

    assert {"gloo", "nccl"} <= set(available_device_communicators())
    assert resolve_device_communicator("gloo") is GlooCommunicator
    assert resolve_device_communicator("forkless.distributed.gloo:GlooCommunicator") is GlooCommunicator
    assert resolve_device_communicator("", "gloo") is GlooCommunicator  # the platform named none
    assert issubclass(GlooCommunicator, DeviceCommunicatorBase)
    with pytest.raises(ValueError, match="registered: gloo, nccl"):
        resolve_device_communicator("infiniband")
    with pytest.raises(TypeError, match="DeviceCommunicatorBase"):
        resolve_device_communicator("collections:OrderedDict")
