import os
import tempfile

# Eight simulated CPU devices, set before JAX is first imported.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# ejkernel turns on JAX's persistent compilation cache at import, in ~/.cache unless told otherwise: keep it out of
# the user's home and out of the way of other test runs.
os.environ.setdefault("COMPILE_FUNC_DIR", tempfile.mkdtemp(prefix="shardfix-ejkernel-cache-"))

import jax  # noqa: E402
import pytest  # noqa: E402


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3] if part.isdigit())


# Clients pinned to an older JAX (ejkernel needs jax~=0.10) are tested on that JAX only (make test-oldest), where
# they must be installed: on JAX 0.10 their tests are collected and an import failure fails loudly.
collect_ignore_glob = [] if _version(jax.__version__) < (0, 11) else ["clients/test_ejkernel*.py"]


@pytest.fixture(scope="session")
def ctx():
    from shardfix.ir import make_context
    return make_context()
