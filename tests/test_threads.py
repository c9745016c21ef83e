"""minidl.threads: the BLAS/OpenMP limit is applied and reported by threadpoolctl; dl.models is exposed."""
import os
import pathlib
import subprocess
import sys

import pytest
from threadpoolctl import threadpool_info, threadpool_limits

import minidl as dl
from minidl import threads


@pytest.fixture(autouse=True)
def restore_limits():
    with threadpool_limits(limits=None):         # whatever a test sets is undone after it
        yield


def blas_threads():
    return {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}


@pytest.mark.parametrize("n", [1, 2])
def test_set_threads_limits_the_blas_pool(n):
    assert threads.set_threads(n) == n
    assert blas_threads() == {n}
    assert set(threads.current_threads().values()) == {n}


def test_the_default_is_one_thread_unless_the_environment_says(monkeypatch):
    for k in threads._ENV:
        monkeypatch.delenv(k, raising=False)
    assert threads.set_threads() == threads.DEFAULT_THREADS == 1
    assert blas_threads() == {1}
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert threads.set_threads() == 2 and blas_threads() == {2}
    monkeypatch.setenv("OMP_NUM_THREADS", "0")     # not a count: the default
    assert threads.set_threads() == 1


def test_zero_threads_is_an_error():
    with pytest.raises(ValueError, match="positive"):
        threads.set_threads(0)


def test_import_minidl_exposes_models():
    assert dl.models.get("lenet", device="cpu").n_params == 61_706
    assert dl.set_threads is threads.set_threads


def test_import_minidl_leaves_the_pools_alone():
    # A library import must not change a process-wide setting; only the command lines apply the default.
    code = ("import numpy, threadpoolctl as t; n = lambda: [p['num_threads'] for p in t.threadpool_info()]; "
            "a = n(); import minidl; print(a == n())")
    env = {k: v for k, v in os.environ.items() if k not in threads._ENV}
    env["PYTHONPATH"] = str(pathlib.Path(__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stderr


def _run(code, **env_vars):
    """`code` in a fresh interpreter without the thread variables (but `env_vars`); its last line printed."""
    env = {k: v for k, v in os.environ.items() if k not in threads._ENV}
    env.update(env_vars, PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


MAKE = ("import minidl as dl, threadpoolctl as t; from minidl import threads; "
        "n = lambda: sorted(set(p['num_threads'] for p in t.threadpool_info())); BEFORE; "
        "dl.models.lenet5(device='cpu'); print(n(), threads._chosen)")


def test_a_cpu_device_made_in_python_takes_the_command_lines_default():
    # issue 39.2: the README's quick start ran a LeNet-5 step 15-20x slower than the command line
    assert _run(MAKE.replace("BEFORE", "pass")) == f"[{threads.DEFAULT_THREADS}] True"


def test_the_environment_still_decides():
    assert _run(MAKE.replace("BEFORE", "pass"), OMP_NUM_THREADS="2") == "[2] True"


def test_a_users_own_choice_is_left_alone():
    assert _run(MAKE.replace("BEFORE", "dl.set_threads(2)")) == "[2] True"
    # pools the user limited through threadpoolctl after the import: not touched
    limited = MAKE.replace("BEFORE", "limit = t.threadpool_limits(limits=max(n()) + 1)")
    assert _run(limited).endswith("False")
