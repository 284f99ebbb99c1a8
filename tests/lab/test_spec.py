"""Composed configs kept on disk (bnlab.lab.spec's cache): the same configs as Hydra's, keyed
on everything composition depends on."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import yaml

from bnlab.errors import BnlabError
from bnlab.lab import spec
from bnlab.paths import EXPERIMENTS

SPECS = sorted(EXPERIMENTS.glob("*/sweep.yaml"))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BNLAB_CACHE", str(tmp_path))
    return tmp_path / "composed"


def resolved_by_hydra(overrides: list[str]) -> dict:
    """Hydra's own composition, resolved by Hydra's config object: compose() without a cache
    as it was written before it kept anything (the reference)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from bnlab import hydra_setup
    from bnlab.config import validate

    hydra_setup.register()
    with initialize_config_dir(str(spec.CONFIGS), version_base="1.3"):
        cfg = OmegaConf.to_container(compose("train", overrides=overrides), resolve=True)
    validate(cfg, True)
    return cfg


def test_every_committed_cell_composes_the_same_from_the_cache(cache, monkeypatch):
    """Each committed cell's overrides (as spec_from builds them) kept in the cache, then
    composed from it with Hydra out of reach: the same resolved config as Hydra's own."""
    cells = []
    for p in SPECS:
        raw = yaml.safe_load(p.read_text())
        cells += [[f"experiment={raw['experiment']}", *c.get("overrides", [])]
                  for c in raw["cells"]]
    cells = [list(ov) for ov in sorted({tuple(ov) for ov in cells})]
    for ov in cells:
        spec.composed(ov)
    assert len(list(cache.glob("*.pkl"))) == len(cells) > 200

    def no_hydra(overrides):
        raise AssertionError(f"composed again: {overrides}")

    monkeypatch.setattr(spec, "hydra_compose", no_hydra)
    kept = [spec.compose(ov) for ov in cells]  # every one read back
    assert kept == [resolved_by_hydra(ov) for ov in cells]


def test_the_cache_is_read_and_an_environment_interpolation_stays_live(cache, monkeypatch):
    ov = ["norm=gn"]
    spec.compose(ov)
    (f,) = cache.glob("*.pkl")
    planted = pickle.loads(f.read_bytes())
    planted["epochs"] = 7  # what the cache holds is what a later compose gives
    f.write_bytes(pickle.dumps(planted))
    assert spec.compose(ov)["epochs"] == 7
    assert planted["data"]["root"].startswith("${oc.env:BNLAB_DATA")  # kept unresolved
    monkeypatch.setenv("BNLAB_DATA", "/somewhere/else")
    assert spec.compose(ov)["data"]["root"] == "/somewhere/else"


def copied_configs(tmp_path, monkeypatch) -> Path:
    """configs/ copied into `tmp_path`, and bnlab.lab.spec composing from the copy."""
    configs = tmp_path / "configs"
    for f in spec.CONFIGS.rglob("*"):
        if f.is_file():
            (configs / f.relative_to(spec.CONFIGS)).parent.mkdir(parents=True, exist_ok=True)
            (configs / f.relative_to(spec.CONFIGS)).write_bytes(f.read_bytes())
    monkeypatch.setattr(spec, "CONFIGS", configs)
    return configs


def test_a_changed_config_file_or_override_is_another_key(tmp_path, monkeypatch):
    base = spec.compose_key(["norm=gn"])
    assert spec.compose_key(["norm=gn"]) == base
    assert spec.compose_key(["norm=bn"]) != base
    configs = copied_configs(tmp_path, monkeypatch)
    assert spec.compose_key(["norm=gn"]) == base  # the same files, elsewhere: the same key
    (configs / "norm" / "gn.yaml").write_text((configs / "norm" / "gn.yaml").read_text() + "\n")
    assert spec.compose_key(["norm=gn"]) != base
    assert "hydra-core==" in spec.composers() and "omegaconf==" in spec.composers()


def test_a_config_changed_while_it_composed_is_not_kept(cache, tmp_path, monkeypatch):
    configs = copied_configs(tmp_path, monkeypatch)
    real = spec.hydra_compose

    def edited_meanwhile(overrides):  # a file saved while Hydra read the others
        cfg = real(overrides)
        (configs / "norm" / "gn.yaml").write_text((configs / "norm" / "gn.yaml").read_text()
                                                  + "\n")
        return cfg

    monkeypatch.setattr(spec, "hydra_compose", edited_meanwhile)
    spec.compose(["norm=gn"])
    assert not cache.exists() or list(cache.iterdir()) == []


def test_a_damaged_entry_is_composed_again_and_a_bad_override_is_never_kept(cache):
    good = spec.compose(["norm=gn"])
    (f,) = cache.glob("*.pkl")
    f.write_bytes(b"not a pickle")
    assert spec.compose(["norm=gn"]) == good
    assert pickle.loads(f.read_bytes())["norm"]["kind"] == "gn"  # replaced whole
    with pytest.raises(BnlabError, match="do not compose"):
        spec.compose(["norm=nosuchnorm"])
    assert len(list(cache.glob("*"))) == 1


def test_off_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("BNLAB_CACHE", "off")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert spec.cache_dir() is None
    spec.compose(["norm=gn"])
    assert list(tmp_path.rglob("*.pkl")) == []
    monkeypatch.setenv("BNLAB_CACHE", "")
    assert spec.cache_dir() == tmp_path / ".cache" / "bnlab" / "composed"
