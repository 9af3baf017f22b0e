"""Shared pieces of the skills tests: hand-made trajectories, a real chat tokenizer, a loopback chat server."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from seedfast.envs import Trajectory, TrajectoryStep

TASK = "Your objective is to head south, then pick up the passkey from the floor of the chamber."
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def trajectory(actions, won, valid=None, walkthrough=("go south", "take passkey"), task=TASK, error=None):
    valid = valid or [True] * len(actions)
    steps = [TrajectoryStep(observation=f"-= Room {i} =-\nYou see exits.", admissible_actions=["go south", "look"],
                            action=a, valid=v) for i, (a, v) in enumerate(zip(actions, valid))]
    return Trajectory(task=task, game_id="treasure_hunter-L3-0", steps=steps, won=won,
                      walkthrough=list(walkthrough) if walkthrough else None, error=error)


def make_chat_tokenizer():
    """A byte-level BPE tokenizer (trained here in ~0.1 s) with a ChatML template, as transformers loads it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [TASK, "Step Observation Action Outcome SUCCEEDED FAILED skill workflow avoid episode_summary",
              '{"episode_summary": "x", "episode_skill": "y"} go south take passkey look']
    tok.train_from_iterator(corpus * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", chat_template=CHATML)


class ChatServer:
    """An OpenAI-style /v1/chat/completions server on 127.0.0.1 that answers from a script.

    `script` is a list of replies used in order (the last one repeats): ("ok", content),
    ("status", code), ("sleep", seconds, content) or ("body", raw bytes). `content` may be a function of
    the request's JSON. Every request is recorded, with the peak number in flight.
    """

    def __init__(self, script):
        self.script, self.requests = list(script), []
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server._lock:
                    server.requests.append({"path": self.path, "headers": dict(self.headers), "json": body})
                    reply = server.script[min(len(server.requests), len(server.script)) - 1]
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                server.answer(self, reply, body, server._finished)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def _finished(self):
        with self._lock:
            self.in_flight -= 1

    @staticmethod
    def answer(handler, reply, body, finished):
        """Write the scripted reply. A request stops counting as in flight just before its reply is written:
        the client may send its next request as soon as it has read this one, before the handler returns."""
        kind = reply[0]
        if kind == "status":
            finished()
            handler.send_error(reply[1])
            return
        if kind == "sleep":
            time.sleep(reply[1])
            reply = ("ok", reply[2])
        if kind == "body":
            payload = reply[1]
        else:
            content = reply[1](body) if callable(reply[1]) else reply[1]
            payload = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})
            payload = payload.encode()
        finished()
        try:
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout test)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
