"""An empty path key in a node, witness or fleet config is refused, naming its table
and key (a newcomer's trial, stop 34: ``data_dir = ""`` ran a node in the config's
own folder, since a relative path is resolved from there and ``""`` is that folder).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from infervisor.tools.cli import cli as main_cli


@pytest.mark.parametrize(
    "key", ["data_dir", "registry_dir", "llamacpp_program", "mlx_program", "features_file"]
)
@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_node_path_is_refused(tmp_path: Path, key: str, empty: str) -> None:
    from infervisor.tools.node.config import ConfigError, load_config

    keys = {"node_id": "n1", "data_dir": "data", key: empty}
    path = tmp_path / "node.toml"
    path.write_text("[node]\n" + "".join(f'{k} = "{v}"\n' for k, v in keys.items()))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert f"[node] {key} is empty" in str(err.value)


def test_a_config_with_an_empty_data_dir_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text('[node]\nnode_id = "n1"\ndata_dir = ""\n')
    ran = CliRunner().invoke(main_cli, ["replay", str(path)])
    assert ran.exit_code == 2, ran.output
    assert "[node] data_dir is empty" in ran.stderr


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (('data_dir = "wdata"', 'data_dir = ""'), "witness.data_dir is empty"),
        (('vkey = "', 'token_file = ""\nvkey = "'), "logs[0].token_file is empty"),
    ],
)
def test_an_empty_witness_path_is_refused(
    tmp_path: Path, change: tuple[str, str], named: str
) -> None:
    from witness_support import Log, write_config

    from infervisor.tools.witness.config import ConfigError, load_config

    config = write_config(tmp_path, [Log("example.com/l")])
    config.write_text(config.read_text().replace(*change))
    with pytest.raises(ConfigError) as err:
        load_config(config)
    assert named in str(err.value)


@pytest.mark.parametrize("key", ["store", "token_file"])
def test_an_empty_fleet_path_is_refused(tmp_path: Path, key: str) -> None:
    from chain_tamper import make_chain

    from infervisor.tools.fleet.config import FleetConfigError, load_config

    make_chain(tmp_path / "n", 2)
    (tmp_path / "a.pub").write_bytes((tmp_path / "n" / "node.pub").read_bytes())
    fleet = f'[fleet]\nstore = "{"" if key == "store" else "f.db"}"\n'
    node = '[[nodes]]\nname = "a"\nurl = "http://127.0.0.1:1"\npub = "a.pub"\n'
    if key == "token_file":
        node += 'token_file = ""\n'
    path = tmp_path / "fleet.toml"
    path.write_text(fleet + node)
    with pytest.raises(FleetConfigError) as err:
        load_config(path)
    assert key in str(err.value) and "non-empty" in str(err.value)
