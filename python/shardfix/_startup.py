"""Run at interpreter start-up by `shardfix.pth` (installed beside the package) when the SHARDFIX environment
variable is set: a script that never imports shardfix runs with the plugin as the variable asks
(`SHARDFIX=1 python train.py`). It never keeps the interpreter from starting: a failure is said on stderr."""

try:
    import shardfix  # noqa: F401  (importing it reads SHARDFIX and enables the plugin)
except Exception as error:  # noqa: BLE001  (start-up must go on whatever happens here)
    import sys

    print(f"shardfix: SHARDFIX is set, but the plugin could not be enabled: {type(error).__name__}: {error}",
          file=sys.stderr)
