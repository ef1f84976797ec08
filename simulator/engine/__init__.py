"""The discrete-event serving engine: workloads, paged KV cache, schedulers, the simpy loop, metrics."""
