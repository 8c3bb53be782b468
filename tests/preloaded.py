"""Run scripts as processes of their own without paying for ``import torch`` in each.

Importing torch (and ``torch._dynamo``, which an optimizer's first step imports) costs an
interpreter seconds of CPU, and the tests of scripts/ and of a script's exit start a dozen
of them. ``Preloaded`` starts one interpreter that imports what those scripts import, then
forks it for every run: the child takes the run's arguments, folder, environment and output
files, runs the script as ``__main__`` (``runpy``) and ends as any interpreter does, atexit
handlers and threads included, its exit status the script's. Nothing is imported into the
test process, and a script sees what ``python script.py`` gives it, its imports already
loaded. The runs of one request run at once (the ranks of a torchrun).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["Preloaded"]

_SERVER = r"""
import json, os, runpy, select, signal, sys, time
import numpy, PIL.Image, torch, torch._dynamo, torch.distributed, torch.nn  # noqa: F401
import imgpack.reader.loader, imgpack.reader.transform  # noqa: F401


def serve():
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        children = {}
        for run in request["runs"]:
            pid = os.fork()
            if pid == 0:
                return run
            children[pid] = os.pidfd_open(pid)
        deadline = time.monotonic() + request["timeout"]
        poll = select.poll()
        for fd in children.values():
            poll.register(fd, select.POLLIN)
        waiting = set(children)
        while waiting and (left := deadline - time.monotonic()) > 0:
            for fd, _ in poll.poll(left * 1000):
                pid = next(p for p, f in children.items() if f == fd)
                waiting.discard(pid)
                poll.unregister(fd)
        for pid in waiting:  # past the deadline
            os.kill(pid, signal.SIGKILL)
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
        for fd in children.values():
            os.close(fd)
        print(json.dumps({"codes": codes, "timed_out": bool(waiting)}), flush=True)
    sys.exit(0)


run = serve()
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
for fd, name in ((1, "stdout"), (2, "stderr")):
    os.dup2(os.open(run[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
os.chdir(run["cwd"])
os.environ.clear()
os.environ.update(run["env"])
sys.argv = list(run["argv"])
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


class Preloaded:
    """The preloading interpreter, started with ``env``; ``run`` forks it; ``close`` it.
    Where there is no ``os.fork``/``os.pidfd_open`` (not Linux), each run is an
    interpreter of its own."""

    def __init__(self, env: dict[str, str]) -> None:
        self._proc = None
        if hasattr(os, "pidfd_open") and hasattr(os, "fork"):
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _SERVER], env=env, text=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            )  # fmt: skip
            assert self._proc.stdout.readline() == "ready\n", "the preloading interpreter failed"

    def run(self, *runs: tuple[list, Path, dict], timeout: float) -> list[tuple[int, str, str]]:
        """Each of ``runs`` (argv: the script and its arguments, cwd, env) at once; (exit
        status, stdout, stderr) of each."""
        if self._proc is None:
            procs = [
                subprocess.Popen([sys.executable, *map(str, argv)], cwd=cwd, env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                for argv, cwd, env in runs
            ]  # fmt: skip
            outputs = [p.communicate(timeout=timeout) for p in procs]
            return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs)]
        with tempfile.TemporaryDirectory() as tmp:
            files = [(Path(tmp) / f"{k}.out", Path(tmp) / f"{k}.err") for k in range(len(runs))]
            request = {
                "timeout": timeout,
                "runs": [
                    {"argv": [str(a) for a in argv], "cwd": str(cwd), "env": env,
                     "stdout": str(out), "stderr": str(err)}
                    for (argv, cwd, env), (out, err) in zip(runs, files)
                ],
            }  # fmt: skip
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
            answer = json.loads(self._proc.stdout.readline())
            assert not answer["timed_out"], f"still running after {timeout} s: {runs}"
            return [
                (code, out.read_text(), err.read_text())
                for code, (out, err) in zip(answer["codes"], files)
            ]

    def close(self) -> None:
        if self._proc is not None:
            self._proc.stdin.close()
            self._proc.wait(timeout=60)
