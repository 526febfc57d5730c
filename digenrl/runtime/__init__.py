"""runtime: the only package that imports Ray. Actors, pools, placement, weight sync, traces.

    driver.py       RayDriver(cfg).train(resume=) -- the Flow-GRPO run on Ray pools, any mode
    actors.py       Actors: the run's gangs (start, replace, add, retire), the relay, evaluation
    backend.py      RealBackend: each unit kind's actor call and what its result feeds; step records
    loop.py         EventLoop: Scheduler <-> Ray completions (shared by real and emulated compute)
    workers.py      one actor class per role: RolloutRank, TrainerRank (trainer, colocated),
                    RewardWorker; EvalWorker. The relay's two ends are parts of the ranks
    gang.py         Gang: a scheduler worker's rank actors (a unit runs on every rank); row shares
    gang_rank.py    GangRank: a sharded trainer rank (FSDP2 over its gang, cross-gang all-reduce)
    shards.py       sample shards: concatenate Generate shards, select a Train shard's rows
    weight_sync.py  object-store and lora-only engines (bytes, seconds)
    relay.py        nccl/gloo engine: trainer-0's relay sends each version once down a chain of the rollout workers
    cluster.py      connect to / start Ray; PoolConfig -> actor options, placement groups
    results.py      the typed record each unit returns to the driver (start, end, ...)
    emulated.py     EmulatedWorker (sleeps the cost model's time), its backend and loop
    elastic.py      Elastic: the run's side of `digenrl scale` (join / drain rollout workers mid-run)
    scale.py        scale requests and the driver's pools.json in the run directory (no Ray: the CLI's side)
    preempt.py      spot rollout workers: notice sources (trace, files, SIGTERM), drain, deadline kill
    cloud_notices.py  the clouds' reclaim notices: a watcher per node polls AWS / GCE / Azure metadata
                    and writes the notices of the workers registered on its node
    serving/        the reward server on Ray Serve (`digenrl reward-server`): deployment, options, start/stop

`digenrl bench` (digenrl/tools/bench.py) sits above this package and digenrl.sim: the runtime
never imports the simulator's reports; both take their schedule from digenrl.config.contract.

Submodules are imported explicitly (`from digenrl.runtime.driver import RayDriver`), so
`import digenrl.runtime` stays cheap. See docs/design/step.md.
"""
