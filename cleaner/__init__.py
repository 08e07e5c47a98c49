"""The cleaner service (``compactlog-cleaner``): keeps many live logs compacted.

One process per machine schedules :func:`compactlog.compaction.compact_log` over every log
under its roots, while applications keep writing them. The modules, one job each:

``config``     the TOML file, environment and flags, validated (errors name key and file)
``discovery``  finding logs under roots; their shape from small files and file sizes only
``ranking``    which logs are due and in which order (a sorted queue)
``throttle``   one I/O budget shared by every worker
``passes``     one pass over one log: how it is opened, ``compact_log``, the outcome
``scheduler``  rounds, workers, backoff, the APScheduler jobs
``metrics``    Prometheus metrics, ``/healthz`` and ``/readyz``
``state``      the state file ``compactlog cleaner status`` reads
``process``    the service lock per root, signals
``main``       the entry point

See ``docs/operations.md``.
"""
