"""Composed configs kept on disk (bnlab.lab.spec's cache): the same configs as Hydra's, keyed
on everything composition depends on."""

from __future__ import annotations

import json
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


def first_cells() -> list[list[str]]:
    """The first cell of each committed spec, as spec_from builds it."""
    firsts = []
    for p in SPECS:
        raw = yaml.safe_load(p.read_text())
        firsts.append(spec.cell_overrides(raw, raw["cells"][0]))
    return firsts


def read_back(cells: list[list[str]], cache: Path, monkeypatch) -> None:
    """Each of `cells` kept in the cache, then read back from it with Hydra out of reach: the
    same composition; resolved, the first twenty are Hydra's own resolved config."""
    fresh = [spec.composed(ov) for ov in cells]  # composed, and kept
    assert len(list(cache.glob("*.pkl"))) == len({tuple(ov) for ov in cells})

    def no_hydra(overrides):
        raise AssertionError(f"composed again: {overrides}")

    monkeypatch.setattr(spec, "hydra_compose", no_hydra)
    assert [spec.composed(ov) for ov in cells] == fresh  # every one read back
    assert [spec.compose(ov) for ov in cells[:20]] == [resolved_by_hydra(ov) for ov in cells[:20]]


def test_each_committed_specs_first_cell_composes_the_same_from_the_cache(cache, monkeypatch):
    """The first cell of each spec (every cell: the slow test below)."""
    cells = first_cells()
    assert len(cells) == len(SPECS) > 15
    read_back(cells, cache, monkeypatch)


@pytest.mark.slow  # CI time (10 s: over 200 compositions); make test-slow runs it
def test_every_committed_cell_composes_the_same_from_the_cache(cache, monkeypatch):
    cells = spec.committed_cells()
    assert len(cells) > 200
    read_back(cells, cache, monkeypatch)


def whole(overrides: list[str]) -> str:
    """Hydra's compose of all the overrides at once (one step), as JSON: key order counts."""
    from hydra import initialize_config_dir

    try:
        with initialize_config_dir(str(spec.CONFIGS), version_base="1.3"):
            return json.dumps(spec.compose_whole(overrides))
    except Exception as e:  # noqa: BLE001 (the sentence spec gives for any of Hydra's)
        return str(spec.not_composed(overrides, e))


def two_steps(overrides: list[str]) -> str:
    try:
        return json.dumps(spec.hydra_compose(overrides))
    except Exception as e:  # noqa: BLE001 (compared with whole's, whatever it is)
        return str(e)


EDGES = [  # each kind of override beside group choices, and ones Hydra refuses
    ["experiment=jitter", "optim.lr=0.3", "+foo.bar=1"], ["experiment=jitter", "++newkey=2"],
    ["experiment=jitter", "~optim.nesterov"], ["norm=gn", "norm.groups=4", "data.augment=false"],
    ["experiment=jitter", "data.root=null", "optim.step_milestones=[1,2]"],
    ["experiment=jitter", "model.name=${norm.kind}"], ["experiment=jitter", "nrom.groups=8"],
    ["experiment=jitter", "norm=nope", "seed=1"], ["experiment=jitter", "optim@foo=sgd", "seed=1"],
    ["experiment=jitter", "norm={kind: gn, groups: 4}"], ["experiment=jitter", "seed=0,1"],
    ["experiment=jitter", "hydra.run.dir=x", "seed=3"], ["experiment=jitter", "+norm@extra=gn"],
    ["experiment=jitter", "~norm", "seed=2"], ["experiment=jitter", "norm=null", "seed=2"],
    ["experiment=jitter", "+x=${hydra.job.chdir}", "~x"],
    ["experiment=jitter", "optim={lr: 1, newkey: 2}", "seed=2"]]


def test_two_steps_compose_what_hydra_composes_in_one():
    """hydra_compose's two steps (the group choices once, then the other overrides by Hydra's
    own function) against Hydra's compose of everything at once: the same config, keys in
    the same order, or the same sentence; on each kind of override and on the first cell of
    each committed spec (every cell: the slow test below; every committed run's key, which
    `make report`'s rebuild in test_registry.py finds, depends on it too)."""
    firsts = first_cells()
    spec.base.cache_clear()
    for ov in [*EDGES, *firsts]:
        assert two_steps(ov) == whole(ov), ov
    assert spec.base.cache_info().hits > 0  # the two steps ran: a group choice served again
    assert two_steps(EDGES[6]).endswith("Could not override 'nrom.groups'.")
    with pytest.raises(BnlabError, match="norm=null seed=2 do not compose: Config group"):
        spec.hydra_compose(EDGES[14])  # one sentence, as any other override Hydra refuses
    assert [spec.compose(ov) for ov in firsts] == [resolved_by_hydra(ov) for ov in firsts]


@pytest.mark.slow  # CI time (about a minute: 214 compositions in one step); make test-slow
def test_every_committed_cell_composes_in_two_steps_what_hydra_composes_in_one():
    for ov in spec.committed_cells():
        assert two_steps(ov) == whole(ov), ov


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
