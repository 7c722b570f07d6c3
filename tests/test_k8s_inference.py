"""The inference-gateway overlay (deploy/k8s/inference-gateway): the base
manifests plus a Gateway, one HTTPRoute and one InferencePool (with its
endpoint picker) per model and GPU. Kubernetes objects validate against the
API schemas, Gateway API and InferencePool objects strictly against the CRDs
in deploy/k8s/crds (an unknown field is an error), and the pieces fit:
routes to pools, pools to pods and pickers, joulegate's replicas to routes."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from app.catalog import load_catalog
from tests.test_k8s import VERSION
from tests.test_k8s import objects as base_objects

ROOT = Path(__file__).resolve().parent.parent
OVERLAY = ROOT / "deploy" / "k8s" / "inference-gateway"
CRDS = ROOT / "deploy" / "k8s" / "crds"  # copied unchanged from ../shared/k8s-crds


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = copy.deepcopy(v)


def overlay() -> list[dict[str, Any]]:
    """What `kubectl apply -k` sends: the base, the overlay's resources, its
    patches merged by kind and name (maps merge, the rest replaces)."""
    k = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())
    docs = []
    for name in k["resources"]:
        if name == "../":
            docs += copy.deepcopy(base_objects())
        else:
            docs += [d for d in yaml.safe_load_all((OVERLAY / name).read_text()) if d]
    for entry in k["patches"]:
        for patch in yaml.safe_load_all((OVERLAY / entry["path"]).read_text()):
            target = [d for d in docs if d["kind"] == patch["kind"]
                      and d["metadata"]["name"] == patch["metadata"]["name"]]
            assert len(target) == 1, (entry, patch["metadata"])
            _merge(target[0], {k: v for k, v in patch.items() if k != "metadata"})
    return docs


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The CRD's schema with unknown fields refused (the API server prunes them
    silently; a typo should fail here instead)."""
    out = copy.deepcopy(schema)
    stack = [out]
    while stack:
        node = stack.pop()
        if node.get("type") == "object" and "properties" in node \
                and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for key in ("properties", "patternProperties"):
            stack += [v for v in node.get(key, {}).values() if isinstance(v, dict)]
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                stack.append(node[key])
        for key in ("allOf", "anyOf", "oneOf"):
            stack += node.get(key, [])
    return out


def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> strict JSON schema, from the shipped CRDs."""
    found = {}
    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for v in crd["spec"]["versions"]:
            if v.get("served"):
                schema = v["schema"]["openAPIV3Schema"]
                found[(f"{group}/{v['name']}", kind)] = _strict(schema)
    return found


def _custom(o: dict[str, Any]) -> bool:
    return o["apiVersion"].split("/")[0].endswith((".networking.k8s.io",)) \
        and o["kind"] in ("Gateway", "HTTPRoute", "InferencePool")


def _validate_custom(o: dict[str, Any]) -> None:
    schema = crd_schemas()[(o["apiVersion"], o["kind"])]
    body = {k: v for k, v in o.items() if k != "metadata"}  # metadata: the API server's
    jsonschema.Draft7Validator(schema).validate(body)


@pytest.mark.parametrize("obj", overlay(), ids=lambda o: f"{o['kind']}/{o['metadata']['name']}")
def test_every_object_validates(obj: dict[str, Any]) -> None:
    if _custom(obj):
        _validate_custom(obj)
    else:
        kubernetes_validate.validate(obj, VERSION, strict=True)


def test_the_crd_validation_is_strict() -> None:
    pool = next(o for o in overlay() if o["kind"] == "InferencePool")
    typo = copy.deepcopy(pool)
    typo["spec"]["targetPort"] = typo["spec"].pop("targetPorts")
    with pytest.raises(jsonschema.ValidationError):
        _validate_custom(typo)
    wrong = copy.deepcopy(pool)
    wrong["spec"]["targetPorts"] = [{"number": 70000}]
    with pytest.raises(jsonschema.ValidationError):
        _validate_custom(wrong)
    route = next(o for o in overlay() if o["kind"] == "HTTPRoute")
    extra = copy.deepcopy(route)
    extra["spec"]["rules"][0]["backendRefs"][0]["pool"] = "x"
    with pytest.raises(jsonschema.ValidationError):
        _validate_custom(extra)


def test_routes_pools_pickers_and_joulegate_fit(tmp_path: Path) -> None:
    docs = overlay()

    def named(kind: str) -> dict[str, dict[str, Any]]:
        return {o["metadata"]["name"]: o for o in docs if o["kind"] == kind}

    pools, services, gateways = named("InferencePool"), named("Service"), named("Gateway")
    pods = {n: o["spec"]["template"] for n, o in named("Deployment").items()}
    prefixes = {}
    for name, route in named("HTTPRoute").items():
        assert route["spec"]["parentRefs"][0]["name"] in gateways, name
        (rule,) = route["spec"]["rules"]
        (ref,) = rule["backendRefs"]
        assert ref["kind"] == "InferencePool" and ref["name"] in pools, name
        prefixes[rule["matches"][0]["path"]["value"]] = ref["name"]
    for name, pool in pools.items():
        picker = pool["spec"]["endpointPickerRef"]
        assert picker["port"]["number"] in {p["port"] for p in services[picker["name"]]["spec"]
                                            ["ports"]}, name
        members = [n for n, p in pods.items() if pool["spec"]["selector"]["matchLabels"].items()
                   <= p["metadata"]["labels"].items()]
        assert len(members) == 1, (name, members)  # one model on one GPU per pool
        ports = {p["containerPort"] for c in pods[members[0]]["spec"]["containers"]
                 for p in c["ports"]}
        assert {p["number"] for p in pool["spec"]["targetPorts"]} <= ports, name
    text = named("ConfigMap")["joulegate-models"]["data"]["models.yaml"]
    path = tmp_path / "models.yaml"
    path.write_text(text.replace("/srv/joulegate/", f"{ROOT}/"))
    catalog = load_catalog(path)
    for b in catalog.backends:
        for r in b.replicas:
            pool = prefixes["/" + r.base.split("//", 1)[1].split("/", 1)[1]]
            member = next(n for n, p in pods.items() if pools[pool]["spec"]["selector"]
                          ["matchLabels"].items() <= p["metadata"]["labels"].items())
            # the replica's device is the GPU its pool's pods are pinned to
            device = next(d for d in catalog.devices if d.name == r.device)
            assert pods[member]["spec"]["nodeSelector"]["kubernetes.io/hostname"] == device.host
            env = {e["name"]: e.get("value") for c in pods[member]["spec"]["containers"]
                   for e in c.get("env", [])}
            assert env.get("NVIDIA_VISIBLE_DEVICES") == str(device.index), (b.name, member)
