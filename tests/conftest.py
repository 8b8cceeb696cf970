import os
import re
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


# Sweeps that repeat a check `make test` runs, over more cases: the same programs under more layouts, meshes and
# strategies, larger corpora and generated draws, the frameworks' whole setup matrices, the audits' kernel lists.
# `make test` leaves them out (-m "not exhaustive": under 15 minutes on a 2-core machine); `make test-exhaustive`
# runs them alone, `make test-oldest` runs everything, and CI (.ci/run) runs all three. Regular expressions
# searched in node ids.
EXHAUSTIVE = tuple(re.compile(pattern) for pattern in (
    # the user-programs and published kernels: every result compared under the defaults; here under each layout
    # asked for, and every decision under a layout asked for
    r"test_ring_user_programs\.py::test_results_equal_jax_jit\[.*-(zigzag|striped)\]",
    r"test_ring_user_programs\.py::test_decision_for_the_layout_asked",
    # programs the defaults may leave as written (proved, balanced): their results under the defaults; every layout
    # asked for is compared in the exhaustive run, and every decision under the defaults in the default one
    r"test_ring_user_programs\.py::test_results_equal_jax_jit\[.*-proved-.*-auto\]",
    # the second layout of the checks that run under both
    r"test_ring_(filled_buffers|hidden_dependences|twin_masks)\.py::.*-striped\]",
    r"test_ring_(stacked|travelling)_positions\.py::.*-striped\]",
    # the other mask spellings, kernels and merges of checks the default run makes on one or two of them
    r"test_ring_twin_masks\.py::.*\[(where-by-key|int8-sum|implied)-",
    r"test_ring_filled_buffers\.py::test_state_updated_in_place_rows_at_a_time_is_rewritten\[2-",
    r"test_ring_groups_apart\.py::.*\[before-a-refused-ring-grad\]",
    r"test_autodiff_ties\.py::test_a_plain_autodiff_online_softmax_is_rewritten_with_its_backward\[(grad-blockwise-"
    r"causal|blockwise-causal-guarded)\]",
    r"test_ring_lse_autodiff\.py::test_a_merge_differentiating_max_min_or_abs.*\[(max-log1p|nested)-",
    r"test_ring_lse_autodiff\.py::test_reordered_by_hand",
    r"test_hoist\.py::test_permutations_do_not_grow_with_layers\[striped-",
    r"test_ring_published\.py::test_results_equal_jax_jit\[liu-blockwise-auto-",
    r"test_ring_published\.py::test_results_equal_jax_jit\[.*-(zigzag|striped)\]",
    r"test_ring_published\.py::test_decision_for_a_forced_layout",
    r"test_ring_kernels\.py::test_forward_and_gradients_reordered_and_exact\[.*-(zigzag|striped)\]",
    # hypothesis's draws of ring bodies; the mutants of Shardy's corpus in MLIR's generic form, and all of the
    # others (the default run judges every fourth)
    r"test_ring_generated\.py::",
    r"test_mutants\.py::.*(generic|-all\])",
    # the audits' kernel lists (the plain-autodiff acceptance, its derivative rules and the stabiliser check keep
    # their own tests in the default run, the last on two of its kernels), and past audits (hoisting across layers
    # and custom_vjp backwards; layers alternating two orders; memoised and carried-over verdicts; loops that run
    # once and the per-op table; programs from outside the suite, forward and gradients; layers differing in one
    # detail)
    r"test_autodiff_accept_audit\.py::",
    r"test_autodiff_ties_audit2\.py::",
    r"test_autodiff_stabiliser_audit\.py::test_(where_the_gradient_follows|a_derivative_rule)",
    r"test_autodiff_stabiliser_audit\.py::test_where_the_check_passes.*\[(unrolled-same-order|chunks-same-order|"
    r"keyed-scale)\]",
    r"test_ring_audit(5|6|7|9|10|11)\.py::",
    r"test_ring_audit_region_keys\.py::test_layers_differing_in_one_detail",
    # the frameworks: the default run takes Flax NNX's data-and-model setup through the decorator, Flax's language
    # model on Explicit axes and a Linen training loop under the plugin on Explicit axes (test_plugin_flax); here the
    # other setups, Linen's and Equinox's, and the guides' eager flows under the plugin
    r"test_(linen|eqx)_training\.py::",
    r"test_nnx_training\.py::test_the_guides_eager_flow_under_the_plugin",
    r"test_nnx_training\.py::test_the_functional_form_through_the_decorator\[(?!data_model-auto)",
    r"test_flax_lm\.py::.*\[auto\]",
    r"test_plugin_flax\.py::test_training_loop_through_the_plugin\[auto\]",
    # mypy and pyright on a user's script (test_typing's other checks stay in the default run)
    r"test_typing\.py::test_mypy_and_pyright_check_a_users_script",
))


def pytest_configure(config):
    config.addinivalue_line("markers", "exhaustive: a sweep over more cases of a check the default run makes "
                                       "(tests/conftest.py: EXHAUSTIVE)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(pattern.search(item.nodeid) for pattern in EXHAUSTIVE):
            item.add_marker(pytest.mark.exhaustive)


@pytest.fixture(scope="session")
def ctx():
    from shardfix.ir import make_context
    return make_context()
