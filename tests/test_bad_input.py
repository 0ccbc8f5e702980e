"""Bad input a newcomer tried: refused with the field named, nothing recorded or lost."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from support import cli_here

from infervisor.actors.errors import BadArgument
from infervisor.adapters.ports import free_port
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.replay import RestartPolicy


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0, 1e308])
@pytest.mark.parametrize(
    "field", ["stop_grace_s", "health_interval_s", "reconcile_interval_s", "probe_timeout_s"]
)
def test_non_finite_or_huge_durations_are_refused(nodes, fake_llama, fake_model, field, value):
    settings = nodes.settings(fake_llama, fake_model, **{field: value})
    with pytest.raises(ValueError, match=field):
        nodes.open(settings)
    assert not Path(settings.chain_path).exists()


@pytest.mark.parametrize("value", [math.nan, math.inf, 0.0])
def test_restart_policy_durations_must_be_finite(value):
    with pytest.raises(ValueError, match="base_s"):
        RestartPolicy(base_s=value).validate()


@pytest.mark.parametrize("grace", [math.nan, math.inf, -1.0, 1e308])
def test_a_stop_with_a_bad_grace_is_refused_and_not_recorded(nodes, fake_llama, fake_model, grace):
    node = nodes.open(nodes.settings(fake_llama, fake_model))
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    iid = node.place(InstanceSpec(role="c", flavor=Flavor.LLAMACPP, model="tiny", port=free_port()))
    node.start(iid)
    node.wait_for(iid, lambda v: v.lifecycle == "running", 60)
    head = node.rebuild().head_seq
    with pytest.raises(BadArgument, match="grace_s"):
        node.stop(iid, grace_s=grace)
    assert node.rebuild().head_seq == head
    assert node.status(iid).lifecycle == "running"
    node.stop(iid)


def test_demo_refuses_a_folder_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    keep = tmp_path / "models" / "tiny.gguf"
    keep.write_bytes(b"mine")
    done = cli_here("demo", "--dir", tmp_path)  # refused before it starts: in this process
    assert done.returncode == 2
    assert "is not empty" in done.stderr
    assert keep.read_bytes() == b"mine"


def test_demo_names_a_folder_it_cannot_create() -> None:
    done = cli_here("demo", "--dir", "/proc/nonexistent/x")
    assert done.returncode == 2
    assert "cannot create it" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_config_naming_an_unknown_kind_is_refused_with_the_kinds(tmp_path: Path) -> None:
    from infervisor.tools.node.config import ConfigError, load_config

    path = tmp_path / "node.toml"
    path.write_text(
        '[node]\nnode_id = "n1"\ndata_dir = "data"\n\n[node.kinds.batch2]\nmiss_limit = 2\n\n'
        '[[instances]]\nrole = "x"\nflavor = "llamacpp"\nmodel = "tiny"\nport = 18099\n'
        'kind = "batch"\n',
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert "[[instances]] #1: kind 'batch' is not a kind of this node" in message
    assert "batch2" in message and "inference" in message and "process" in message


@pytest.mark.parametrize(
    ("kinds", "section", "key"),
    [
        ('[node.kinds.inference]\nprobe = "tcp"\n', "[node.kinds.inference]", "probe"),
        (  # the first kind converts: the second, which does not, is named
            '[node.kinds.batch2]\nmiss_limit = 2\n\n[node.kinds."my kind"]\nprobe = "tcp"\n',
            '[node.kinds."my kind"]',
            "probe",
        ),
        (
            '[node.kinds.inference.restart]\nmax_restarts = "x"\n',
            "[node.kinds.inference.restart]",
            "max_restarts",
        ),
    ],
)
def test_a_bad_kind_is_named_by_its_table_not_a_placeholder(
    tmp_path: Path, kinds: str, section: str, key: str
) -> None:
    """Stop 33's trial: ``[node.kinds.inference] probe = "tcp"`` was refused as
    ``[node.kinds.<name>], key probe``."""
    from infervisor.tools.node.config import ConfigError, load_config

    path = tmp_path / "node.toml"
    path.write_text(f'[node]\nnode_id = "n1"\ndata_dir = "data"\n\n{kinds}', encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert f"{section}, key `{key}`" in message, message
    assert "<name>" not in message
