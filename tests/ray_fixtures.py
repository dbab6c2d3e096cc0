import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent



@pytest.fixture(scope="session")
def toy_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("toy")
    os.environ["TOY_DIR"] = str(d)  # before Ray starts, so workers inherit it
    return d


@pytest.fixture(scope="session")
def ray_local(toy_dir):
    """One local Ray for the whole test session (starting Ray costs seconds)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": f"{TESTS}:{ROOT}", "TOY_DIR": str(toy_dir)}})
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def models_cache() -> Path:
    """Packaged models are extracted / converted once into the repo's cache (like the default run)."""
    d = ROOT / ".cache" / "models"
    d.mkdir(parents=True, exist_ok=True)
    return d
