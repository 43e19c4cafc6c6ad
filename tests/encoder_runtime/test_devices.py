"""Device and provider selection: the logic CI can check without a GPU."""

from encoder_runtime import devices
from encoder_runtime.backends.factory import resolve_backend_name


def test_auto_takes_cuda_when_available_and_cpu_otherwise():
    assert devices.choose_device("auto", cuda_available=True) == devices.DeviceChoice("cuda")
    assert devices.choose_device("auto", cuda_available=False) == devices.DeviceChoice("cpu")
    assert devices.choose_device("cpu", cuda_available=True) == devices.DeviceChoice("cpu")


def test_cuda_requested_but_unusable_falls_back_to_cpu_with_a_warning():
    choice = devices.choose_device("cuda", cuda_available=False)
    assert choice.device == "cpu" and "not usable" in choice.warning


def test_onnx_providers_prefer_cuda_only_when_present():
    cuda, cpu = devices.CUDA_PROVIDER, devices.CPU_PROVIDER
    assert devices.choose_onnx_providers("cuda", [cuda, cpu]) == ([cuda, cpu], None)
    providers, warning = devices.choose_onnx_providers("cuda", [cpu])
    assert providers == [cpu] and "no CUDA provider" in warning
    assert devices.choose_onnx_providers("cpu", [cuda, cpu]) == ([cpu], None)


def test_silent_onnxruntime_gpu_fallback_is_detected():
    cuda, cpu = devices.CUDA_PROVIDER, devices.CPU_PROVIDER
    assert "CUDA provider" in devices.check_active_providers([cuda, cpu], [cpu])
    assert devices.check_active_providers([cuda, cpu], [cuda, cpu]) is None


def test_auto_backend_is_fastest_that_keeps_quality():
    assert resolve_backend_name("auto", "embed", "cpu", has_onnxruntime=True) == "onnx-int8"
    assert resolve_backend_name("auto", "embed", "cuda", has_onnxruntime=True) == "torch"
    assert resolve_backend_name("auto", "fill-mask", "cpu", has_onnxruntime=True) == "torch"
    assert resolve_backend_name("auto", "embed", "cpu", has_onnxruntime=False) == "torch"
    assert resolve_backend_name("onnx", "embed", "cpu", has_onnxruntime=True) == "onnx"


def test_explicit_onnx_without_onnxruntime_is_a_clear_error():
    import pytest

    with pytest.raises(RuntimeError, match="needs onnxruntime"):
        resolve_backend_name("onnx-int8", "embed", "cpu", has_onnxruntime=False)


def test_the_gpu_pass_layout_can_run_on_a_cpu(monkeypatch):
    """``CLOZE_TORCH_PASSES=cuda`` gives a CPU the GPU's layout (one pass at a time on torch's threads), so the
    service's path to a GPU pass can be profiled without a GPU; anything else is refused by name."""
    import pytest
    import torch

    from encoder_runtime.backends.torch_backend import LAYOUT_VARIABLE, layout_kind, pass_layout

    cpu = torch.device("cpu")
    monkeypatch.delenv(LAYOUT_VARIABLE, raising=False)
    assert layout_kind(cpu) == "cpu"
    assert pass_layout("cpu", threads=3).parallel_passes == 3
    monkeypatch.setenv(LAYOUT_VARIABLE, "cuda")
    assert layout_kind(cpu) == "cuda"
    gpu = pass_layout("cuda", threads=3)
    assert (gpu.parallel_passes, gpu.threads_per_pass) == (1, None)
    monkeypatch.setenv(LAYOUT_VARIABLE, "tpu")
    assert (gpu.batch_size, gpu.padding_tokens) == (1024, 4096)  # a GPU pass takes what its budget holds
    with pytest.raises(ValueError, match=LAYOUT_VARIABLE):
        layout_kind(cpu)


def test_pinned_non_blocking_copies_are_chosen_only_for_a_usable_gpu(monkeypatch):
    import torch

    from encoder_runtime.backends.torch_backend import pinned_copies

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pinned_copies(torch.device("cuda")) and not pinned_copies(torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not pinned_copies(torch.device("cuda"))


def test_pooling_on_the_device_equals_the_hosts():
    import numpy as np
    import torch

    from encoder_runtime.backends.torch_backend import pool_states
    from encoder_runtime.encoder import pool

    rng = np.random.default_rng(0)
    states = rng.normal(size=(3, 5, 4)).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    for mode in ("mean", "cls", "max"):
        on_device = pool_states(torch.from_numpy(states), torch.from_numpy(mask), mode).numpy()
        np.testing.assert_allclose(on_device, pool(states, mask, mode), rtol=1e-6, atol=1e-6)
