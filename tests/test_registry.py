"""adapters.registry: manifests, containment, sizes, digests and the digest cache."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import blake3
import pytest
from support import FAKE_GGUF

from infervisor.adapters.digest import digest_tree
from infervisor.adapters.errors import AdmissionRefused, RegistryError
from infervisor.adapters.planning import plan
from infervisor.adapters.ports import free_port
from infervisor.adapters.registry import (
    ModelEntry,
    ModelFormat,
    ModelRegistry,
    ResolvedModel,
    check_format,
)
from infervisor.adapters.server import AdapterSettings
from infervisor.adapters.spec import Flavor, InstanceSpec

WEIGHTS = FAKE_GGUF + bytes(range(256)) * 40


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny.gguf").write_bytes(WEIGHTS)
    return tmp_path


@pytest.fixture
def reg(root: Path) -> ModelRegistry:
    return ModelRegistry(root)


def write_manifest(root: Path, name: str, **fields: object) -> None:
    body = {"name": name, "format": "gguf", "path": "models/tiny.gguf"} | fields
    lines = [f"{k} = {v!r}" if isinstance(v, int) else f'{k} = "{v}"' for k, v in body.items()]
    (root / f"{name}.toml").write_text("\n".join(lines) + "\n")


def test_adopt_then_resolve(reg: ModelRegistry, root: Path) -> None:
    entry = reg.adopt("tiny", root / "models" / "tiny.gguf")
    assert entry == ModelEntry(
        name="tiny",
        format=ModelFormat.GGUF,
        path="models/tiny.gguf",
        size_bytes=len(WEIGHTS),
        blake3=blake3.blake3(WEIGHTS).hexdigest(),
    )
    assert tomllib.loads((root / "tiny.toml").read_text())["blake3"] == entry.blake3
    resolved = reg.resolve("tiny")
    assert resolved == ResolvedModel(entry, (root / "models" / "tiny.gguf").resolve())
    assert reg.names() == ["tiny"]


def test_adopt_refuses_outside_root_existing_and_non_gguf(
    reg: ModelRegistry, root: Path, tmp_path_factory
) -> None:
    outside = tmp_path_factory.mktemp("elsewhere") / "x.gguf"
    outside.write_bytes(WEIGHTS)
    with pytest.raises(RegistryError, match="outside the registry root"):
        reg.adopt("x", outside)
    reg.adopt("tiny", root / "models" / "tiny.gguf")
    with pytest.raises(RegistryError, match="already adopted"):
        reg.adopt("tiny", root / "models" / "tiny.gguf")
    (root / "models" / "fake.gguf").write_bytes(b"not gguf")
    with pytest.raises(RegistryError, match="not a GGUF file"):
        reg.adopt("fake", root / "models" / "fake.gguf")
    with pytest.raises(RegistryError, match="draft model 'nope'"):
        reg.adopt("y", root / "models" / "tiny.gguf", draft="nope")
    with pytest.raises(RegistryError, match="plain token"):
        reg.adopt("../evil", root / "models" / "tiny.gguf")


def test_unknown_model_lists_known_names(reg: ModelRegistry, root: Path) -> None:
    with pytest.raises(RegistryError, match="none: adopt one first"):
        reg.resolve("tiny")
    reg.adopt("tiny", root / "models" / "tiny.gguf")
    with pytest.raises(
        RegistryError, match=r"^model big: not in the registry; registered models: tiny$"
    ):
        reg.resolve("big")


@pytest.mark.parametrize("draft", [False, True])
def test_placing_an_unknown_model_names_it_once_with_the_registered_ones(
    reg: ModelRegistry, root: Path, draft: bool
) -> None:
    """Stop 35's trial: "model nosuch: unknown model 'nosuch'; known models: tiny"
    named the model twice (fails before: the planner put its own prefix on the
    registry's message)."""
    reg.adopt("tiny", root / "models" / "tiny.gguf")
    models = {"model": "tiny", "draft_model": "nosuch"} if draft else {"model": "nosuch"}
    spec = InstanceSpec(role="x", flavor=Flavor.LLAMACPP, port=free_port(), **models)
    settings = AdapterSettings(data_root=str(root))
    with pytest.raises(RegistryError) as refused:
        plan(spec, "x-1", reg, settings)
    what = "draft model" if draft else "model"
    assert str(refused.value) == f"{what} nosuch: not in the registry; registered models: tiny"


def test_unknown_manifest_key_is_named(reg: ModelRegistry, root: Path) -> None:
    write_manifest(root, "tiny", size_bytes=len(WEIGHTS), blake3="0" * 64, quantization="q4")
    with pytest.raises(RegistryError, match="unknown key 'quantization'"):
        reg.resolve("tiny")


def test_digest_mismatch_gives_expected_and_found(reg: ModelRegistry, root: Path) -> None:
    write_manifest(root, "tiny", size_bytes=len(WEIGHTS), blake3="0" * 64)
    found = blake3.blake3(WEIGHTS).hexdigest()
    with pytest.raises(RegistryError, match=f"expected digest {'0' * 64}, found {found}"):
        reg.resolve("tiny")


def test_size_mismatch(reg: ModelRegistry, root: Path) -> None:
    write_manifest(root, "tiny", size_bytes=5, blake3="0" * 64)
    with pytest.raises(RegistryError, match="manifest says 5 bytes"):
        reg.resolve("tiny")


@pytest.mark.parametrize("path", ["/etc/passwd", "../outside.gguf", "models/../../outside.gguf"])
def test_path_escape_is_refused(reg: ModelRegistry, root: Path, path: str) -> None:
    write_manifest(root, "tiny", path=path, size_bytes=1, blake3="0" * 64)
    with pytest.raises(RegistryError, match="relative to the registry root"):
        reg.resolve("tiny")


def test_symlink_escape_is_refused(reg: ModelRegistry, root: Path, tmp_path_factory) -> None:
    outside = tmp_path_factory.mktemp("elsewhere") / "w.gguf"
    outside.write_bytes(WEIGHTS)
    (root / "models" / "link.gguf").symlink_to(outside)
    write_manifest(root, "tiny", path="models/link.gguf", size_bytes=len(WEIGHTS), blake3="0" * 64)
    with pytest.raises(RegistryError, match="outside"):
        reg.resolve("tiny")


def test_missing_weights_and_bad_manifests(reg: ModelRegistry, root: Path) -> None:
    write_manifest(root, "tiny", path="models/gone.gguf", size_bytes=1, blake3="0" * 64)
    with pytest.raises(RegistryError, match="does not exist"):
        reg.resolve("tiny")
    write_manifest(root, "tiny", size_bytes=1, blake3="xyz")
    with pytest.raises(RegistryError, match="64 lowercase hex"):
        reg.resolve("tiny")
    write_manifest(root, "tiny", format="onnx", size_bytes=1, blake3="0" * 64)
    with pytest.raises(RegistryError, match=r"'onnx'.*allowed: gguf, mlx, ollama"):
        reg.resolve("tiny")
    write_manifest(root, "tiny")
    (root / "other.toml").write_text((root / "tiny.toml").read_text())
    with pytest.raises(RegistryError, match="must match"):
        reg.resolve("other")
    (root / "broken.toml").write_text("name = \n")
    with pytest.raises(RegistryError, match="cannot read manifest"):
        reg.resolve("broken")


def test_digest_cache_is_trusted_only_while_the_file_provably_did_not_change(
    reg: ModelRegistry, root: Path
) -> None:
    weights = root / "models" / "tiny.gguf"
    reg.adopt("tiny", weights)
    assert (root / ".digests.json").is_file()
    assert reg.resolve("tiny").entry.name == "tiny"  # unchanged: the cached digest holds
    st = weights.stat()
    weights.write_bytes(WEIGHTS[:-1] + b"\x00")  # same size, different content
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime set back; ctime cannot be
    with pytest.raises(RegistryError, match="digest mismatch"):
        reg.resolve("tiny")


def test_corrupt_cache_is_ignored(reg: ModelRegistry, root: Path) -> None:
    reg.adopt("tiny", root / "models" / "tiny.gguf")
    (root / ".digests.json").write_text("{not json")
    assert reg.resolve("tiny").entry.name == "tiny"


def test_mlx_directory_digest(reg: ModelRegistry, root: Path) -> None:
    mlx = root / "models" / "tiny-mlx"
    (mlx / "sub").mkdir(parents=True)
    (mlx / "config.json").write_text("{}")
    (mlx / "sub" / "model.safetensors").write_bytes(b"\x01" * 1000)
    entry = reg.adopt("tiny-mlx", mlx, format=ModelFormat.MLX)
    assert entry.size_bytes == 1002
    h = blake3.blake3(b"infervisor.mlx-dir.v1\0")
    for rel, data in [("config.json", b"{}"), ("sub/model.safetensors", b"\x01" * 1000)]:
        h.update(rel.encode() + b"\0" + len(data).to_bytes(8, "big"))
        h.update(blake3.blake3(data).digest())
    assert entry.blake3 == h.hexdigest() == digest_tree(mlx, root.resolve())
    resolved = reg.resolve("tiny-mlx")
    assert resolved.path == mlx.resolve()
    check_format(Flavor.MLX_LM, resolved)
    with pytest.raises(AdmissionRefused, match="needs gguf"):
        check_format(Flavor.LLAMACPP, resolved)


def test_ollama_entry_and_draft(reg: ModelRegistry, root: Path) -> None:
    reg.adopt("tiny", root / "models" / "tiny.gguf")
    reg.adopt("llama3", format=ModelFormat.OLLAMA, ollama_tag="llama3:8b")
    reg.adopt("big", root / "models" / "tiny.gguf", draft="tiny")
    resolved = reg.resolve("llama3")
    assert resolved.path is None
    assert resolved.entry.tag == "llama3:8b"
    check_format(Flavor.OLLAMA, resolved)
    with pytest.raises(AdmissionRefused, match="llamacpp cannot run model llama3: it is ollama"):
        check_format(Flavor.LLAMACPP, resolved)
    assert reg.resolve("big").entry.draft == "tiny"
    assert reg.names() == ["big", "llama3", "tiny"]
    with pytest.raises(RegistryError, match="takes no file"):
        reg.adopt("o2", root / "models" / "tiny.gguf", format=ModelFormat.OLLAMA)


def test_odd_characters_round_trip_through_toml(reg: ModelRegistry, root: Path) -> None:
    odd = root / "models" / 'we"ird\\na\tme\x7f.gguf'
    odd.write_bytes(WEIGHTS)
    reg.adopt("odd", odd)
    assert reg.resolve("odd").path == odd.resolve()


def test_missing_root(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="not a directory"):
        ModelRegistry(tmp_path / "nope").names()
