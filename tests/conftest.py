import os

# Eight simulated CPU devices, set before JAX is first imported.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def ctx():
    from shardfix.ir import make_context
    return make_context()
