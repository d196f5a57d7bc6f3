"""``make bench``: longrun end to end, side by side with this machine's limits, DBOS and Temporal.

One run measures, in order: the limits (PostgreSQL step-shaped transactions, RabbitMQ
confirmed publish and consume+ack, a bare consume -> transaction -> publish -> ack loop),
the peers (DBOS Transact on the same PostgreSQL, the Temporal dev server on loopback),
the ensemble (real service processes on the ``steps`` workload: a lone run, saturation,
half load, 1/2/4 worker replicas), time (10,000 timers due at once; recovery after a
worker SIGKILL) and waiting (10,000 parked runs). It prints one table and writes one JSON
file with every figure and the target ratios, so two commits can be compared.

Everything runs against a dedicated database (``longrun_bench``) and RabbitMQ vhost
(``longrun_bench``), on loopback, bounded in time and count; every process the bench
starts is stopped by PID at the end, also on failure.
"""
