"""The image and the compose stack, built and run for real, as an operator would.

``make image-test`` runs this module (marker ``image``, deselected from the default run):
``deploy/image-test`` starts a Docker engine when none answers, builds ``compactlog:latest``
(``make image``) and runs ``pytest -m image``. Each test leaves no container, network or
volume behind. Every wait is bounded and fails saying what did not come up, with the logs
that tell why.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from tests.test_deploy import IN_CI, REPO

pytestmark = pytest.mark.image

IMAGE = os.environ.get("COMPACTLOG_IMAGE", "compactlog:latest")
NAME = f"compactlog-image-test-{os.getpid()}"  # containers, volumes, the compose project
T = TypeVar("T")

# An application writing a log into the volume: JSON [key, value-or-null] pairs on stdin.
WRITER = """
import json, sys, compactlog
with compactlog.open(sys.argv[1], segment_bytes=4096) as log:
    for key, value in json.load(sys.stdin):
        log.append(key.encode(), None if value is None else value.encode())
    log.flush()
"""

# Reading a restored table back: its rows, and what `compactlog restore` says it wrote.
READER = """
import json, os, sys, pyarrow.parquet as pq
table = pq.read_table(sys.argv[1], columns=["key", "value"])
info_file = os.path.join(sys.argv[1], "_compactlog.json")
info = json.load(open(info_file)) if os.path.exists(info_file) else None
rows = [[r["key"].decode(), r["value"].decode()] for r in table.to_pylist()]
print(json.dumps({"rows": rows, "info": info}))
"""


def run(
    args: list[str],
    *,
    timeout: float,
    check: bool = True,
    why: Callable[[], str] = str,
    **kwargs,
) -> str:
    """Run a command with a bound: a hang or a failure is a test failure naming it, with
    what ``why()`` says (the services' logs)."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as error:
        output = (error.stdout or b"")[-3000:], (error.stderr or b"")[-3000:]
        pytest.fail(f"{' '.join(args)} did not finish within {timeout} s: {output}\n{why()}")
    if check and done.returncode != 0:
        message = f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        pytest.fail(f"{message}\n{why()}")
    return done.stdout


def docker(*args: str, timeout: float = 60, check: bool = True, **kwargs) -> str:
    return run(["docker", *args], timeout=timeout, check=check, **kwargs)


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, why: Callable[[], str]) -> T:
    """Poll ``probe`` until it returns a value; past ``timeout`` fail with ``why()``."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout} s\n{why()}")
        time.sleep(1)


def http_get(url: str) -> tuple[int, str] | None:
    """(status, body), or None while nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=3) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return None


def dirty_records(keys: int = 50, writes: int = 2000) -> list[tuple[str, str | None]]:
    """Many overwrites of few keys, some deletes: a log the cleaner has much to remove from."""
    rng = random.Random(27)
    records: list[tuple[str, str | None]] = []
    for i in range(writes):
        key = f"order-{rng.randrange(keys):03d}"
        records.append((key, None if rng.random() < 0.05 else f'{{"n": {i}}}'))
    return records


def model(records: list[tuple[str, str | None]]) -> dict[str, str]:
    """The table a log of these records restores to: the last value of every live key."""
    latest: dict[str, str | None] = {}
    for key, value in records:
        latest[key] = value
    return {key: value for key, value in latest.items() if value is not None}


def write_log(volume: str, name: str, records: list[tuple[str, str | None]]) -> None:
    """Write a log into the volume from a container, as the image's user (uid 10001)."""
    args = ["run", "--rm", "-i", "-v", f"{volume}:/data/logs", IMAGE, "python", "-c", WRITER]
    docker(*args, f"/data/logs/{name}", input=json.dumps(records), timeout=120)


@pytest.fixture(scope="module")
def engine() -> None:
    """A Docker engine that answers and the image built: a skip on a laptop, a failure in CI."""
    problem = None
    if shutil.which("docker") is None:
        problem = "docker is not installed"
    elif subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode != 0:
        problem = "no Docker engine answers"
    elif subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode:
        problem = f"{IMAGE} is not built"
    if problem is not None:
        message = f"{problem}: run `make image-test` (it starts dockerd and builds the image)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


# -- the cleaner container on its own -----------------------------------------------------


@pytest.fixture
def cleaner_volume(engine) -> Iterator[str]:
    volume = docker("volume", "create", f"{NAME}-logs").strip()
    yield volume
    docker("rm", "--force", f"{NAME}-cleaner", check=False)
    docker("volume", "rm", volume)


@pytest.mark.timeout(300)
def test_the_cleaner_container_cleans_a_dirty_log_answers_probes_and_stops_on_sigterm(
    cleaner_volume,
):
    write_log(cleaner_volume, "orders", dirty_records())
    container = f"{NAME}-cleaner"
    docker(
        *("run", "--detach", "--name", container, "-v", f"{cleaner_volume}:/data/logs"),
        *("--publish", "127.0.0.1::9464", IMAGE),
        *("compactlog-cleaner", "--root", "/data/logs", "--interval", "2"),
        *("--metrics-address", "0.0.0.0", "--metrics-port", "9464", "--grace", "3"),
        *("--log-format", "json"),
    )

    def logs() -> str:
        return docker("logs", "--tail", "40", container, check=False, stderr=subprocess.STDOUT)

    published = docker("port", container, "9464/tcp").split()[0]
    assert published.startswith("127.0.0.1:")  # published on the host's loopback only
    base = f"http://{published}"

    for path in ("/healthz", "/readyz"):
        answer = wait_for(f"the cleaner's {path}", lambda p=path: http_get(base + p), 60, logs)
        assert answer[0] == 200, (path, answer)

    def removed() -> float | None:
        answer = http_get(base + "/metrics")
        pattern = r'compactlog_cleaner_log_records_removed_total\{log="orders"[^}]*\} (\S+)'
        found = re.search(pattern, answer[1]) if answer else None
        return float(found.group(1)) if found and float(found.group(1)) > 0 else None

    assert wait_for("records removed from orders in /metrics", removed, 90, logs) > 0
    verified = docker("exec", container, "compactlog", "verify", "/data/logs/orders", "--json")
    assert json.loads(verified)["ok"], verified

    docker("kill", "--signal", "SIGTERM", container)
    started = time.monotonic()
    status = run(["docker", "wait", container], timeout=5)  # fails past 5 s
    assert int(status) == 0, f"exit status {status.strip()} after SIGTERM\n{logs()}"
    assert time.monotonic() - started < 5


# -- the compose stack: the documented restores, from the log and from the bucket --------


class Stack:
    """The repository's compose file up as its own project (``COMPOSE_PROJECT_NAME``), with
    what the tests and their failure messages need."""

    def __init__(self, command: list[str]) -> None:
        self.command = command
        self.environment = {**os.environ, "COMPOSE_PROJECT_NAME": NAME}
        self.environment.pop("RESTORE_LOG", None)

    def compose(self, *args: str, timeout: float = 120, check: bool = True, env=None, why=str):
        return run(
            [*self.command, *args],  # the repository's docker-compose.yml, found from cwd
            cwd=REPO,
            env={**self.environment, **(env or {})},
            timeout=timeout,
            check=check,
            why=why,
        )

    def container(self, service: str) -> str:
        ids = self.compose("ps", "--quiet", service).split()
        assert ids, f"no {service} container"
        return ids[0]

    def logs(self) -> str:
        return self.compose("logs", "--no-color", "--tail", "30", check=False)

    def executors(self) -> str:
        """The services' logs and the executors' last lines (where "Failed to connect to
        <driver>" shows when executors cannot reach the job's driver)."""
        worker = self.container("spark-worker")
        script = "tail -n 8 /home/compactlog/spark-work/app-*/*/stderr"
        errors = docker("exec", worker, "sh", "-c", script, check=False, stderr=subprocess.STDOUT)
        return f"{self.logs()}\nexecutors:\n{errors}"

    def healthy(self, service: str) -> bool | None:
        found = self.container(service)
        state = docker("inspect", "--format", "{{.State.Health.Status}}", found).strip()
        return True if state == "healthy" else None

    def down(self) -> None:
        """Everything down, the one-off jobs' containers too; fails if anything is left."""
        # a job killed by its bound leaves its `run` container: remove it before down
        label = f"label=com.docker.compose.project={NAME}"
        left = docker("ps", "--all", "--quiet", "--filter", label)
        if left.split():
            docker("rm", "--force", *left.split())
        profiles = ("--profile", "restore", "--profile", "restore-archive")
        self.compose(*profiles, "down", "--volumes", "--remove-orphans", "--timeout", "10")
        for kind in ("container", "network", "volume"):
            listing = ["ls", "--quiet", "--filter", label]
            if kind == "container":
                listing.insert(1, "--all")
            assert docker(kind, *listing).split() == [], f"{kind}s left behind"


def alive_workers() -> list | None:
    answer = http_get("http://127.0.0.1:8080/json/")  # the master's web UI, as JSON
    if answer is None or answer[0] != 200:
        return None
    return [w for w in json.loads(answer[1])["workers"] if w["state"] == "ALIVE"] or None


@pytest.fixture(
    scope="module", params=[["docker-compose"], ["docker", "compose"]], ids=["v1", "v2"]
)
def stack(engine, request) -> Iterator[Stack]:
    """The stack up and healthy (the object store and the cleaner healthy, one Spark worker
    registered with the master) for this module's tests, then down with its volumes."""
    command = request.param
    if command == ["docker", "compose"]:  # v2 where it is installed (Debian 12 has none)
        version = subprocess.run([*command, "version"], capture_output=True, timeout=30)
        if version.returncode != 0:
            pytest.skip("Compose v2 (docker compose) is not installed")
    elif shutil.which(command[0]) is None:
        message = f"{command[0]} is not installed (.ci/run installs it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    stack = Stack(command)
    try:
        stack.compose("up", "--detach", timeout=240, why=stack.logs)
        wait_for("the object store healthy", lambda: stack.healthy("objectstore"), 60, stack.logs)
        # the cleaner's first check comes 30 s after its start
        wait_for("the cleaner service healthy", lambda: stack.healthy("cleaner"), 120, stack.logs)
        workers = wait_for("a Spark worker registered", alive_workers, 120, stack.logs)
        assert len(workers) == 1
        yield stack
    finally:
        stack.down()


def read_table(path: str) -> dict:
    """The restored table's rows (and ``_compactlog.json``, where the job writes one), read
    in a container from the ``tables`` volume."""
    read = docker(
        *("run", "--rm", "-v", f"{NAME}_tables:/data/tables", IMAGE),
        *("python", "-c", READER, path),
        timeout=120,
    )
    return json.loads(read)


@pytest.mark.timeout(900)
def test_the_documented_restore_writes_the_model_of_the_log(stack):
    records = dirty_records()
    write_log(f"{NAME}_logs", "orders", records)
    # the documented command, word for word (docs/operations.md), bounded
    restore = ("--profile", "restore", "run", "--rm", "restore")
    stack.compose(*restore, env={"RESTORE_LOG": "orders"}, timeout=480, why=stack.executors)

    table = read_table("/data/tables/orders.parquet")
    assert dict(table["rows"]) == model(records)
    assert len(table["rows"]) == len(model(records))  # one row per live key
    assert table["info"]["rows"] == len(model(records))


@pytest.mark.timeout(600)
def test_the_cleaner_archives_to_the_bucket_and_spark_restores_from_it_with_no_log(stack):
    """Issue 26's compose item: the cleaner archives each log to the object store; the log
    then lost, the ``restore-archive`` job (no log volume) rebuilds the table from the
    bucket, its executors fetching the objects themselves."""
    records = dirty_records()
    write_log(f"{NAME}_logs", "payments", records)
    cleaner = stack.container("cleaner")
    url = "s3://compactlog/logs/payments"  # <archive.url>/<the log's name>

    def archived() -> dict | None:
        """The archive's newest manifest once it holds every record written."""
        listing = docker(
            "exec", cleaner, "compactlog", "archive", "list", url, "--json", check=False, timeout=60
        )
        try:
            manifests = json.loads(listing)["manifests"]
        except (ValueError, KeyError):
            return None
        newest = manifests[-1] if manifests else None
        return newest if newest and newest["end_offset"] == len(records) else None

    # the service finds a new log within its rescan (10 s), then archives every second
    wait_for(f"{url} holding all {len(records)} records", archived, 120, stack.logs)
    verified = docker("exec", cleaner, "compactlog", "archive", "verify", url, "--json")
    assert json.loads(verified)["ok"], verified

    # the disk lost: nothing of the log is left on any volume
    docker("run", "--rm", "-v", f"{NAME}_logs:/data/logs", IMAGE, "rm", "-r", "/data/logs/payments")
    # the documented command, word for word (docs/operations.md), bounded
    restore = ("--profile", "restore-archive", "run", "--rm", "restore-archive")
    stack.compose(*restore, env={"RESTORE_LOG": "payments"}, timeout=480, why=stack.executors)

    table = read_table("/data/tables/payments.parquet")
    assert dict(table["rows"]) == model(records)
    assert len(table["rows"]) == len(model(records))  # one row per live key
    assert table["info"]["rows"] == len(model(records))
    assert table["info"]["source"] == url  # compactlog restore's record names the archive
