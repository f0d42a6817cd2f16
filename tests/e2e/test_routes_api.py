"""Routes as resources: put, replaced, shown and deleted at run time on a real ``tarry serve``
(log store), delivering to a real receiver on a loopback port, without a restart."""

from __future__ import annotations

import base64
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from tarry import Client
from tarry.errors import InUse, InvalidArgument, NotAuthorized, PreconditionFailed
from tests.conftest import ServerProcess
from tests.e2e.receiver import new_secret, wait_until


@pytest.fixture(scope="module")
def one_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the tests that only read answers (each refused put changes nothing)."""
    server = ServerProcess(tmp_path_factory.mktemp("routes"), config=None, env=None, args=[])
    yield server
    server.stop()


def test_a_route_put_at_run_time_delivers_at_once_and_after_a_restart(
    make_server, receiver
) -> None:
    # Given a server with no routes in its configuration
    server = make_server()
    with Client(server.url) as client:
        # When a route is put and a message sent to it
        created = httpx.put(
            f"{server.url}/v1/routes/hooks.a", json={"transport": "http", "url": receiver.url}
        )
        assert created.status_code == 201 and created.json()["source"] == "api"
        sent = client.send("hooks.a", "first")
        # Then it is delivered without a restart
        wait_until(lambda: [a.body for a in receiver.accepted] == [b"first"])
        assert receiver.accepted[0].headers["tarry-id"] == sent.id
    # And after a restart the route is still there and in force
    server.restart()
    with Client(server.url) as client:
        assert client.get_route("hooks.a")["url"] == receiver.url
        client.send("hooks.a", "second")
        wait_until(lambda: [a.body for a in receiver.accepted] == [b"first", b"second"])


def test_a_route_replaced_at_run_time_sends_to_its_new_url(make_server, receiver, other) -> None:
    server = make_server()
    with Client(server.url) as client:
        client.put_route("hooks.a", transport="http", url=receiver.url)
        # Putting the same route again changes nothing (200, not 201)
        again = httpx.put(
            f"{server.url}/v1/routes/hooks.a", json={"transport": "http", "url": receiver.url}
        )
        assert again.status_code == 200
        # When it is replaced by one to another receiver
        replaced = client.put_route("hooks.a", transport="http", url=other.url, timeout="2s")
        assert replaced["timeout_ms"] == 2000
        client.send("hooks.a", "x")
        # Then the new receiver gets the message and the old one nothing
        wait_until(lambda: other.accepted)
        assert receiver.attempts == []


def test_deleting_a_route_messages_wait_for_is_refused_with_in_use_unless_forced(
    make_server, receiver
) -> None:
    server = make_server()
    with Client(server.url) as client:
        client.put_route("hooks.a", transport="http", url=receiver.url)
        waiting = client.send("hooks.a", "later", delay="1h")
        # When the route is deleted while a message waits for it
        with pytest.raises(InUse) as refused:
            client.delete_route("hooks.a")
        # Then it is refused, saying how to go on, and the route still works
        assert "force=true" in refused.value.message and "1 message" in refused.value.message
        assert client.get_route("hooks.a")["name"] == "hooks.a"
        # When it is deleted with force
        answer = client.delete_route("hooks.a", force=True)
        # Then the waiting message is dead-lettered with the reason, and the route is gone
        assert answer == {"name": "hooks.a", "deleted": True, "dead_lettered": 1}
        assert client.get(waiting.id).state == "dead_lettered"
        [dead] = client.receive("tarry.error", wait="5s")
        assert dead.headers["tarry-original-id"] == waiting.id
        assert dead.headers["tarry-failure"].startswith("route_deleted: ")
        refused_send = httpx.post(
            f"{server.url}/v1/messages", json={"destination": "hooks.a", "body": "x"}
        )
        assert refused_send.json()["error"]["code"] == "unknown_destination"
        assert httpx.get(f"{server.url}/v1/routes/hooks.a").status_code == 404
    assert receiver.attempts == []


def test_a_route_nothing_waits_for_is_deleted_at_once(make_server, receiver) -> None:
    server = make_server()
    with Client(server.url) as client:
        client.put_route("hooks.a", transport="http", url=receiver.url)
        client.send("hooks.a", "now")
        wait_until(lambda: receiver.accepted)
        wait_until(lambda: client.get_route("hooks.a") and _waiting(server.url) == 0)
        assert client.delete_route("hooks.a") == {
            "name": "hooks.a",
            "deleted": True,
            "dead_lettered": 0,
        }
        assert client.list_routes() == []


def _waiting(url: str) -> int:
    stats = httpx.get(f"{url}/v1/stats").json()
    return int(stats["messages"]["scheduled"])


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"transport": "http", "url": "ftp://example.com/x"}, "http:// or https://"),
        ({"transport": "http", "url": "http:///path"}, "no host"),
        ({"transport": "http", "url": "amqp://guest@127.0.0.1/"}, "http:// or https://"),
        ({"transport": "rabbitmq", "url": "http://127.0.0.1/"}, "amqp:// or amqps://"),
        ({"transport": "http", "url": "http://127.0.0.1:99999/"}, "not a valid URL"),
        ({"transport": "http", "url": "http://h/", "secrets": ["s3cret"]}, "whsec_"),
        ({"transport": "http", "url": "http://h/", "secrets": ["whsec_c2hvcnQ="]}, "24 to 64"),
        ({"transport": "http", "url": "http://h/", "secrets": ["whsec_!!"]}, "base64"),
        ({"transport": "http", "url": "http://h/", "timeout_ms": 0}, "timeout_ms"),
        ({"transport": "http", "url": "http://h/", "colour": "red"}, "colour"),
        ({"url": "http://h/"}, "transport"),
    ],
)
def test_a_bad_route_is_refused_with_400_saying_what_to_fix(one_server, body, says) -> None:
    response = httpx.put(f"{one_server.url}/v1/routes/hooks.bad", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_argument" and says in error["message"], error
    assert httpx.get(f"{one_server.url}/v1/routes/hooks.bad").status_code == 404


def test_a_rabbitmq_route_takes_no_secrets(one_server) -> None:
    body = {"transport": "rabbitmq", "url": "amqp://127.0.0.1/", "secrets": [new_secret()]}
    with (
        Client(one_server.url) as client,
        pytest.raises(InvalidArgument, match="only an http route"),
    ):
        client.put_route("rmq", **body)


def test_secrets_are_never_returned_nor_logged(make_server, receiver) -> None:
    # Given a route with two secrets and a credential in its URL
    secret, older = new_secret(), new_secret()
    server = make_server()
    url = receiver.url.replace("http://", "http://user:pa55word@")
    receiver.statuses = [404]  # the delivery fails: its failure names the URL
    with Client(server.url) as client:
        put = client.put_route("hooks.a", transport="http", url=url, secrets=[secret, older])
        shown = [put, client.get_route("hooks.a"), *client.list_routes()]
        client.send("hooks.a", "x")
        [dead] = client.receive("tarry.error", wait="10s")
        shown.append(dead.headers)
        assert "answered HTTP 404" in dead.headers["tarry-failure"]
    cli = subprocess.run(
        [sys.executable, "-m", "tarry.cli.main", "--url", server.url, "route", "show", "hooks.a"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    server.stop()
    # Then no answer, no CLI output and no log line holds a secret or the password
    everything = repr(shown) + cli.stdout + "".join(server.stderr_lines)
    for hidden in (secret, older, secret[6:20], "pa55word"):
        assert hidden not in everything
    # But each secret shows as a fingerprint, so a rotation can be followed
    assert len(shown[1]["secrets"]) == 2
    assert all(s.startswith("whsec_…redacted (sha256 ") for s in shown[1]["secrets"])
    assert "route hooks.a put" in everything  # the put itself was logged


def test_a_route_of_tarry_toml_wins_a_name_clash(make_server, receiver) -> None:
    # Given a route declared in tarry.toml, with a secret
    secret = new_secret()
    server = make_server(
        f'[routes.hook]\ntransport = "http"\nurl = "{receiver.url}"\nsecrets = ["{secret}"]\n'
    )
    with Client(server.url) as client:
        shown = client.get_route("hook")
        assert shown["source"] == "config" and secret not in repr(shown)
        assert secret not in "".join(server.stderr_lines)  # nor in the start-up log
        # Then the API can neither replace nor delete it
        with pytest.raises(PreconditionFailed, match="tarry.toml"):
            client.put_route("hook", transport="http", url="http://elsewhere.example/")
        with pytest.raises(PreconditionFailed, match="tarry.toml"):
            client.delete_route("hook")
        # And a queue's name is not a route's either
        client.declare_queue("jobs")
        with pytest.raises(PreconditionFailed, match="already a queue"):
            client.put_route("jobs", transport="http", url=receiver.url)


def test_a_stored_route_the_file_declares_later_gives_way_to_the_file(
    make_server, receiver, other, tmp_path
) -> None:
    # Given a route put at run time
    data = tmp_path / "shared-data"
    server = make_server(data_dir=data)
    with Client(server.url) as client:
        client.put_route("hook", transport="http", url=other.url)
    server.stop()
    # When the server restarts with tarry.toml declaring the same name
    server = make_server(f'[routes.hook]\ntransport = "http"\nurl = "{receiver.url}"\n', data)
    with Client(server.url) as client:
        # Then the file's route is in force, and the log says why the stored one is not
        assert client.get_route("hook")["source"] == "config"
        client.send("hook", "x")
        wait_until(lambda: receiver.accepted)
    assert other.attempts == []
    assert any("declared in tarry.toml" in line for line in server.stderr_lines)


def test_route_names_are_names_in_the_token_scopes(make_server, receiver) -> None:
    # Given a token that administers a.* and may send to a.* only
    server = make_server(
        '[[auth.tokens]]\ntoken = "alice-secret"\nname = "alice"\n'
        'send = ["a.*"]\nadmin = ["a.*"]\n'
        '[[auth.tokens]]\ntoken = "bob-secret"\nname = "bob"\nsend = ["b.*"]\nadmin = ["b.*"]\n'
        # the receiver is on loopback, which a token server refuses to routes unless allowed
        '[egress]\nallow = ["127.0.0.1"]\n'
    )
    with Client(server.url, "alice-secret") as alice, Client(server.url, "bob-secret") as bob:
        alice.put_route("a.hook", transport="http", url=receiver.url)
        # Then a name outside its scopes is refused, for each verb
        with pytest.raises(NotAuthorized):
            alice.put_route("b.hook", transport="http", url=receiver.url)
        with pytest.raises(NotAuthorized, match="report route failures to"):
            alice.put_route(
                "a.hook2", transport="http", url=receiver.url, on_failure_report_to="b.failures"
            )
        with pytest.raises(NotAuthorized):
            bob.get_route("a.hook")
        with pytest.raises(NotAuthorized):
            bob.delete_route("a.hook")
        assert [r["name"] for r in bob.list_routes()] == []
        assert [r["name"] for r in alice.list_routes()] == ["a.hook"]


def test_the_cli_puts_shows_lists_and_deletes_a_route(server, receiver, tmp_path) -> None:
    def tarry(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tarry.cli.main", "--url", server.url, *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    secret = tarry("route", "secret").stdout.strip()
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) == 32
    secrets_file = tmp_path / "secrets"
    secrets_file.write_text(secret + "\n")
    put = tarry(
        "route", "put", "hooks.cli", receiver.url, "--transport", "http",
        "--secrets-from", str(secrets_file), "--timeout", "3s", "-H", "x-team=core",
        "--rate-per-s", "5", "--retries", "2", "--set", "concurrency=4",
        "--dead-letter-to", "hooks.failed",
    )  # fmt: skip
    assert put.returncode == 0, put.stderr
    shown = tarry("route", "show", "hooks.cli", "--json")
    assert '"timeout_ms": 3000' in shown.stdout and '"concurrency": 4' in shown.stdout
    assert '"rate_per_s": 5.0' in shown.stdout and '"retries": 2' in shown.stdout
    assert '"dead_letter_to": "hooks.failed"' in shown.stdout
    assert secret not in shown.stdout + put.stdout
    assert "hooks.cli" in tarry("route", "ls").stdout
    bad = tarry("route", "put", "hooks.bad", "ftp://x/")
    assert bad.returncode == 1 and bad.stderr.startswith("invalid_argument: ")
    tarry("send", "hooks.cli", "x", "--delay", "1h")
    in_use = tarry("route", "delete", "hooks.cli")
    assert in_use.returncode == 1 and in_use.stderr.startswith("in_use: ")
    forced = tarry("route", "delete", "hooks.cli", "--force")
    assert forced.returncode == 0 and "1 waiting message(s) dead-lettered" in forced.stdout
