"""`pip install ./clients/python` with no package index: the in-tree build backend needs
nothing from one. Installs into a fresh directory (pip --target: a virtual environment
costs ~20 s to make here) and imports the package from there, with its py.typed marker."""

import os
import subprocess
import sys
import tempfile
import unittest

import harness


class InstallTest(unittest.TestCase):
    def test_pip_install_offline(self):
        with tempfile.TemporaryDirectory() as d:
            site = os.path.join(d, "site")
            env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
            env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1")
            p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", site, harness.PYROOT], env=env, capture_output=True,
                               text=True)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            out = subprocess.run([sys.executable, "-c", "import airlock, os; d = os.path.dirname(airlock.__file__); "
                                  "print(airlock.__version__, os.path.exists(os.path.join(d, 'py.typed')), "
                                  "airlock.hash_input({'b': 1, 'a': 2}))"],
                                 cwd=d, env=dict(env, PYTHONPATH=site), capture_output=True, text=True, check=True)
            version, typed, h = out.stdout.split()
            self.assertTrue(os.path.isdir(os.path.join(site, "airlock-0.1.0.dist-info")))
            self.assertEqual(version, "0.1.0")
            self.assertEqual(typed, "True")
            self.assertEqual(h, "d3626ac30a87e6f7a6428233b3c68299976865fa5508e4267c5415c76af7a772")


if __name__ == "__main__":
    unittest.main()
