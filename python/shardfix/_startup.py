"""SHARDFIX and warning filters for a process that never imports shardfix itself.

`shardfix.pth` (installed beside the package) imports this module at interpreter start-up only when the SHARDFIX
environment variable is set or a warnings option names shardfix; `import shardfix` runs `install()` too. Both are
cheap: nothing here imports JAX, MLIR or the rest of shardfix.

- SHARDFIX: the plugin is switched on when JAX is first imported (a finder on `sys.meta_path` watches for the
  top-level `jax` module, and enables the plugin once JAX's own `__init__` has run). A process that never imports
  JAX (`pip`, a shell helper) pays for one `os.environ` lookup and this module; one that already has JAX gets the
  plugin at once. A value that doesn't parse is said in a RuntimeWarning attributed to the user's line that
  imported JAX, and the plugin stays off; start-up and JAX's import never fail because of shardfix.
- `-W ...::shardfix.ShardingFixWarning` / PYTHONWARNINGS: Python handles these before `site` has put
  site-packages on `sys.path`, so `shardfix` can't be imported then (nor any installed package: Python says
  "Invalid -W option ignored: invalid module name"); once it can, the options that name shardfix's categories are
  applied again here, in order, so that they filter as the user asked.
"""

from __future__ import annotations

import os
import sys

ENV_VAR = "SHARDFIX"
_OFF = ("", "0", "false", "off", "no")


class _EnableWhenJaxIsImported:
    """A meta-path finder that finds nothing itself: when `jax` is about to be imported, it asks the other finders
    for JAX's spec and wraps the loader so that the plugin is enabled right after JAX's module has run."""

    def find_spec(self, name, path=None, target=None):
        if name != "jax":
            return None
        _uninstall()
        from importlib.util import find_spec

        spec = find_spec("jax")  # the other finders (this one is gone)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _EnablingLoader(spec.loader)
        return spec


class _EnablingLoader:
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = module.__spec__.loader = self._loader  # JAX sees its own loader
        self._loader.exec_module(module)
        enable_from_environment()  # JAX's package has run: it can be hooked now

    def __getattr__(self, name):  # get_resource_reader, is_package, ...: the real loader's
        return getattr(self._loader, name)


_FINDER = _EnableWhenJaxIsImported()


def _uninstall() -> None:
    try:
        sys.meta_path.remove(_FINDER)
    except ValueError:
        pass


def install() -> None:
    """Arrange for the plugin as SHARDFIX asks (now if JAX is already imported, else when it is) and apply the
    warnings options that name shardfix."""
    _apply_warning_options()
    if os.environ.get(ENV_VAR, "").strip().lower() in _OFF:
        return
    if "jax" in sys.modules:
        enable_from_environment()
    elif _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def enable_from_environment() -> None:
    """Enable the plugin as SHARDFIX says; never raises (start-up and JAX's import must go on)."""
    try:
        from shardfix.jit.plugin import enable_from_environment as enable

        enable(on_error="warn")
    except Exception as error:  # noqa: BLE001  (said on stderr; the program runs without the plugin)
        print(f"shardfix: SHARDFIX is set, but the plugin could not be enabled: {type(error).__name__}: {error}",
              file=sys.stderr)


def _apply_warning_options() -> None:
    """Apply again the options from the first one that names shardfix on, in order: the later options keep
    precedence over the earlier ones, as Python gives it (an option applied again replaces its filter)."""
    first = next((i for i, option in enumerate(sys.warnoptions) if "shardfix" in option), None)
    if first is None:
        return
    import warnings

    for option in sys.warnoptions[first:]:
        try:
            warnings._setoption(option)  # the parser behind -W and PYTHONWARNINGS
        except Exception as error:  # noqa: BLE001  (Python said so already for the others)
            if "shardfix" in option:
                print(f"Invalid -W option ignored: {error}", file=sys.stderr)


try:
    install()
except Exception as error:  # noqa: BLE001  (start-up must go on whatever happens here)
    print(f"shardfix: SHARDFIX or a warnings option names shardfix, but shardfix could not act on it: "
          f"{type(error).__name__}: {error}", file=sys.stderr)
