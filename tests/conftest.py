import os

import pytest
import torch

import llmkernels  # noqa: F401  (sets up the Triton interpreter on CPU-only machines before kernels load)

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    return torch.device("cuda" if HAS_CUDA else "cpu")


@pytest.fixture(autouse=True)
def _fresh_seed():
    # fresh random inputs on every run; the seed is printed on failure for reproduction
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    print(f"torch.manual_seed({seed})")  # pytest shows captured output of failing tests
    yield seed
