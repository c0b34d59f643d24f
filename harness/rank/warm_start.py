"""Warm start for CPU ranks: a rank forked from a process that has already imported torch.

A CPU-tier rank spends most of its launch importing: torch, its distributed and inductor
packages, datasets (``scripts/benchmark.py rank-import``). A *zygote* is a process started once
with a rank's environment (the boot folder first on its path, the device's shims installed by
the boot ``sitecustomize`` as in any rank) that imports those packages (``PRELOAD``) and then
forks a rank on request. torchrun is unchanged: it starts each worker as always
(``python -u -m torchtitan.train ...``), and that worker's boot ``sitecustomize`` calls
``hand_over`` before anything else. ``hand_over`` sends the worker's environment, command line,
working folder and standard streams to the zygote, which forks a child that takes them over, so
the rank runs in the forked child exactly as the worker would have, from its ``sitecustomize``
on. The worker waits for the child, passes on the signals torchrun sends it, and exits with the
child's status (or dies of the child's signal).

What may differ between a warm and a cold rank is only what the zygote imported before the
rank's own shims, plants and observers were installed. Hence:

- ``PRELOAD`` holds third-party packages only: never torchtitan or the harness, which the
  run-specific patches act on as they are imported (harness/upstream/install.py); the zygote
  checks this, and that it runs no second thread (a fork copies only the calling thread), and
  refuses to serve otherwise.
- The device's shims are installed in the zygote before it imports anything, as in a cold rank,
  so the device's patches of a preloaded package (transformers' flex attention on CPU) acted as
  it was imported.
- A run whose own shims or plants patch a module the zygote imported starts its ranks cold: the
  zygote lists what it imported (``MODULES_FILE``), the launcher compares
  (harness/launch/warm.py).
- ``refusal`` compares the rank's environment with the zygote's: every variable the zygote
  started with must be the rank's, and the rank may add only what torchrun and the harness set
  per run (``PER_RUN``); anything else (another thread count, another path) starts the rank
  cold, with the reason on its stderr.

Each rank writes one line to its stderr saying how it started (``STARTED_WARM`` or
``STARTED_COLD``); harness/launch/run.py counts them. Bit-for-bit equality of a warm and a
cold launch is a test (tests/e2e/test_training_state.py, tests/selftest/test_determinism.py).

This module runs in a worker before torch is imported: it imports the standard library only
(and the harness's variable names, harness/registry/environment.py, whose module does too).
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import struct
import sys
import threading
import time

from harness.registry import environment  # standard library only

STARTED_WARM = "harness: rank started warm, forked from zygote"
STARTED_COLD = "harness: rank started cold:"
IMPORTED_ENV = "zygote: its imports set"  # in its log, for the launcher (harness/launch/warm.py)
USED_CPU = "harness: the forked rank used CPU s:"  # its CPU is the zygote's, not the worker's

# Imported by the zygote before it forks a rank: third-party packages every CPU rank imports
# (their imports are most of a rank's start-up), nothing a run-specific patch acts on.
PRELOAD = (
    "torch",
    "torch.distributed.tensor",
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint",
    "torch.distributed.elastic.multiprocessing.errors",
    "torch._inductor.compile_fx",
    "torch.nn.attention.flex_attention",
    "safetensors.torch",
    "tokenizers",
    "huggingface_hub",
    "fsspec",
    "sympy",
    # torchtitan's trainer imports datasets (pyarrow's allocator thread is off in CPU ranks:
    # harness/device/devices.py ARROW_ENV); the transformers backend's model imports these.
    "datasets",
    "transformers",
    "transformers.models.qwen3.modeling_qwen3",
    # What torchtitan's trainer and models import beyond those (about 0.25 of a rank's 0.5 CPU s
    # of imports after the above; none is a module a shim or plant patches).
    "torch.utils.tensorboard",
    "torch.distributed.tensor.experimental._attention",
    "torch.distributed.pipelining",
    "torchdata.stateful_dataloader",
    "tyro",
    "boto3",
    "spmd_types",
)
# Packages the zygote must not have imported: the run-specific patches act on them as they are
# first imported (in the forked rank).
NEVER_PRELOADED = ("torchtitan", "harness.plants", "harness.rank.observers")
MODULES_FILE = "modules"  # beside its socket: the modules the zygote imported, one per line

# What torchrun sets in each worker (torch.distributed.elastic's agent), beyond what it inherits.
TORCHRUN_SET = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
})
# Prefixes of per-run variables, read only while the rank runs: torchrun's elastic state and
# the harness's own (shims, plants, observers, dumps; none is read by a preloaded package).
PER_RUN_PREFIXES = ("TORCHELASTIC_", environment.PREFIX)
# Per-run variables of the launcher's own, inherited: pytest names the test that launched.
PER_RUN_NAMES = frozenset({"PYTEST_CURRENT_TEST"})


def per_run(name: str) -> bool:
    """Whether ``name`` is a variable only the run reads (it may differ from the zygote's)."""
    return name in TORCHRUN_SET or name in PER_RUN_NAMES or name.startswith(PER_RUN_PREFIXES)

_HEADER = struct.Struct("!I")
# The signals a worker passes on to its rank (torchrun's, and a user's at the terminal). The
# zygote blocks them across a fork, and its child unblocks them once it has reset their
# handlers: one that arrives before (a worker forwards as soon as it has the rank's pid) waits
# for the rank's own handling instead of reaching the zygote's handler in the child.
FORWARDED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")


def refusal(zygote_env: dict[str, str], rank_env: dict[str, str],
            imported_env: dict[str, str] | None = None) -> str | None:
    """Why a rank with ``rank_env`` must not be forked from a zygote started with
    ``zygote_env`` whose imports then set ``imported_env``; None if it may."""
    imported_env = imported_env or {}
    for name, value in sorted(zygote_env.items()):
        if name in (environment.ZYGOTE, environment.SHIMS) or name in PER_RUN_NAMES:
            continue
        if rank_env.get(name) != value:
            return (f"{name} is {rank_env.get(name)!r} in the rank, {value!r} in the zygote")
    zygote_shims = environment.names(zygote_env.get(environment.SHIMS))
    rank_shims = environment.names(rank_env.get(environment.SHIMS))
    if rank_shims[:len(zygote_shims)] != zygote_shims:
        return (f"the rank's shims {rank_shims} do not begin with the zygote's {zygote_shims}, "
                "which it installed before its imports")
    for name in sorted(set(rank_env) - set(zygote_env)):
        if imported_env.get(name) == rank_env[name]:
            continue  # what the zygote's imports set themselves (torchrun's imports did too)
        if not per_run(name):
            return f"{name} is set in the rank and not in the zygote"
    return None


def _send(conn: socket.socket, message: dict, fds: list[int] = ()) -> None:
    data = json.dumps(message).encode()
    payload = _HEADER.pack(len(data)) + data
    if fds:
        socket.send_fds(conn, [payload], list(fds))
    else:
        conn.sendall(payload)


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    chunks = b""
    while len(chunks) < size:
        chunk = conn.recv(size - len(chunks))
        if not chunk:
            raise EOFError("connection closed")
        chunks += chunk
    return chunks


def _recv(conn: socket.socket, max_fds: int = 0) -> tuple[dict, list[int]]:
    fds: list[int] = []
    if max_fds:
        head, fds, _, _ = socket.recv_fds(conn, _HEADER.size, max_fds)
        if len(head) < _HEADER.size:
            head += _recv_exact(conn, _HEADER.size - len(head))
    else:
        head = _recv_exact(conn, _HEADER.size)
    (size,) = _HEADER.unpack(head)
    return json.loads(_recv_exact(conn, size)), fds


def _module_command() -> tuple[str, list[str]] | None:
    """(module, its arguments) of ``python [-u] -m module args...``; None for anything else."""
    argv = list(getattr(sys, "orig_argv", ()))
    for i, arg in enumerate(argv[1:], start=1):
        if arg == "-m" and i + 1 < len(argv):
            return argv[i + 1], argv[i + 2:]
        if not arg.startswith("-"):
            return None
    return None


# ------------------------------------------------------------------------ the worker's side


def hand_over(socket_path: str) -> None:
    """In a torchrun worker, first thing: have the zygote fork this rank, wait for it, and exit
    as it exits. Returns only where the rank must start cold (it says why on stderr)."""
    command = _module_command()
    if command is None:
        print(f"{STARTED_COLD} not started as python -m <module>", file=sys.stderr, flush=True)
        return
    module, args = command
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(socket_path)
        _send(conn, {"env": dict(os.environ), "cwd": os.getcwd(), "module": module, "args": args},
              fds=[0, 1, 2])
        reply, _ = _recv(conn)
    except (OSError, EOFError) as error:
        print(f"{STARTED_COLD} zygote at {socket_path} unreachable ({error})",
              file=sys.stderr, flush=True)
        conn.close()
        return
    if "refused" in reply:
        print(f"{STARTED_COLD} {reply['refused']}", file=sys.stderr, flush=True)
        conn.close()
        return
    child = reply["pid"]

    def forward(signum, _frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for name in FORWARDED:
        signal.signal(getattr(signal, name), forward)
    try:
        status, _ = _recv(conn)
    except (OSError, EOFError):
        status = {"signal": int(signal.SIGKILL)}  # the zygote is gone, and its ranks with it
    if "cpu_s" in status:
        print(f"{USED_CPU} {status['cpu_s']:.2f}", file=sys.stderr, flush=True)
    if status.get("signal"):
        signal.signal(status["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), status["signal"])
    os._exit(status.get("code", 1))


# ------------------------------------------------------------------------ the zygote's side


def _run_rank(request: dict, fds: list[int], imported_env: dict[str, str]) -> int:
    """In the forked child: become the worker that asked, then run its module as ``-m`` does.
    ``imported_env``: what the preload's imports set in the environment, which a cold rank's
    imports set in its own as well (inductor's cache folder, where it was unset)."""
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    for name, value in imported_env.items():
        os.environ.setdefault(name, value)
    os.chdir(request["cwd"])
    sys.path[0] = request["cwd"]  # what -m puts first (the zygote's own -m put its folder)
    sys.argv = [sys.argv[0], *request["args"]]
    for name in (*FORWARDED, "SIGCHLD"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [getattr(signal, n) for n in FORWARDED])
    print(f"{STARTED_WARM} {os.getppid()}", file=sys.stderr, flush=True)

    import sitecustomize  # noqa: PLC0415  cycle: sitecustomize imports this module (the hand-over); the boot folder's, which installed the device's shims in the zygote

    code = 0
    try:
        sitecustomize.install_harness()  # what this run adds: shims, plants, observers
        runpy._run_module_as_main(request["module"], alter_argv=True)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if stop.code is not None and not isinstance(stop.code, int):
            print(stop.code, file=sys.stderr)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1

    threading._shutdown()  # as the interpreter's finalisation: non-daemon threads, then atexit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    return code


def _preload() -> str | None:
    """Import ``PRELOAD`` (garbage collection off, then frozen, as a pre-fork server does);
    why the zygote cannot serve, or None."""
    gc.disable()
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
    gc.freeze()
    gc.enable()
    early = sorted(m for m in sys.modules
                   if m in NEVER_PRELOADED or m.startswith(tuple(p + "." for p in NEVER_PRELOADED)))
    if early:
        return f"the preload imported {early[:5]}, which run-specific patches act on"
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else threading.active_count()
    if threads != 1:
        return f"the preload left {threads} threads running: a fork would copy only one"
    return None


def serve(socket_path: str) -> None:
    """The zygote: preload, then fork a rank per request until the launcher that started it
    is gone or sends SIGTERM; every rank it forked dies with it."""
    launcher = os.getppid()
    zygote_env = dict(os.environ)  # as started: what a rank's environment is compared with
    problem = _preload()
    with open(os.path.join(os.path.dirname(socket_path), MODULES_FILE), "w") as listing:
        listing.write("\n".join(sorted(sys.modules)))
    imported_env = {k: v for k, v in os.environ.items() if zygote_env.get(k) != v}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    children: dict[int, socket.socket] = {}  # pid -> the worker's connection
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    print(f"{IMPORTED_ENV} {json.dumps(imported_env)}", flush=True)
    print(f"zygote {os.getpid()} serving at {socket_path}"
          + (f"; refusing every rank: {problem}" if problem else ""), flush=True)

    def end(pid: int, status: dict) -> None:
        conn = children.pop(pid, None)
        if conn is None:
            return
        try:
            _send(conn, status)
        except OSError:
            pass
        selector.unregister(conn)
        conn.close()

    while not stopping and os.getppid() == launcher:
        for key, _ in selector.select(timeout=0.05):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                try:
                    request, fds = _recv(conn, max_fds=3)
                except (OSError, EOFError, ValueError):
                    conn.close()
                    continue
                reason = problem or refusal(zygote_env, request["env"], imported_env)
                if reason:
                    _send(conn, {"refused": reason})
                    conn.close()
                    for fd in fds:
                        os.close(fd)
                    continue
                forwarded = [getattr(signal, n) for n in FORWARDED]
                signal.pthread_sigmask(signal.SIG_BLOCK, forwarded)
                pid = os.fork()
                if pid != 0:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, forwarded)
                if pid == 0:
                    code = 1
                    try:
                        os.setsid()
                        selector.close()
                        listener.close()
                        for other in children.values():
                            other.close()
                        conn.close()
                        code = _run_rank(request, fds, imported_env)
                    finally:
                        os._exit(code)
                for fd in fds:
                    os.close(fd)
                children[pid] = conn
                selector.register(conn, selectors.EVENT_READ, pid)
                try:
                    _send(conn, {"pid": pid})
                except OSError:  # the worker is gone already: its rank goes with it
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            else:  # a worker's connection: readable only when it is gone (killed)
                pid = key.data
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        while children:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            cpu_s = round(usage.ru_utime + usage.ru_stime, 2)
            if os.WIFSIGNALED(status):
                end(pid, {"signal": os.WTERMSIG(status), "cpu_s": cpu_s})
            else:
                end(pid, {"code": os.waitstatus_to_exitcode(status), "cpu_s": cpu_s})
    for pid in list(children):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while children and time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        children.pop(pid, None)
    listener.close()
    try:
        os.unlink(socket_path)
    except FileNotFoundError:
        pass


if __name__ == "__main__":
    serve(sys.argv[1])
