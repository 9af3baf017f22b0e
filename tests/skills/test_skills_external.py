"""The external analyzer and judge against a real HTTP server on 127.0.0.1 (no network beyond loopback)."""

import json
import socket
import time

import pytest

from seedfast.skills import ChatClient, ChatError, ExternalAnalyzer, ExternalJudge, build_analyzer_messages
from tests.skills.skills_helpers import ChatServer, trajectory

SKILL = "Follow each direction of the objective in order, then take the named object."
GOOD = json.dumps({"episode_summary": "Went south and took it.", "episode_skill": SKILL})


def client(server, **options):
    defaults = dict(model="analyst-1", timeout_s=5.0, max_retries=2, backoff_s=0.01, max_concurrency=4)
    return ChatClient(base_url=server.base_url, **{**defaults, **options})


def test_success_sends_an_openai_request_with_the_key(monkeypatch):
    monkeypatch.setenv("SEEDFAST_TEST_KEY", "sk-test-123")
    traj = trajectory(["go south", "take passkey"], won=True)
    with ChatServer([("ok", "```json\n" + GOOD + "\n```")]) as server:
        [result] = ExternalAnalyzer(client(server, api_key_env="SEEDFAST_TEST_KEY", max_tokens=300)).analyze([traj])
    assert result.valid and result.skill == SKILL and result.summary == "Went south and took it."
    [request] = server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["Authorization"] == "Bearer sk-test-123"
    assert request["json"] == {"model": "analyst-1", "messages": build_analyzer_messages(traj),
                               "temperature": 0.0, "max_tokens": 300}


def test_malformed_json_answer_is_an_invalid_skill_not_an_error():
    with ChatServer([("ok", "The agent should have gone south {but it did not")]) as server:
        [result] = ExternalAnalyzer(client(server)).analyze([trajectory(["go north"], won=False)])
    assert (result.valid, result.reason) == (False, "no_json")
    assert result.raw == "The agent should have gone south {but it did not"
    assert len(server.requests) == 1


def test_http_500_then_success_is_retried():
    with ChatServer([("status", 500), ("ok", GOOD)]) as server:
        [result] = ExternalAnalyzer(client(server)).analyze([trajectory(["go south"], won=False)])
    assert result.valid and result.skill == SKILL
    assert len(server.requests) == 2


def test_persistent_5xx_gives_up_after_the_retries():
    with ChatServer([("status", 503)]) as server:
        [result] = ExternalAnalyzer(client(server, max_retries=2)).analyze([trajectory(["go south"], won=False)])
    assert (result.valid, result.reason) == (False, "request_failed")
    assert "http after 3 attempt(s): HTTP 503" in result.raw
    assert len(server.requests) == 3


def test_client_errors_are_not_retried():
    with ChatServer([("status", 400)]) as server:
        with pytest.raises(ChatError) as err:
            client(server).complete([{"role": "user", "content": "hi"}])
    assert err.value.kind == "http" and err.value.attempts == 1 and len(server.requests) == 1


def test_timeout_is_retried_then_reported():
    with ChatServer([("sleep", 1.0, GOOD)]) as server:
        start = time.monotonic()
        [result] = ExternalAnalyzer(client(server, timeout_s=0.2, max_retries=1)).analyze(
            [trajectory(["go south"], won=False)])
        elapsed = time.monotonic() - start
    assert (result.valid, result.reason) == (False, "request_failed")
    assert result.raw.startswith("timeout after 2 attempt(s)")
    assert len(server.requests) == 2 and elapsed < 1.9  # two 0.2 s waits, not two of the server's 1 s


def test_timeout_then_success():
    with ChatServer([("sleep", 1.0, GOOD), ("ok", GOOD)]) as server:
        [result] = ExternalAnalyzer(client(server, timeout_s=0.2)).analyze([trajectory(["go south"], won=False)])
    assert result.valid and len(server.requests) == 2


def test_not_a_chat_completion_is_a_bad_response():
    with ChatServer([("body", b"<html>gateway</html>")]) as server:
        with pytest.raises(ChatError) as err:
            client(server).complete([{"role": "user", "content": "hi"}])
    assert err.value.kind == "bad_response" and len(server.requests) == 1


def test_connection_refused_is_retried_then_reported():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there once the socket is closed
    chat = ChatClient(base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=1, backoff_s=0.01)
    with pytest.raises(ChatError) as err:
        chat.complete([{"role": "user", "content": "hi"}])
    assert err.value.kind == "connection" and err.value.attempts == 2


def test_concurrency_is_bounded_and_order_is_kept():
    def echo_task(request):
        task = request["messages"][1]["content"].split("\n")[0]
        return json.dumps({"episode_skill": f"Remember this well: {task.removeprefix('Task: ')}"})

    trajs = [trajectory(["go south"], won=False, task=f"Find the object number {i} in the house.")
             for i in range(6)]
    with ChatServer([("sleep", 0.15, echo_task)]) as server:
        results = ExternalAnalyzer(client(server, max_concurrency=2)).analyze(trajs)
    assert [r.skill for r in results] == [f"Remember this well: Find the object number {i} in the house."
                                          for i in range(6)]
    assert server.max_in_flight == 2


def test_external_judge_scores_or_gives_none():
    traj = trajectory(["go north"], won=False)
    reflection = "1. Went north.\n2. Should go south.\n3. Then take passkey."
    with ChatServer([("ok", '{"score": 2}'), ("ok", "Score: 3"), ("ok", "great work!"), ("status", 404)]) as server:
        judge = ExternalJudge(client(server, max_concurrency=1))
        assert judge.score([traj] * 4, [reflection] * 4) == [2, 3, None, None]
    assert "Reflection to grade:\n" + reflection in server.requests[0]["json"]["messages"][1]["content"]


def test_client_configuration_errors(monkeypatch):
    monkeypatch.delenv("SEEDFAST_MISSING_KEY", raising=False)
    with pytest.raises(ValueError, match="SEEDFAST_MISSING_KEY"):
        ChatClient(base_url="http://127.0.0.1:1/v1", model="m", api_key_env="SEEDFAST_MISSING_KEY")
    with pytest.raises(ValueError, match="base_url"):
        ChatClient(base_url="127.0.0.1:1", model="m")
    with pytest.raises(ValueError, match="timeout_s"):
        ChatClient(base_url="http://127.0.0.1:1/v1", model="m", timeout_s=0)
    with pytest.raises(ValueError, match="max_concurrency"):
        ChatClient(base_url="http://127.0.0.1:1/v1", model="m", max_concurrency=0)
    with pytest.raises(TypeError, match="ChatClient"):
        ExternalAnalyzer("http://127.0.0.1:1/v1")
