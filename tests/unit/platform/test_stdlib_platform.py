"""platform/ is a source folder: it must never shadow the standard library's `platform` module."""

import platform
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()


def _run(*args: str) -> str:
    result = subprocess.run(args, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def test_platform_is_the_standard_library_module_under_pytest():
    assert Path(platform.__file__).resolve().parent == STDLIB
    assert platform.python_version() == ".".join(map(str, sys.version_info[:3]))


def test_there_is_no_platform_package_to_shadow_it():
    assert not (REPO_ROOT / "platform" / "__init__.py").exists()


def test_manage_py_keeps_the_standard_platform_module():
    out = _run(
        sys.executable,
        "manage.py",
        "shell",
        "-c",
        "import platform; print(platform.__file__, platform.python_version())",
    )
    path, version = out.split()
    assert Path(path).resolve().parent == STDLIB
    assert version == platform.python_version()


def test_asgi_entry_point_keeps_the_standard_platform_module():
    # Exactly how uvicorn loads it: `uvicorn --app-dir platform posttrain.asgi:application`.
    code = (
        "import sys; sys.path.insert(0, 'platform'); import posttrain.asgi; import platform; "
        "print(platform.__file__, platform.python_version())"
    )
    path, version = _run(sys.executable, "-c", code).split()
    assert Path(path).resolve().parent == STDLIB
    assert version == platform.python_version()


def test_celery_app_keeps_the_standard_platform_module():
    code = (
        "from workers.celery_app import app; app.loader.import_default_modules(); import platform; "
        "print(platform.__file__, platform.python_version())"
    )
    path, version = _run(sys.executable, "-c", code).split()
    assert Path(path).resolve().parent == STDLIB
