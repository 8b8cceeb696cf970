# lit configuration: %opt runs tools/opt in the project's environment on 8 simulated CPU devices; with
# `--param installed=1` it runs the installed `shardfix-opt` of that environment against the installed package.
import os
import sys

import lit.formats

config.name = "shardfix"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir"]
config.excludes = ["Inputs"]
config.test_source_root = os.path.dirname(os.path.abspath(__file__))
config.test_exec_root = os.path.join(config.test_source_root, "Output")

root = os.path.dirname(os.path.dirname(config.test_source_root))
venv_bin = os.path.join(root, lit_config.params.get("venv", ".venv"), "bin")
python = os.path.join(venv_bin, "python") if os.path.exists(os.path.join(venv_bin, "python")) else sys.executable

installed = lit_config.params.get("installed", "0") not in ("", "0")
if installed:
    config.substitutions.append(("%opt", os.path.join(venv_bin, "shardfix-opt")))
else:
    config.substitutions.append(("%opt", f"{python} {os.path.join(root, 'tools', 'opt')}"))
config.substitutions.append(("%python", python))
# The Python port of FileCheck installs itself as `filecheck`.
config.substitutions.append((r"\bFileCheck\b", "filecheck"))

# lit scrubs the environment: give the tests what they need explicitly.
config.environment["PATH"] = os.pathsep.join([venv_bin, os.environ.get("PATH", "")])
if not installed:
    config.environment["PYTHONPATH"] = os.path.join(root, "python")
config.environment["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
config.environment["JAX_PLATFORMS"] = "cpu"
config.environment["TF_CPP_MIN_LOG_LEVEL"] = "3"
