import os

# Two cores: one torch thread per process keeps parallel services from thrashing.
os.environ.setdefault("OMP_NUM_THREADS", "1")

pytest_plugins = [
    "tests.fixtures.redis_server",
    "tests.fixtures.seaweedfs",
    "tests.fixtures.buffer_service",
    "tests.fixtures.local_run",
    "tests.fixtures.tba_processes",
]
