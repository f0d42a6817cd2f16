"""Shared fixtures: real `tarry serve` processes, and the service checks behind the markers.

Tests marked ``rabbitmq``, ``postgres``, ``spark`` or ``browser`` need that service. When it is missing they
skip with a loud reason, unless ``TARRY_REQUIRE_SERVICES=1`` (CI), where they fail instead.

``scripts/test`` runs the suite on two pytest-xdist workers (``--dist loadgroup``). Every test
has its own port, data directory, database and virtual host, but some change the shared
service itself (PostgreSQL restarted, RabbitMQ's memory alarm raised) or share one per session
(the SparkSession, the local Spark cluster): those run in one group per kind, one test at a
time on one worker (``_GROUPS``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# Property tests: the same examples on every run and no time limits, so a busy CI machine can
# neither fail them by slowness nor by a new random draw; `HYPOTHESIS_PROFILE=explore` draws
# fresh examples (and more of them) when hunting for new counterexamples.
_RELAXED = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("ci", derandomize=True, **_RELAXED)
settings.register_profile("explore", max_examples=1000, **_RELAXED)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

REQUIRE_SERVICES = os.environ.get("TARRY_REQUIRE_SERVICES") == "1"

_SERVICES: dict[str, tuple[Callable[[], bool], str]] = {}
_checked: dict[str, bool] = {}


def _port_open(port: int) -> Callable[[], bool]:
    def check() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False

    return check


def _spark_available() -> bool:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return False
    return subprocess.run(["java", "-version"], capture_output=True).returncode == 0


_SERVICES["rabbitmq"] = (
    _port_open(5672),
    "RabbitMQ on 127.0.0.1:5672 (start: rabbitmq-server -detached)",
)
_SERVICES["postgres"] = (
    _port_open(5432),
    "PostgreSQL on 127.0.0.1:5432 (start: pg_ctlcluster --skip-systemctl-redirect "
    "$(ls /etc/postgresql) main start)",
)
_SERVICES["spark"] = (_spark_available, "pyspark and Java 17 (pip install -e '.[spark]')")

#: The headless browser the console tests drive (Debian's packages; scripts/test installs them).
CHROMIUM = os.environ.get("TARRY_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("TARRY_CHROMEDRIVER", "/usr/bin/chromedriver")


def _browser_available() -> bool:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return False
    return os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)


_SERVICES["browser"] = (
    _browser_available,
    f"headless Chromium ({CHROMIUM}, {CHROMEDRIVER}: apt-get install chromium chromium-driver) "
    "and selenium (pip install -e '.[dev]')",
)


#: xdist groups (``--dist loadgroup``): a test with the marker or the fixture runs in the group.
#: PostgreSQL and RabbitMQ share one group: a test that restarts PostgreSQL, or raises RabbitMQ's
#: memory alarm, must not overlap another test of the same service.
_GROUPS = {
    "services": ({"postgres", "rabbitmq"}, {"pg_dsn", "broker"}),
    "spark": ({"spark"}, {"spark", "spark_cluster", "reference"}),
}
#: Where the workers leave each test's group for the controller's scheduler (``workerinput``).
_GROUPS_DIR = "tarry_groups_dir"


def _group(item: pytest.Item) -> str | None:
    fixtures = set(getattr(item, "fixturenames", ()))
    for group, (markers, needs) in _GROUPS.items():
        if fixtures & needs or any(item.get_closest_marker(m) for m in markers):
            return group
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # pytest-xdist's loadgroup names a test's group (its xdist_group marker) by a suffix of its
    # node id, which pytest 9's structured node ids no longer carry: the workers hand the groups
    # over in a file, which the scheduler below reads.
    workerinput = getattr(config, "workerinput", None)
    if workerinput and _GROUPS_DIR in workerinput:
        groups = {item.nodeid: group for item in items if (group := _group(item))}
        path = Path(workerinput[_GROUPS_DIR]) / f"{workerinput['workerid']}.json"
        path.with_suffix(".part").write_text(json.dumps(groups))
        path.with_suffix(".part").replace(path)


_GROUPS_DIR_KEY = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "dist", "no") == "loadgroup":
        config.stash[_GROUPS_DIR_KEY] = tempfile.mkdtemp(prefix="tarry-xdist-groups-")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _GROUPS_DIR_KEY in config.stash:
        shutil.rmtree(config.stash[_GROUPS_DIR_KEY], ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    node.workerinput[_GROUPS_DIR] = node.config.stash[_GROUPS_DIR_KEY]


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    directory = Path(config.stash[_GROUPS_DIR_KEY])

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """xdist's load-scope scheduling with ``_GROUPS`` as the scopes, every other test a
        scope of its own (what loadgroup does where node ids carry the group)."""

        group_of: dict[str, str] | None = None

        def schedule(self) -> None:
            # Called once every worker has collected, so each has written its file.
            if self.group_of is None:
                self.group_of = {}
                for path in directory.glob("*.json"):
                    self.group_of.update(json.loads(path.read_text()))
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            return (self.group_of or {}).get(nodeid, nodeid)

    return GroupScheduling(config, log)


_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


def pytest_runtest_setup(item: pytest.Item) -> None:
    for name, (check, how) in _SERVICES.items():
        if item.get_closest_marker(name) is None:
            continue
        if name not in _checked:
            _checked[name] = check()
        if _checked[name]:
            continue
        message = f"{name} is not available: needs {how}"
        if REQUIRE_SERVICES:
            pytest.fail(f"TARRY_REQUIRE_SERVICES=1 and {message}", pytrace=False)
        pytest.skip(f"SKIPPED LOUDLY: {message}")


_UNAVAILABLE = re.compile(r"SKIPPED LOUDLY: (\w+) is not available")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    # Counted from the reports, not in pytest_runtest_setup: under xdist the skips happen in
    # the workers and only their reports reach this process.
    skipped: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        found = _UNAVAILABLE.search(str(report.longrepr))
        if found:
            skipped[found[1]] = skipped.get(found[1], 0) + 1
    for name, count in skipped.items():
        terminalreporter.write_line(
            f"!!! {count} test(s) skipped because {name} is not available "
            "(set TARRY_REQUIRE_SERVICES=1 to make this a failure)",
            red=True,
        )


class ServerProcess:
    """A real `tarry serve` subprocess on a free loopback port."""

    def __init__(
        self,
        data_dir: Path,
        *,
        config: Path | None,
        env: dict[str, str] | None,
        args: list[str],
    ) -> None:
        self.data_dir = data_dir
        self.config = config
        self.env = env
        self.args = args
        self.url = ""
        self.process: subprocess.Popen[str] | None = None
        self.stderr_lines: list[str] = []
        self.start()

    def start(self) -> None:
        command = [
            sys.executable,
            "-m",
            "tarry.cli.main",
            "serve",
            "--port",
            "0",
            "--data",
            str(self.data_dir),
            *self.args,
        ]
        if self.config is not None:
            command += ["--config", str(self.config)]
        env = {**os.environ, **(self.env or {})}
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.stderr_lines = []
        threading.Thread(target=self._drain_stderr, args=(self.process,), daemon=True).start()
        assert self.process.stdout is not None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if line.startswith("tarry serving on "):
                self.url = line.split()[-1].strip()
                return
            if not line and self.process.poll() is not None:
                break
        self.process.kill()
        self.process.wait(10)
        self._close_stdout()
        raise RuntimeError("tarry serve did not start:\n" + "".join(self.stderr_lines[-30:]))

    def _drain_stderr(self, process: subprocess.Popen[str]) -> None:
        assert process.stderr is not None
        for line in process.stderr:
            self.stderr_lines.append(line)
        process.stderr.close()

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self._close_stdout()

    def _close_stdout(self) -> None:
        if self.process and self.process.stdout and not self.process.stdout.closed:
            self.process.stdout.close()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_stdout()

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def make_server(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., ServerProcess]]:
    servers: list[ServerProcess] = []

    def factory(
        config_toml: str | None = None,
        data_dir: Path | None = None,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
    ) -> ServerProcess:
        config = None
        if config_toml is not None:
            config = tmp_path / f"tarry-{len(servers)}.toml"
            config.write_text(config_toml)
        server = ServerProcess(
            data_dir or tmp_path / f"data-{len(servers)}",
            config=config,
            env=env,
            args=args or [],
        )
        servers.append(server)
        return server

    yield factory
    failed = any(r.failed for r in request.node.stash.get(_REPORTS, {}).values())
    for number, server in enumerate(servers):
        if failed:  # what the servers logged is the first thing to read when a run fails
            tail = "".join(server.stderr_lines[-40:])
            print(f"\n--- tarry serve #{number} stderr (last 40 lines) ---\n{tail}")
        server.stop()


@pytest.fixture
def server(make_server: Callable[..., ServerProcess]) -> ServerProcess:
    return make_server()


PG_SERVER = os.environ.get("TARRY_TEST_PG", "postgresql://postgres@127.0.0.1:5432")


def _pg_admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql.encode())


@pytest.fixture
def pg_dsn(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database of its own on the real PostgreSQL (dropped afterwards); the test must
    carry the ``postgres`` marker."""
    assert request.node.get_closest_marker("postgres"), "mark the test with @pytest.mark.postgres"
    import uuid

    name = f"tarry_test_{uuid.uuid4().hex[:12]}"
    _pg_admin(f"CREATE DATABASE {name}")
    try:
        yield f"{PG_SERVER}/{name}"
    finally:
        _pg_admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"
