"""Tests run in the grader's process; the student's kernel only answers questions.

A test cell's source (visible and hidden lines, with their messages and expected values) is
compiled and run here, in the grader's own process, where no student code runs. The
student's functions, the chapter's helpers and every module the test uses are *proxies*:
using one sends an operation to the kernel's agent (coursetools/grading/agent_kernel.py) over
the kernel protocol's stdin channel, and what comes back is plain data (numbers, strings,
devices, dtypes, shapes, tuples of them) or a numbered reference to an object that stays in
the kernel. So the test reads as it does in the notebook:

    with fake_hardware(cuda=1):          # the helper's context manager, entered in the kernel
        got = pick_device()              # the student's function, called in the kernel
    assert got == torch.device("cuda", 0), f"... {got}"   # decided here

What the kernel learns of a test is what the student's code is given: the scenario it runs
under and its arguments. Assertions, their messages and the values a test expects stay
here, so nothing in the kernel can print them, and nothing in the kernel decides a verdict:
a test passes when its code, run here, finishes without an exception and the student's
code wrote nothing to stderr while it ran (the notebook's own rule).

Where the answer must call the grader's code (a factory for `build_on`, a hook, a class a
test defines and the student's code instantiates), the kernel gets a stub: calling it asks
the grader to run that code, with proxies for its arguments. An exception raised by the
grader's code reaches the kernel as its type alone, without its message; an assertion that
fails inside such code fails the test even if the student's code catches it.

A test's `torch`, `np`, `nn` and `F` are the kernel's real modules, imported by name;
their devices, dtypes and `torch.Size` are this process's own (LOCAL_ATTRS), so an expected
value is built here. Comparisons of tensor and array values (`torch.equal`, `torch.allclose`,
`torch.testing.assert_close`, `np.array_equal`, `np.allclose`, `np.testing.assert_*`:
INTERCEPTS) run here, on copies the agent reads with accessors it captured before any student
code ran; a subclass of a tensor or array type that the course never makes is refused there.
Everything else the kernel answers is an observation the grader treats as untrusted data.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import io
import json
import math
import os
import re
import sys
import time
import traceback
import types
from itertools import accumulate
from collections import abc as collections_abc
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty
from typing import Any, Callable

from coursetools.grading import hardware, hints

# The agent's module is registered under a name drawn for each notebook graded, so a submission
# cannot look it up by a name it knows (`pydoc.locate("__course_agent__")`); the prefix lets the
# static review recognise code that goes looking for it (review._AGENT_NAMES).
AGENT_PREFIX = "__course_agent_"


def agent_name() -> str:
    import secrets
    return f"{AGENT_PREFIX}{secrets.token_hex(12)}__"


def serve_code(name: str) -> str:
    return f"__import__('sys').modules[{name!r}].serve()"

TEST_FILE = "<grader test {}>"
HELPERS_FILE = "<grader helpers>"

# Modules a test may import and use here as they are: they compute, and touch neither the
# student's objects nor the kernel's files. Every other import is the kernel's module.
LOCAL_MODULES = frozenset({"math", "itertools", "re", "string", "textwrap", "operator", "json", "hashlib",
                           "functools", "collections", "fractions", "statistics"})

# Helpers of the chapters' locked cells that a test calls with its own hints and messages:
# they run here (their source, taken from the notebook's helpers cell), never in the kernel.
LOCAL_HELPERS = frozenset({"expect_error", "call_answer", "call", "expect_warning", "fix_hint"})


def agent_source() -> str:
    return (Path(__file__).with_name("agent_kernel.py")).read_text()


def init_code(helpers_cells: tuple[str, ...] = (), name: str | None = None) -> str:
    """The grader's first cell: installs the agent in a namespace of its own, as the module
    `name` (agent_name()). `helpers_cells`: the sources of the notebook's locked helpers cells
    (a tensor class they define is the course's, agent_kernel.install)."""
    import hashlib
    trusted = sorted(hashlib.sha256(c.encode()).hexdigest() for c in helpers_cells)
    return (f"(lambda ns: (exec(compile({agent_source()!r}, '<grader agent>', 'exec', dont_inherit=True), ns),\n"
            f"             ns['install'](get_ipython().user_ns, frozenset({trusted!r}), {name or agent_name()!r})))(\n"
            "    {'__name__': '<grader agent>'})\n"
            "pass")


NUDGE_S = 0.25


class KernelGone(Exception):
    """The kernel died or stopped answering the agent's protocol."""


class TestTimeout(Exception):
    """The test ran past its time limit."""


# What one answer of the kernel may hold, checked here on the raw text before it is decoded:
# a tensor of a million values fits (about 20 characters a value), 5,000,000 empty lists
# (20 MB of JSON, 2 GiB once decoded) do not. The kernel's agent has caps of its own, but the
# student's code can replace the agent; these are the grader's.
MAX_ANSWER_CHARS = 32 * 2**20
MAX_ANSWER_ITEMS = 1_100_000
MAX_ANSWER_DEPTH = 64
# A frame larger than this never reaches the grader's memory: ZMQ drops the connection
# (the agent's prompt is lost, and the test runs into its time limit).
MAX_ANSWER_WIRE_BYTES = 4 * MAX_ANSWER_CHARS + 2**20
MAX_EXCEPTION_CLASSES = 1_000  # distinct kernel exception classes one kernel may show the grader
MAX_RECEIVED_CHARS = 8_000_000  # characters of answers kept for tests (Channel.received)


class AnswerTooLarge(Exception):
    """The kernel sent more than the grader reads. Costs the test that asked (kept in
    Channel.failures, so a test that catches it still fails)."""

    # Each message is one f-string: the Chinese edition translates it (testmessages.GRADER_MODULES).


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None (another C library, another OS)."""
    try:
        import ctypes
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def _give_back_memory() -> None:
    """After a refused answer (tens of MB of text, copied by ZMQ, jupyter_client and the checks):
    glibc keeps freed blocks of that size in the heap for reuse, so the worker would hold them
    for the next student; malloc_trim returns them to the system."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_BRACKET_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def check_answer(text: str) -> None:
    """Raise AnswerTooLarge when a prompt's raw JSON is over the grader's limits: its size,
    then its items (commas and openings outside strings), then its nesting; all counted on
    the text, without building a single value of it."""
    if len(text) > MAX_ANSWER_CHARS:
        raise AnswerTooLarge(f"the answer sent more than {MAX_ANSWER_CHARS:,} characters to the grader")
    bare = _JSON_STRING.sub('""', text) if '"' in text else text
    if bare.count(",") + bare.count("[") + bare.count("{") > MAX_ANSWER_ITEMS:
        raise AnswerTooLarge(f"the answer sent more than {MAX_ANSWER_ITEMS:,} items to the grader")
    brackets = _NOT_BRACKET.sub("", bare)
    if len(brackets) > MAX_ANSWER_DEPTH and \
            max(accumulate(map(_BRACKET_STEP.__getitem__, brackets)), default=0) > MAX_ANSWER_DEPTH:
        raise AnswerTooLarge(f"the answer sent more than {MAX_ANSWER_DEPTH:,} levels of nesting to the grader")


# -------------------------------------------------------------------------------------------
# The channel to the kernel


def _client_class():
    """jupyter_client's blocking client, whose stdin socket refuses frames over
    MAX_ANSWER_WIRE_BYTES (ZMQ_MAXMSGSIZE, set before it connects)."""
    import zmq
    from jupyter_client.blocking import BlockingKernelClient

    class CappedClient(BlockingKernelClient):
        def connect_stdin(self, identity=None):
            sock = self.context.socket(zmq.DEALER)
            sock.linger = 1000
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_ANSWER_WIRE_BYTES)
            if identity:
                sock.identity = identity
            if getattr(self, "curve_publickey", None) is not None:
                sock.curve_secretkey = self.curve_secretkey
                sock.curve_publickey = self.curve_publickey
                sock.curve_serverkey = self.curve_publickey
            sock.connect(self._make_url("stdin"))
            return sock

    return CappedClient


class Channel:
    """One execute request per test cell, whose code serves the grader's operations over
    stdin. Every iopub message of that request is kept as evidence (stdout, stderr, errors).

    Everything the grader holds for one kernel lives here and goes with the channel (one per
    kernel of one notebook, never shared across students): the proxies of the kernel's objects
    (weakly: a proxy no test holds any more is freed), the local classes standing for the
    kernel's exception classes (at most MAX_EXCEPTION_CLASSES). An answer over the limits of
    check_answer is refused before it is decoded."""

    def __init__(self, km, deadline: float, max_output_bytes: int = 2_000_000, agent: str = ""):
        from jupyter_client.session import Session

        self.serve_code = serve_code(agent)
        self.km = km
        info = km.get_connection_info()
        self.kc = _client_class()(session=Session(key=km.session.key,
                                                  signature_scheme=km.session.signature_scheme))
        self.kc.load_connection_info(info)
        self.kc.start_channels()
        self.deadline = deadline
        self.msg_id: str | None = None
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.errors: list[dict] = []
        self.kept = 0
        self.max_output_bytes = max_output_bytes
        self.reply: dict | None = None
        # One Proxy per kernel object for the channel's life, held strongly: a test compares them
        # by identity (`id(p)` of a parameter taken twice); freed with the channel (close).
        self.refs: dict[int, "Proxy"] = {}
        self.exception_classes: dict[int, type] = {}
        self.received_chars = 0
        self.callbacks: dict[int, Callable] = {}
        self.callback_ids: dict[int, int] = {}
        self.failures: list[BaseException] = []
        self.sent: set[str] = set()  # every string the grader sent to the kernel (tests read it)
        self.received: set[str] = set()  # every string the kernel's answers held (the same)
        self.opaque: dict[int, Any] = {}
        self.iterated: dict[int, Any] = {}
        self.opaque_ids: dict[int, int] = {}
        self.alive_checked = time.monotonic()
        self.sequence = 0
        self.connected = False

    def close(self) -> None:
        try:
            self.kc.stop_channels()
        except Exception:
            pass
        self.refs.clear()
        self.exception_classes.clear()
        self.opaque.clear()
        self.callbacks.clear()
        self.iterated.clear()

    def _drain_iopub(self) -> None:
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=0)
            except Empty:
                return
            if (msg.get("parent_header") or {}).get("msg_id") != self.msg_id:
                continue
            kind, content = msg["msg_type"], msg.get("content") or {}
            if kind == "status" and content.get("execution_state") == "idle":
                self.idle = True
            if kind == "stream":
                text = str(content.get("text", ""))
                target = self.stderr if content.get("name") == "stderr" else self.stdout
                room = self.max_output_bytes - self.kept
                if room > 0:
                    target.append(text[:room])
                    self.kept += min(len(text), room)
                elif target is self.stderr and not self.stderr:
                    target.append(text[:200])
            elif kind == "error":
                self.errors.append({"ename": str(content.get("ename", ""))[:200],
                                    "evalue": str(content.get("evalue", ""))[:2000]})

    def _wait_prompt(self) -> dict:
        nudge = time.monotonic() + NUDGE_S
        while True:
            now = time.monotonic()
            if now > self.deadline:
                raise TestTimeout()
            try:
                msg = self.kc.get_stdin_msg(timeout=0.05)
            except Empty:
                msg = None
            if msg is None and now > nudge and not self.connected:
                # The kernel's ROUTER drops a message to a peer whose connection is not up yet
                # (a fresh client's first prompt): an empty reply makes the agent ask again.
                # Only until the first prompt arrived: later ones are never lost, and a stale
                # reply could make ipykernel's input() purge a real one.
                self.kc.input("")
                nudge = now + NUDGE_S
            self._drain_iopub()
            if msg is not None:
                if msg["msg_type"] == "input_request" and \
                        (msg.get("parent_header") or {}).get("msg_id") == self.msg_id:
                    prompt = str((msg.get("content") or {}).get("prompt", ""))
                    try:
                        check_answer(prompt)
                    except AnswerTooLarge as exc:
                        # The agent waits for the next operation, as after any answer: the
                        # protocol goes on, and the test that asked fails.
                        del prompt, msg
                        _give_back_memory()
                        self.connected = True
                        self.failures.append(exc)
                        raise
                    try:
                        answer = json.loads(prompt)
                    except ValueError:
                        # Student code called input() itself: no answer to that.
                        self.kc.input("")
                        continue
                    if not isinstance(answer, dict):
                        self.kc.input("")
                        continue
                    number = answer.get("n")
                    if isinstance(number, int) and number <= self.sequence:
                        continue  # a prompt asked again after a nudge: already answered
                    if isinstance(number, int):
                        self.sequence = number
                    self.connected = True
                    if self.received_chars < MAX_RECEIVED_CHARS:
                        self.received_chars += len(prompt)
                        _strings_in(answer, self.received)
                    return answer
                continue
            try:
                reply = self.kc.get_shell_msg(timeout=0)
            except Empty:
                reply = None
            if reply is not None and (reply.get("parent_header") or {}).get("msg_id") == self.msg_id:
                self.reply = reply.get("content") or {}
                raise KernelGone("the kernel stopped serving the grader's questions "
                                 f"(status {self.reply.get('status')!r})")
            now = time.monotonic()
            if now - self.alive_checked > 1.0:
                self.alive_checked = now
                if not self._alive():
                    raise KernelGone("the kernel died")

    def _alive(self) -> bool:
        """Whether the kernel's process still runs (asked of its process, not of the kernel)."""
        try:
            provisioner = getattr(self.km, "provisioner", None)
            process = getattr(provisioner, "process", None)
            if process is not None:
                return process.poll() is None
            return True
        except Exception:
            return True

    def start(self) -> None:
        self.idle = False
        self.msg_id = self.kc.execute(self.serve_code, silent=True, store_history=False, allow_stdin=True)
        first = self._wait_prompt()
        if not first.get("ready"):
            raise KernelGone("the kernel's agent did not answer")

    def finish(self) -> None:
        self.kc.input(json.dumps({"op": "done"}))
        while self.reply is None:
            if time.monotonic() > self.deadline:
                raise TestTimeout()
            try:
                msg = self.kc.get_shell_msg(timeout=0.05)
            except Empty:
                msg = None
            if msg is not None and (msg.get("parent_header") or {}).get("msg_id") == self.msg_id:
                self.reply = msg.get("content") or {}
            self._drain_iopub()
            now = time.monotonic()
            if self.reply is None and now - self.alive_checked > 1.0:
                # A kernel that died during the test (whose code caught the error that said
                # so) never replies: without this, the test would wait out its time limit.
                self.alive_checked = now
                if not self._alive():
                    raise KernelGone("the kernel died")
        # The idle status follows the reply: read what the request printed up to it.
        end = time.monotonic() + 5.0
        while not self.idle and time.monotonic() < end:
            time.sleep(0.002)
            self._drain_iopub()

    # -- one operation --------------------------------------------------------------------------
    def request(self, op: dict) -> Any:
        _strings_in(op, self.sent)
        self.kc.input(json.dumps(op))
        answer = self._wait_prompt()
        while "callback" in answer:
            answer = self._run_callback(answer["callback"])
        if "ok" in answer:
            return self.decode(answer["ok"])
        if "raised" in answer:
            raise remote_exception(self, answer["raised"])
        raise KernelGone(f"the kernel's agent sent an answer the grader does not understand")

    def _run_callback(self, call: dict) -> dict:
        fn = self.callbacks.get(call.get("id"))
        if fn is None:
            self.kc.input(json.dumps({"op": "raise", "type": "RuntimeError"}))
            return self._wait_prompt()
        try:
            args = [self.decode(a) for a in call.get("a", [])]
            kwargs = {str(k): self.decode(v) for k, v in (call.get("k") or {}).items()}
            result = fn(*args, **kwargs)
            message = {"op": "return", "v": self.encode(result)}
        except (TestTimeout, KernelGone):
            raise
        except BaseException as exc:  # its message stays here
            if isinstance(exc, AssertionError):
                self.failures.append(exc)
            message = {"op": "raise", "id": getattr(exc, "_remote_id", None), "type": _builtin_name(exc)}
        self.kc.input(json.dumps(message))
        return self._wait_prompt()

    # -- values ---------------------------------------------------------------------------------
    def decode(self, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        tag = value.get("$")
        if tag == "ref":
            number = value["id"]
            if number in self.opaque:
                return self.opaque[number]
            found = self.refs.get(number)
            if found is None:
                found = Proxy._make(self, number, value.get("kind", "object"), str(value.get("type", "")))
                self.refs[number] = found
            return found
        if tag == "tuple":
            return tuple(self.decode(v) for v in value["v"])
        if tag == "int":
            return int(value["v"])
        if tag == "float":
            return float(value["v"])
        if tag == "bytes":
            return bytes.fromhex(value["v"])
        if tag == "ellipsis":
            return Ellipsis
        if tag == "slice":
            return slice(*(self.decode(v) for v in value["v"]))
        if tag == "device":
            import torch
            return torch.device(value["v"])
        if tag == "dtype":
            import torch
            found = getattr(torch, str(value["v"]), None)
            if not isinstance(found, torch.dtype):
                raise KernelGone(f"unknown dtype {value['v']!r} from the kernel")
            return found
        if tag == "size":
            import torch
            return torch.Size([int(v) for v in value["v"]])
        if tag == "excclass":
            return exception_class(self, value["name"], value.get("module", ""), value.get("mro", []),
                                   value["id"])
        if tag == "raw":
            return value["v"]
        raise KernelGone(f"the kernel sent an unknown value {tag!r}")

    def encode(self, value: Any, depth: int = 0) -> Any:
        kind = type(value)
        if value is None or kind in (bool, str):
            return value
        if kind is int:
            return value if abs(value) < 2 ** 53 else {"$": "int", "v": str(value)}
        if kind is float:
            return value if math.isfinite(value) else {"$": "float", "v": repr(value)}
        if isinstance(value, Proxy):
            if object.__getattribute__(value, "_channel") is not self:
                raise TypeError("a value from an earlier kernel (the kernel was restarted)")
            return {"$": "ref", "id": object.__getattribute__(value, "_id")}
        if isinstance(value, type) and getattr(builtins, value.__name__, None) is value:
            return {"$": "builtin", "v": value.__name__}
        remote_id = getattr(value, "_remote_id", None) if isinstance(value, (type, BaseException)) else None
        if remote_id is not None:
            return {"$": "ref", "id": remote_id}
        if isinstance(value, RemoteClass):
            return {"$": "ref", "id": type(value)._remote_id}
        if depth > 16:
            raise TypeError("value nested too deeply to send to the kernel")
        if kind in (tuple, list, set, frozenset):
            return {"$": kind.__name__, "v": [self.encode(v, depth + 1) for v in value]}
        if kind is dict:
            return {"$": "dict", "v": [[self.encode(k, depth + 1), self.encode(v, depth + 1)]
                                       for k, v in value.items()]}
        if kind is bytes:
            return {"$": "bytes", "v": value.hex()}
        if value is Ellipsis:
            return {"$": "ellipsis"}
        if kind is slice:
            return {"$": "slice", "v": [self.encode(value.start), self.encode(value.stop),
                                        self.encode(value.step)]}
        if kind is range:
            return {"$": "range", "v": [value.start, value.stop, value.step]}
        torch = sys.modules.get("torch")
        if torch is not None:
            if kind is torch.device:
                return {"$": "device", "v": str(value)}
            if kind is torch.dtype:
                return {"$": "dtype", "v": str(value).replace("torch.", "")}
            if kind is torch.Size:
                return {"$": "size", "v": [int(v) for v in value]}
            if isinstance(value, torch.Tensor):
                plain = value.detach()
                return {"$": "tensor", "dtype": str(plain.dtype).replace("torch.", ""),
                        "shape": list(plain.shape), "device": str(plain.device),
                        "values": None if plain.is_meta else plain.cpu().tolist()}
        if isinstance(value, (types.GeneratorType, collections_abc.Iterator)) and not callable(value):
            # A generator of the test's: the kernel iterates it by asking for each item.
            key = id(value)
            number = self.callback_ids.get(key)
            if number is None or self.iterated.get(number) is not value:
                number = len(self.callbacks) + 1
                self.callbacks[number] = lambda: next(value)
                self.iterated[number] = value
                self.callback_ids[key] = number
            return {"$": "iter", "id": number}
        if not callable(value) or isinstance(value, type):
            # An object of the grader's with no meaning to the kernel (a sentinel, `object()`):
            # the kernel gets a stand-in, which comes back here as this very object.
            key = id(value)
            number = self.opaque_ids.get(key)
            if number is None or self.opaque.get(number) is not value:
                stand_in = self.request({"op": "stand_in"})
                number = object.__getattribute__(stand_in, "_id")
                self.opaque[number] = value
                self.opaque_ids[key] = number
            return {"$": "ref", "id": number}
        if callable(value):
            key = id(value)
            number = self.callback_ids.get(key)
            if number is None or self.callbacks.get(number) is not value:
                number = len(self.callbacks) + 1
                self.callbacks[number] = value
                self.callback_ids[key] = number
            return {"$": "cb", "id": number, "name": getattr(value, "__name__", "callback")}
        raise TypeError(f"the grader cannot send a {kind.__name__} to the kernel")


def _strings_in(value: Any, into: set[str]) -> None:
    if isinstance(value, str):
        into.add(value)
    elif isinstance(value, dict):
        for v in value.values():
            _strings_in(v, into)
    elif isinstance(value, list):
        for v in value:
            _strings_in(v, into)


def _builtin_name(exc: BaseException) -> str:
    for klass in type(exc).__mro__:
        if getattr(builtins, klass.__name__, None) is klass:
            return klass.__name__
    return "Exception"


def exception_class(channel: Channel, name: str, module: str, mro: list[str], remote_id: int) -> type:
    """The local class standing for a kernel's exception class: the builtin itself for a
    builtin, otherwise a subclass of the nearest builtin base, with the kernel's name."""
    if module == "builtins":
        found = getattr(builtins, name, None)
        if isinstance(found, type) and issubclass(found, BaseException):
            return found
    found = channel.exception_classes.get(remote_id)
    if found is None:
        if len(channel.exception_classes) >= MAX_EXCEPTION_CLASSES:
            exc = AnswerTooLarge(
                f"the answer sent more than {MAX_EXCEPTION_CLASSES:,} exception classes to the grader")
            channel.failures.append(exc)
            _give_back_memory()
            raise exc
        base = Exception
        for candidate in mro:
            klass = getattr(builtins, candidate, None)
            if isinstance(klass, type) and issubclass(klass, BaseException):
                base = klass
                break
        safe = name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,80}", name or "") else "Error"
        found = type(safe, (base,), {"__module__": module if re.fullmatch(r"[\w.]{1,120}", module or "") else "kernel",
                                     "__str__": lambda self: self._remote_message,
                                     "_remote_id": remote_id})
        channel.exception_classes[remote_id] = found
    return found


def remote_exception(channel: Channel, info: dict) -> BaseException:
    klass = exception_class(channel, str(info.get("type", "Error")), str(info.get("module", "")),
                            list(info.get("mro", [])), info.get("class"))
    message = str(info.get("message", ""))
    args = info.get("args") or []
    try:
        exc = klass(*args)
    except Exception:
        exc = klass(message)
    try:
        exc._remote_message = message
        exc._remote_id = info.get("id")
    except (AttributeError, TypeError):
        pass
    if getattr(builtins, klass.__name__, None) is klass and str(exc) != message:
        # A builtin class whose arguments do not rebuild the kernel's message: keep the message.
        klass = type(klass.__name__, (klass,), {"__str__": lambda self: self._remote_message,
                                                "__module__": "builtins"})
        exc = klass(*args) if args else klass(message)
        exc._remote_message = message
        exc._remote_id = info.get("id")
    return exc


# -------------------------------------------------------------------------------------------
# Proxies

_BUILTIN_KINDS = {"list": list, "dict": dict, "set": set, "frozenset": frozenset}


def _ch(p: "Proxy") -> Channel:
    return object.__getattribute__(p, "_channel")


def _ref(p: "Proxy") -> dict:
    return {"$": "ref", "id": object.__getattribute__(p, "_id")}


def _op(p: "Proxy", name: str, *args) -> Any:
    ch = _ch(p)
    return ch.request({"op": "operator", "name": name, "a": [ch.encode(p)] + [ch.encode(a) for a in args]})


def _rop(p: "Proxy", name: str, other) -> Any:
    ch = _ch(p)
    return ch.request({"op": "operator", "name": name, "a": [ch.encode(other), ch.encode(p)]})


def _builtin(p: "Proxy", name: str, *args, **kwargs) -> Any:
    ch = _ch(p)
    return ch.request({"op": "builtin", "name": name, "a": [ch.encode(p)] + [ch.encode(a) for a in args],
                       "k": {k: ch.encode(v) for k, v in kwargs.items()}})


class Proxy:
    """An object that stays in the kernel. Every use asks the kernel's agent."""

    __slots__ = ("_channel", "_id", "_kind", "_type", "_path", "__weakref__")

    @staticmethod
    def _make(channel: Channel, number: int, kind: str, type_name: str, path: str = "") -> "Proxy":
        klass = {"module": ModuleProxy, "class": ClassProxy}.get(kind, Proxy)
        p = object.__new__(klass)
        object.__setattr__(p, "_channel", channel)
        object.__setattr__(p, "_id", number)
        object.__setattr__(p, "_kind", kind)
        object.__setattr__(p, "_type", type_name)
        object.__setattr__(p, "_path", path)
        return p

    @property
    def __class__(self):
        kind = object.__getattribute__(self, "_kind")
        return _BUILTIN_KINDS.get(kind, type(self))

    def __getattr__(self, name):
        ch = _ch(self)
        value = ch.request({"op": "getattr", "o": _ref(self), "name": name})
        return value

    def __setattr__(self, name, value):
        ch = _ch(self)
        ch.request({"op": "setattr", "o": _ref(self), "name": name, "v": ch.encode(value)})

    def __delattr__(self, name):
        _ch(self).request({"op": "delattr", "o": _ref(self), "name": name})

    def __call__(self, *args, **kwargs):
        ch = _ch(self)
        return ch.request({"op": "call", "f": _ref(self), "a": [ch.encode(a) for a in args],
                           "k": {k: ch.encode(v) for k, v in kwargs.items()}})

    def __repr__(self):
        try:
            return _builtin(self, "repr")
        except (KernelGone, TestTimeout):
            raise
        except Exception as exc:
            return f"<kernel object: repr failed with {type(exc).__name__}>"

    def __str__(self):
        return _builtin(self, "str")

    def __format__(self, spec):
        return _builtin(self, "format", spec)

    def __bool__(self):
        return _builtin(self, "bool")

    def __len__(self):
        return _builtin(self, "len")

    def __hash__(self):
        return object.__hash__(self)

    def __iter__(self):
        kind = object.__getattribute__(self, "_kind")
        if kind in ("list", "dict", "set", "frozenset"):
            ch = _ch(self)
            yield from ch.request({"op": "items", "o": _ref(self)})
            return
        iterator = _builtin(self, "iter")
        while True:
            try:
                item = _builtin(iterator, "next")
            except StopIteration:
                return
            yield item

    def __next__(self):
        return _builtin(self, "next")

    def __contains__(self, item):
        return _op(self, "contains", item)

    def __getitem__(self, key):
        return _op(self, "getitem", key)

    def __setitem__(self, key, value):
        _op(self, "setitem", key, value)

    def __delitem__(self, key):
        _op(self, "delitem", key)

    def __enter__(self):
        ch = _ch(self)
        return ch.request({"op": "enter", "o": _ref(self)})

    def __exit__(self, kind, exc, tb):
        ch = _ch(self)
        remote = getattr(exc, "_remote_id", None) if exc is not None else None
        return ch.request({"op": "exit", "o": _ref(self),
                           "e": {"$": "ref", "id": remote} if remote is not None else None})

    def __copy__(self):
        ch = _ch(self)
        copier = ch.request({"op": "getattr", "o": _ref(ch.request({"op": "import", "name": "copy"})), "name": "copy"})
        return copier(self)

    def __dir__(self):
        return list(_builtin(self, "dir"))

    def __instancecheck__(self, obj):
        ch = _ch(self)
        return ch.request({"op": "builtin", "name": "isinstance", "a": [ch.encode(obj), _ref(self)]})

    def __subclasscheck__(self, klass):
        ch = _ch(self)
        return ch.request({"op": "builtin", "name": "issubclass", "a": [ch.encode(klass), _ref(self)]})

    def __int__(self):
        return _builtin(self, "int")

    def __float__(self):
        return _builtin(self, "float")

    def __complex__(self):
        return _builtin(self, "complex")

    def __index__(self):
        return _op(self, "index")

    def __round__(self, n=None):
        return _builtin(self, "round", n) if n is not None else _builtin(self, "round")

    def __abs__(self):
        return _op(self, "abs")

    def __neg__(self):
        return _op(self, "neg")

    def __pos__(self):
        return _op(self, "pos")

    def __invert__(self):
        return _op(self, "invert")

    def __mro_entries__(self, bases):
        return (RemoteClass,)


def _binary(name: str, reflected: str | None = None):
    def forward(self, other):
        return _op(self, name, other)

    def backward(self, other):
        return _rop(self, name, other)

    return forward, backward


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor",
              "lshift", "rshift"):
    _op_name = {"and": "and_", "or": "or_"}.get(_name, _name)
    _f, _b = _binary(_op_name)
    setattr(Proxy, f"__{_name}__", _f)
    setattr(Proxy, f"__r{_name}__", _b)

    def _inplace(self, other, _n="i" + _op_name.rstrip("_")):
        return _op(self, _n, other)

    setattr(Proxy, f"__i{_name}__", _inplace)

def _compare(name: str):
    def compare(self, other):
        torch = sys.modules.get("torch")
        if name in ("eq", "ne") and torch is not None and type(other) in (torch.device, torch.dtype):
            # A real device or dtype reaches the grader as plain data, never as a reference:
            # an object of the kernel's that says it equals one is not one (a spoof's __eq__).
            return name == "ne"
        return _op(self, name, other)
    return compare


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    setattr(Proxy, f"__{_name}__", _compare(_name))
Proxy.__hash__ = lambda self: object.__hash__(self)  # kept after __eq__ (identity, as tensors)


def _deepcopy(self, memo):
    ch = _ch(self)
    copy_module = ch.request({"op": "import", "name": "copy"})
    return copy_module.deepcopy(self)


Proxy.__deepcopy__ = _deepcopy


class ModuleProxy(Proxy):
    """A module of the kernel; attributes on the paths of INTERCEPTS are the grader's."""

    __slots__ = ()

    def __getattr__(self, name):
        path = object.__getattribute__(self, "_path")
        full = f"{path}.{name}" if path else name
        local = INTERCEPTS.get(full)
        if local is not None:
            return local
        local = _local_attr(full)
        if local is not None:
            return local
        if path in CAPTURED_MODULES:
            # The library's attribute as the agent found it at install, before any student code
            # (agent_kernel._CAPTURED_MODULES): a rebound `torch.ones` or `torch.Tensor` is not it.
            value = _ch(self).request({"op": "libattr", "m": path, "name": name})
        else:
            value = Proxy.__getattr__(self, name)
        if isinstance(value, ModuleProxy) and not object.__getattribute__(value, "_path"):
            object.__setattr__(value, "_path", full)
        return value


class ClassProxy(Proxy):
    __slots__ = ()


# -- classes a test defines on a kernel base class ------------------------------------------


_SUPER_DUNDERS = {"__setattr__", "__getattr__", "__delattr__", "__getstate__", "__setstate__",
                  "__repr__", "__call__", "__getitem__", "__setitem__", "__len__", "__iter__"}


class _RemoteClassMeta(type):
    """`class Vocab(nn.Module): ...` in a test, with `nn.Module` a proxy: the class is made in
    the kernel with stubs for its methods, which run here when the kernel calls them (with a
    proxy of the instance as `self`). `super()` inside them reaches the kernel's base."""

    def __new__(mcls, name, bases, ns, **kw):
        if name == "RemoteClass" and "__orig_bases__" not in ns:
            return super().__new__(mcls, name, bases, ns)
        orig = ns.get("__orig_bases__", ())
        kernel_bases = [b for b in orig if isinstance(b, Proxy)] + [
            b._remote for b in bases if isinstance(b, _RemoteClassMeta) and "_remote" in vars(b)]
        channel = _ch(kernel_bases[0]) if kernel_bases else None
        names: set[str] = set()
        methods, attrs = {}, {}
        for key, value in ns.items():
            if key in ("__module__", "__qualname__", "__orig_bases__", "__classcell__", "__doc__"):
                continue
            if isinstance(value, types.FunctionType):
                methods[key] = value
                names.update(_co_names(value.__code__))
            else:
                attrs[key] = value
        local_ns = dict(ns)
        forwarders = {attr: _super_forwarder(attr) for attr in names
                      if not attr.startswith("__") or attr in _SUPER_DUNDERS}
        local_bases = tuple(b for b in bases if b is not RemoteClass) or (RemoteClass,)
        between = type.__new__(mcls, f"{name}<kernel base>", local_bases, forwarders)
        klass = super().__new__(mcls, name, (between,), local_ns)
        remote = channel.request({
            "op": "mkclass", "name": name, "bases": [channel.encode(b) for b in kernel_bases],
            "methods": {k: channel.encode(_bound_here(klass, k, f))["id"] for k, f in methods.items()},
            "attrs": {k: channel.encode(v) for k, v in attrs.items()}})
        klass._remote = remote
        klass._remote_id = object.__getattribute__(remote, "_id")
        klass._channel = channel
        return klass

    def __call__(cls, *args, **kwargs):
        return cls._remote(*args, **kwargs)

    def __instancecheck__(cls, obj):
        if not hasattr(cls, "_remote"):
            return super().__instancecheck__(obj)
        return isinstance(obj, cls._remote)

    def __getattr__(cls, name):
        if name.startswith("_") and name in ("_remote", "_remote_id", "_channel"):
            raise AttributeError(name)
        return getattr(cls._remote, name)


def _co_names(code) -> set[str]:
    found = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= _co_names(const)
    return found


def _bound_here(klass, name: str, fn: Callable) -> Callable:
    """What the kernel's stub calls: `fn` with the instance's proxy as `self`, seen here as an
    instance of the local class (so zero-argument super() works)."""

    def method(self_proxy, *args, **kwargs):
        return fn(_as_instance(klass, self_proxy), *args, **kwargs)

    method.__name__ = name
    return method


class _Instance(Proxy):
    """A proxy whose class, as super() and isinstance() see it, is a class a test defined."""
    __slots__ = ("_local_class",)

    @property
    def __class__(self):
        return object.__getattribute__(self, "_local_class")


def _as_instance(klass, p: Proxy) -> Proxy:
    if isinstance(p, _Instance):
        return p
    inst = object.__new__(_Instance)
    for slot in ("_channel", "_id", "_kind", "_type", "_path"):
        object.__setattr__(inst, slot, object.__getattribute__(p, slot))
    object.__setattr__(inst, "_local_class", klass)
    return inst


def _super_forwarder(name: str):
    def forward(self, *args, **kwargs):
        # Reached as super().name(...) from a method of the test's class: the kernel's base.
        ch = _ch(self)
        klass = object.__getattribute__(self, "_local_class")
        bound = ch.request({"op": "super", "cls": {"$": "ref", "id": klass._remote_id},
                            "self": _ref(self), "name": name})
        return bound(*args, **kwargs)

    forward.__name__ = name
    return forward


class RemoteClass(metaclass=_RemoteClassMeta):
    """The local base standing in for a kernel class in a test's class statement."""

    def __init__(self, *args, **kwargs):
        ch = _ch(self)
        klass = object.__getattribute__(self, "_local_class")
        bound = ch.request({"op": "super", "cls": {"$": "ref", "id": klass._remote_id},
                            "self": _ref(self), "name": "__init__"})
        bound(*args, **kwargs)


# -------------------------------------------------------------------------------------------
# Tensor comparisons run here, on the values


def materialize(value: Any) -> Any:
    """A local copy of a kernel tensor or array (values, dtype, shape, device), read in the
    kernel by the library's own accessors; containers recursively. A tensor or array of a class
    the course never makes (a subclass a notebook defines) fails here, with a message saying so."""
    import torch

    if isinstance(value, Proxy):
        kind = object.__getattribute__(value, "_kind")
        if kind in ("tensor", "object"):
            info = _ch(value).request({"op": "materialize", "o": _ref(value)})
            if info.get("other"):
                return value
            if info.get("array"):
                import numpy
                return numpy.array(info["values"], dtype=info["dtype"]).reshape(info["shape"])
            dtype = getattr(torch, info["dtype"])
            if not isinstance(dtype, torch.dtype):
                raise KernelGone(f"unknown dtype {info['dtype']!r} from the kernel")
            device = torch.device(info["device"])
            if info["values"] is None:
                out = torch.empty(info["shape"], dtype=dtype, device="meta")
            else:
                out = torch.tensor(info["values"], dtype=dtype).reshape(info["shape"])
                if device.type != "cpu":
                    try:
                        out = out.to(device)
                    except Exception:
                        pass
            return out
        if kind in ("list", "dict"):
            items = list(value)
            if kind == "dict":
                return {k: materialize(value[k]) for k in items}
            return [materialize(v) for v in items]
        return value
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        return type(value)(materialize(v) for v in value) if type(value) in (list, tuple) else value
    if isinstance(value, dict):
        return {k: materialize(v) for k, v in value.items()}
    return value


def _local_equal(a, b):
    import torch
    return torch.equal(materialize(a), materialize(b))


def _local_allclose(a, b, *args, **kwargs):
    import torch
    return torch.allclose(materialize(a), materialize(b), *args, **kwargs)


def _local_assert_close(actual, expected, *args, **kwargs):
    import torch
    return torch.testing.assert_close(materialize(actual), materialize(expected), *args, **kwargs)


def _local_numpy(path: str):
    """numpy's own `path` (array_equal, allclose, testing.assert_*), run here on copies."""
    def compare(*args, **kwargs):
        import numpy
        fn = numpy
        for part in path.split(".")[1:]:
            fn = getattr(fn, part)
        return fn(*(_as_array(materialize(a)) for a in args),
                  **{k: _as_array(materialize(v)) for k, v in kwargs.items()})
    compare.__name__ = path.rsplit(".", 1)[-1]
    return compare


def _as_array(value):
    import torch
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy() if value.device.type != "meta" else value
    return value


INTERCEPTS: dict[str, Any] = {
    "torch.equal": _local_equal,
    "torch.allclose": _local_allclose,
    "torch.testing.assert_close": _local_assert_close,
    **{f"numpy.{name}": _local_numpy(f"numpy.{name}") for name in (
        "array_equal", "array_equiv", "allclose", "isclose", "testing.assert_array_equal",
        "testing.assert_allclose", "testing.assert_equal", "testing.assert_array_almost_equal",
        "testing.assert_almost_equal")},
}

# Modules whose attributes a test gets as the agent captured them at install
# (agent_kernel._CAPTURED_MODULES).
CAPTURED_MODULES = frozenset({"torch", "torch.nn", "torch.nn.functional", "torch.testing", "numpy"})

# The names of the kernel's modules that a test uses as the grader's own objects: plain data
# (devices, dtypes, shapes), so an expected `torch.device("cuda", 0)` is built here, by the
# grader's torch, whatever the kernel's `torch.device` has become.
LOCAL_ATTRS = frozenset({"torch.device", "torch.dtype", "torch.Size"})


def _local_attr(full: str) -> Any:
    """The grader's own value for `full` (a torch dtype, torch.device, ...), or None."""
    if not full.startswith("torch.") or full.count(".") != 1:
        return None
    import torch
    name = full.split(".", 1)[1]
    found = getattr(torch, name, None)
    if full in LOCAL_ATTRS or isinstance(found, torch.dtype):
        return found
    return None


# A test's global names for the libraries (as the notebooks import them): the kernel's real
# modules, imported by name, whatever the notebook has bound to the name.
MODULE_GLOBALS = {"torch": "torch", "np": "numpy", "numpy": "numpy", "nn": "torch.nn",
                  "F": "torch.nn.functional"}


# -------------------------------------------------------------------------------------------
# Running one test cell


def _grader_cm(manager):
    """`with X:` in a test: a device decoded here (torch.device is plain data here) is entered
    in the kernel, where the code under test runs."""
    import torch
    if isinstance(manager, torch.device):
        channel = _CURRENT.get("channel")
        return channel.request({"op": "hold", "v": channel.encode(manager)})
    return manager


_CURRENT: dict[str, Channel] = {}


def _rewrite_withs(tree):
    import ast

    class Wrap(ast.NodeTransformer):
        def visit_ClassDef(self, node):
            # A class a test defines is made in the kernel, where the code under test uses it.
            self.generic_visit(node)
            if not node.bases and not node.keywords:
                node.bases = [ast.copy_location(ast.Name("__grader_object__", ast.Load()), node)]
            return node

        def visit_withitem(self, node):
            self.generic_visit(node)
            node.context_expr = ast.copy_location(
                ast.Call(func=ast.Name("__grader_cm__", ast.Load()), args=[node.context_expr], keywords=[]),
                node.context_expr)
            return node

    return ast.fix_missing_locations(Wrap().visit(tree))


def _free_names(tree) -> set[str]:
    import ast
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _local_type(*args):
    if len(args) == 1 and isinstance(args[0], Proxy):
        return _builtin(args[0], "type")
    return builtins.type(*args)


class TestSession:
    """The grader's side of one notebook's tests: the channel to the current kernel, and the
    namespace shared by the notebook's test cells (as the kernel's was: a name one test cell
    assigns is seen by the next). A new kernel (after a crash) starts both afresh."""

    def __init__(self, helpers_source: str = "", max_output_bytes: int = 2_000_000,
                 cwd: str | os.PathLike | None = None, accelerator: str = "cpu"):
        self.helpers_source = helpers_source
        self.agent_name = agent_name()  # the agent's module in this notebook's kernels (init_code)
        # The grader's word on the kernel's GPU (coursetools/grading/hardware.py).
        self.accelerator = accelerator
        # The kernel's working folder: a test that opens a file the assignment ships
        # ("data.csv") reads it from there, as it did when tests ran in the kernel.
        self.cwd = os.fspath(cwd) if cwd is not None else None
        self.max_output_bytes = max_output_bytes
        self.km = None
        self.channel: Channel | None = None
        self.namespace: dict = {}
        self.from_kernel: dict[str, Any] = {}
        self.sent: set[str] = set()  # every string sent to any kernel of this notebook
        self.received: set[str] = set()  # every string any kernel of this notebook answered

    def bind(self, km, deadline: float) -> Channel:
        if self.channel is None or km is not self.km:
            self.close()
            self.km = km
            self.channel = Channel(km, deadline, self.max_output_bytes, self.agent_name)
            self.channel.sent = self.sent
            self.channel.received = self.received
            self.namespace = {}
            self.from_kernel = {}
        self.channel.deadline = deadline
        self.channel.failures = []
        self.channel.stdout, self.channel.stderr, self.channel.errors = [], [], []
        self.channel.kept, self.channel.reply = 0, None
        return self.channel

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
        self.channel = None
        self.km = None


def _builtins_for(channel: Channel) -> dict:
    table = dict(vars(builtins))

    def _import(name, globals=None, locals=None, fromlist=(), level=0):
        top = name.split(".")[0]
        if top in LOCAL_MODULES:
            return builtins.__import__(name, globals, locals, fromlist, level)
        module = channel.request({"op": "import", "name": name if fromlist else top})
        if isinstance(module, ModuleProxy) and not object.__getattribute__(module, "_path"):
            object.__setattr__(module, "_path", name if fromlist else top)
        return module

    table["__import__"] = _import
    table["type"] = _local_type
    return table


@functools.lru_cache(maxsize=16)
def _local_helper_defs(helpers_source: str) -> str:
    """The source of the helpers in LOCAL_HELPERS, from the notebook's locked helpers cell
    (the same for every test of a notebook: worked out once)."""
    import ast
    if not helpers_source:
        return ""
    try:
        tree = ast.parse(helpers_source)
    except SyntaxError:
        return ""
    lines = helpers_source.splitlines(keepends=True)
    keep = [node for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in LOCAL_HELPERS]
    # Whole lines of top-level definitions (ast.get_source_segment splits the source again
    # for every node: 0.2 s a notebook).
    return "\n\n".join("".join(lines[node.lineno - 1:node.end_lineno]).rstrip("\n") for node in keep)


@dataclass
class TestResult:
    ok: bool
    outputs: list = field(default_factory=list)  # nbformat outputs
    ename: str = ""
    evalue: str = ""
    crashed: bool = False
    timed_out: bool = False


def run_test(km, source: str, gid: str, session: TestSession, *, deadline: float) -> TestResult:
    """Run one test cell here, against the kernel behind `km`."""
    import ast
    from nbformat import v4

    channel = session.bind(km, deadline)
    out = io.StringIO()
    failure: BaseException | None = None
    filename = TEST_FILE.format(gid)
    started = False  # whether the kernel serves this cell (a test that does not compile never starts it)
    try:
        tree = ast.parse(source, filename)
        free = _free_names(tree)
        code = compile(_rewrite_withs(tree), filename, "exec", dont_inherit=True)
        _CURRENT["channel"] = channel
        channel.start()
        started = True
        ns = session.namespace
        ns["__builtins__"] = _builtins_for(channel)
        ns.setdefault("__name__", "__grader_test__")
        helper_defs = _local_helper_defs(session.helpers_source)
        if helper_defs and not ns.get("__grader_helpers_loaded__"):
            exec(compile(helper_defs, HELPERS_FILE, "exec", dont_inherit=True), ns)
            ns["__grader_helpers_loaded__"] = True
        # Feedback in two steps (coursetools/grading/hints.py): the grader's messages always
        # carry the fix, after hints.FIX_MARKER; what is shown of it is the display's choice.
        ns.update(hints.grader_namespace())
        ns.update(hardware.test_names(session.accelerator))
        # Names from the kernel are looked up afresh for every test cell (the student may have
        # redefined an answer in between); names a test cell assigned stay the tests' own.
        ns["__grader_cm__"] = _grader_cm
        ns["__grader_object__"] = channel.request({"op": "builtin_object", "name": "object"})
        wanted = sorted(n for n in free
                        if n not in LOCAL_HELPERS and not hasattr(builtins, n)
                        and (n not in ns or (n in session.from_kernel and ns[n] is session.from_kernel[n])))
        present = channel.request({"op": "lookup", "names": wanted}) if wanted else ()
        for name in wanted:
            if name in MODULE_GLOBALS:
                module = channel.request({"op": "import", "name": MODULE_GLOBALS[name]})
                if isinstance(module, ModuleProxy):
                    object.__setattr__(module, "_path", MODULE_GLOBALS[name])
                ns[name] = session.from_kernel[name] = module
            elif name in present:
                ns[name] = session.from_kernel[name] = channel.request({"op": "global", "name": name})
            elif name in session.from_kernel and ns.get(name) is session.from_kernel[name]:
                del ns[name], session.from_kernel[name]
        with contextlib.redirect_stdout(out), _working_folder(session.cwd):
            exec(code, ns)
        if channel.failures:
            failure = channel.failures[0]
    except TestTimeout:
        session.close()
        return TestResult(False, _stream(out.getvalue() + "".join(channel.stdout)), "CellTimeoutError",
                          "", timed_out=True)
    except KernelGone as exc:
        crashed = not channel._alive()
        session.close()
        return TestResult(False, _stream(out.getvalue() + "".join(channel.stdout)),
                          "DeadKernelError" if crashed else "HiddenError", str(exc), crashed=crashed)
    except BaseException as exc:  # the test failed
        failure = exc
    try:
        if started:  # else nothing runs in the kernel: waiting for its reply would last until the deadline
            channel.finish()
    except TestTimeout:
        session.close()
        return TestResult(False, _stream(out.getvalue()), "CellTimeoutError", "", timed_out=True)
    except KernelGone as exc:
        session.close()
        return TestResult(False, _stream(out.getvalue() + "".join(channel.stdout)), "DeadKernelError",
                          str(exc), crashed=True)
    outputs = _stream(out.getvalue() + "".join(channel.stdout))
    if channel.stderr:
        outputs.append(v4.new_output("stream", name="stderr", text="".join(channel.stderr)))
    if failure is None and not channel.stderr and not channel.errors:
        return TestResult(True, outputs)
    if failure is None:
        if channel.errors:
            e = channel.errors[0]
            outputs.append(v4.new_output("error", ename=e["ename"] or "HiddenError", evalue=e["evalue"],
                                         traceback=[f"{e['ename']}: {e['evalue']}"]))
            return TestResult(False, outputs, e["ename"], e["evalue"])
        outputs.append(v4.new_output("error", ename="StderrWritten",
                                     evalue="the code under test wrote to stderr (a warning?), which scores 0",
                                     traceback=["StderrWritten"]))
        return TestResult(False, outputs, "StderrWritten", "")
    ename = type(failure).__name__
    try:
        evalue = str(failure)
    except Exception:
        evalue = ""
    lines = [f"{filename}:{f.lineno}" for f in traceback.extract_tb(failure.__traceback__)
             if f.filename == filename]
    outputs.append(v4.new_output("error", ename=ename, evalue=evalue,
                                 traceback=["Traceback (the grader's run of this test):", *lines,
                                            f"{ename}: {evalue}"]))
    return TestResult(False, outputs, ename, evalue)


@contextlib.contextmanager
def _working_folder(path: str | None):
    """Run a test cell with the kernel's working folder as this process's (a grading process
    runs one submission at a time, gradejob._LOCK, so the change is seen by nothing else)."""
    if not path:
        yield
        return
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def _stream(text: str) -> list:
    from nbformat import v4
    return [v4.new_output("stream", name="stdout", text=text)] if text else []
