"""Which CPUs a vLLM engine's model threads are bound to (vLLM's own default keeps one core for its polling
scheduler, which on a 2-core host halves generation)."""

from __future__ import annotations

from rl_engine.backends.vllm_rollout import cpu_thread_binding


def test_one_engine_binds_its_threads_to_the_first_cpus_and_reserves_none():
    assert cpu_thread_binding(0, cpus=[0, 1], threads=2) == {
        "VLLM_CPU_OMP_THREADS_BIND": "0,1",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    }


def test_engines_on_one_host_take_consecutive_slices_of_the_allowed_cpus():
    cpus = [2, 3, 4, 5, 6, 7]
    assert cpu_thread_binding(0, cpus=cpus, threads=2)["VLLM_CPU_OMP_THREADS_BIND"] == "2,3"
    assert cpu_thread_binding(1, cpus=cpus, threads=2)["VLLM_CPU_OMP_THREADS_BIND"] == "4,5"
    assert cpu_thread_binding(2, cpus=cpus, threads=2)["VLLM_CPU_OMP_THREADS_BIND"] == "6,7"


def test_more_engines_than_slices_wrap_around_the_allowed_cpus():
    assert cpu_thread_binding(1, cpus=[0, 1, 2], threads=2)["VLLM_CPU_OMP_THREADS_BIND"] == "0,2"
    assert cpu_thread_binding(3, cpus=[0, 1], threads=1)["VLLM_CPU_OMP_THREADS_BIND"] == "1"


def test_threads_default_to_omp_num_threads_and_are_capped_by_the_allowed_cpus(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert cpu_thread_binding(0, cpus=[4, 5])["VLLM_CPU_OMP_THREADS_BIND"] == "4"
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert cpu_thread_binding(0, cpus=[4, 5])["VLLM_CPU_OMP_THREADS_BIND"] == "4,5"
    assert cpu_thread_binding(0, cpus=[4, 5], threads=8)["VLLM_CPU_OMP_THREADS_BIND"] == "4,5"
