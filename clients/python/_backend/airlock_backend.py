"""A PEP 517 build backend for the airlock package, standard library only.

pip builds a package in an isolated environment and installs the backend's requirements
into it from a package index; setuptools would need one. This backend needs nothing, so
`pip install ./clients/python` works on a machine without network access. It builds a
pure-Python wheel of the airlock/ directory (and an sdist of this directory), nothing more.
"""

import base64
import hashlib
import io
import os
import tarfile
import zipfile

NAME = "airlock"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _version():
    with open(os.path.join(HERE, "pyproject.toml"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("version = "):
                return line.split("=", 1)[1].strip().strip('"')
    raise RuntimeError("pyproject.toml has no version")


def _metadata(version):
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    return ("Metadata-Version: 2.1\n"
            f"Name: {NAME}\n"
            f"Version: {version}\n"
            "Summary: Client of airlock's HTTP API for agents: claims, leases, the work ledger, effects, approvals\n"
            "Requires-Python: >=3.9\n"
            "License: Apache-2.0\n"
            "Description-Content-Type: text/markdown\n"
            "\n" + readme)


def _package_files():
    root = os.path.join(HERE, NAME)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for fn in sorted(filenames):
            if fn.endswith((".py", ".typed")):
                full = os.path.join(dirpath, fn)
                out.append((os.path.relpath(full, HERE).replace(os.sep, "/"), full))
    return out


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory, files):
    version = _version()
    dist_info = f"{NAME}-{version}.dist-info"
    name = f"{NAME}-{version}-py3-none-any.whl"
    entries = list(files)
    entries.append((f"{dist_info}/METADATA", _metadata(version).encode("utf-8")))
    entries.append((f"{dist_info}/WHEEL", ("Wheel-Version: 1.0\nGenerator: airlock_backend\n"
                                           "Root-Is-Purelib: true\nTag: py3-none-any\n").encode()))
    record = [_record_line(a, d) for a, d in entries] + [f"{dist_info}/RECORD,,"]
    entries.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode()))
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arcname, data in entries:
            info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return name


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, [(a, _read(p)) for a, p in _package_files()])


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # A .pth file puts this directory on sys.path: edits take effect without reinstalling.
    return _write_wheel(wheel_directory, [(f"{NAME}_editable.pth", (HERE + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    version = _version()
    base = f"{NAME}-{version}"
    name = base + ".tar.gz"
    members = [("pyproject.toml", os.path.join(HERE, "pyproject.toml")),
               ("README.md", os.path.join(HERE, "README.md")),
               ("_backend/airlock_backend.py", os.path.abspath(__file__))] + _package_files()
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for arcname, path in members:
            data = _read(path)
            info = tarfile.TarInfo(f"{base}/{arcname}")
            info.size = len(data)
            info.mode = 0o644
            t.addfile(info, io.BytesIO(data))
        pkg = f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {version}\n".encode()
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(pkg)
        info.mode = 0o644
        t.addfile(info, io.BytesIO(pkg))
    return name
