"""models.yaml validation names the bad field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.catalog import CatalogError, load_catalog

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, mutate: object) -> Path:
    data = yaml.safe_load((ROOT / "models.yaml").read_text())
    mutate(data)  # type: ignore[operator]
    p = tmp_path / "models.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_shipped_models_yaml_is_valid() -> None:
    c = load_catalog(ROOT / "models.yaml")
    assert c.tiers == ["small", "large"]
    assert all(b.kind in ("llamacpp", "vllm") for b in c.backends)


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda d: d["backends"][0]["replicas"][0].update(url="not a url"),
     "backends.0.replicas.0.url"),
    (lambda d: d["backends"][1].update(kind="ollama"), "backends.1.kind"),
    (lambda d: d["backends"][0].update(tier="medium"), "backends.0.tier"),
    (lambda d: d["backends"][0]["replicas"][0].update(device="gpu9"),
     "backends.0.replicas.0.device"),
    (lambda d: d["devices"][0].update(source="magic"), "devices.0.source"),
    (lambda d: d["backends"][0].update(replicas=[]), "backends.0.replicas"),
    (lambda d: d["backends"][0].update(typo_field=1), "backends.0.typo_field"),
    (lambda d: d.pop("tiers"), "tiers"),
    (lambda d: d["routing"].update(batch_pricing="average"), "routing.batch_pricing"),
    (lambda d: d["routing"].update(colocation_penalty=-1), "routing.colocation_penalty"),
])
def test_bad_field_is_named(tmp_path: Path, mutate: object, field: str) -> None:
    with pytest.raises(CatalogError, match=field.replace(".", r"\.")):
        load_catalog(write(tmp_path, mutate))


def test_load_pricing_is_read_into_the_router() -> None:
    from app.catalog import parse_catalog
    from app.routing import LengthBook, build_router

    data = yaml.safe_load((ROOT / "models.yaml").read_text())
    data["routing"].update(batch_pricing="share", colocation_penalty=0.25)
    c = parse_catalog({**data, "base_dir": str(ROOT)})
    pricing = build_router(c, LengthBook(None)).policy.pricing
    assert pricing.share and pricing.penalty == 0.25
    shipped = build_router(load_catalog(ROOT / "models.yaml"), LengthBook(None)).policy.pricing
    assert not shipped.share and shipped.penalty == 1.0


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="cannot read"):
        load_catalog(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("tiers: [small\n")
    with pytest.raises(CatalogError, match="not valid YAML"):
        load_catalog(bad)


def test_serve_refuses_a_bad_file_naming_the_field(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli import main

    bad = write(tmp_path, lambda d: d["backends"][0].update(kind="ollama"))
    assert main(["serve", "--models", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad configuration" in err and "backends.0.kind" in err
