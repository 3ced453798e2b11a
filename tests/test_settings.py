"""One settings model: defaults < TOML file < ISBRE_* environment < flags."""

from __future__ import annotations

from pathlib import Path

import pytest
from isbre.rest.settings import load_settings
from pydantic import ValidationError


def test_defaults_need_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("ISBRE_HOST", "ISBRE_PORT", "ISBRE_WAREHOUSE"):
        monkeypatch.delenv(key, raising=False)
    settings = load_settings()
    assert (settings.host, settings.port, settings.warehouse) == ("127.0.0.1", 8181, "warehouse")


def test_each_layer_overrides_the_one_below(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "isbre.toml"
    config.write_text('port = 9000\nwarehouse = "/data/lake"\nmax_batch = 64\nhost = "127.0.0.2"\n')
    monkeypatch.setenv("ISBRE_PORT", "9100")
    monkeypatch.setenv("ISBRE_HOST", "127.0.0.3")
    settings = load_settings(config, host="127.0.0.4")
    assert settings.max_batch == 64  # from the file
    assert settings.warehouse == "/data/lake"  # from the file
    assert settings.port == 9100  # environment beats the file
    assert settings.host == "127.0.0.4"  # a flag beats everything


def test_unknown_and_invalid_settings_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "isbre.toml"
    config.write_text("prot = 1\n")
    with pytest.raises(ValidationError, match="prot"):
        load_settings(config)
    with pytest.raises(ValidationError):
        load_settings(port=70000)
    with pytest.raises(FileNotFoundError):
        load_settings(tmp_path / "missing.toml")


def test_warehouses_and_the_store_from_a_file(tmp_path: Path) -> None:
    config = tmp_path / "isbre.toml"
    config.write_text(
        'warehouse = "s3://lake/prod"\nprefix = "prod"\n'
        '[s3]\nendpoint = "http://127.0.0.1:9000"\npath_style = true\n'
        '[warehouses.scratch]\nroot = "/srv/scratch"\n'
    )
    settings = load_settings(config)
    assert [name for name, _ in settings.served()] == ["prod", "scratch"]
    assert settings.store_location() == str(Path("isbre.lmdb").resolve())  # beside, for an S3 warehouse
    assert load_settings(config, store=str(tmp_path / "s")).store_location() == str(tmp_path / "s")
    local = load_settings(warehouse=str(tmp_path / "wh"))
    assert local.store_location() == str(tmp_path / "wh" / "isbre.lmdb")
    assert local.state_path() == tmp_path / "wh"  # a server's own files go beside an LMDB store


def test_a_database_store_keeps_the_servers_files_in_a_state_directory(tmp_path: Path) -> None:
    url = "postgresql://isbre:secret@db.example:5432/catalog"
    shared = load_settings(store=url, warehouse=str(tmp_path / "wh"))
    assert shared.shares_store() and shared.store_location() == url
    assert shared.state_path() == Path("isbre-state").resolve()
    assert load_settings(store=url, state_dir=tmp_path / "st").state_path() == tmp_path / "st"
    assert not load_settings(store=str(tmp_path / "s")).shares_store()


def test_a_warehouse_named_like_the_prefix_or_not_a_path_segment_is_refused(tmp_path: Path) -> None:
    for name in ("isbre", "a/b", "with space"):
        config = tmp_path / "isbre.toml"
        config.write_text(f'[warehouses."{name}"]\nroot = "/srv/x"\n')
        with pytest.raises(ValidationError, match="warehouse name"):
            load_settings(config)
