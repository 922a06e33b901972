"""Turn JobSet's CRD into the JSON schema that CI validates deploy/kubernetes/jobset.yaml against, offline.

    git clone https://github.com/kubernetes-sigs/jobset && cd jobset
    git show v0.12.0:config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml \\
        | python deploy/kubernetes/schemas/vendor_jobset_schema.py v0.12.0 "$(git rev-parse v0.12.0^{commit})" \\
        > deploy/kubernetes/schemas/jobset-v1alpha2.json

Takes the CRD's v1alpha2 openAPIV3Schema as it is, without its descriptions (two thirds of the bytes; they
are in the CRD), and with two changes so that a JSON Schema validator (check-jsonschema) rejects what the
API server would:
- every object with `properties` and no `additionalProperties` or `x-kubernetes-preserve-unknown-fields`
  gets `additionalProperties: false`: kubectl's default field validation (strict) refuses unknown fields;
- `apiVersion` and `kind` must be jobset.x-k8s.io/v1alpha2 and JobSet, and `metadata.name` is required.
Not checked, as no JSON schema can: the CRD's CEL rules (x-kubernetes-validations) and JobSet's webhook.
Needs PyYAML (in the dev extra).
"""

from __future__ import annotations

import json
import sys

import yaml

CRD_PATH = "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml"
VERSION = "v1alpha2"


def strict(node):
    """The schema with unknown fields refused wherever the API server refuses them."""
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: strict(value) for key, value in node.items() if not (key == "description" and isinstance(value, str))}
    open_ended = "additionalProperties" in out or out.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in out and not open_ended:
        out["additionalProperties"] = False
    return out


def vendored(crd: dict, tag: str, commit: str) -> dict:
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == VERSION]
    schema = strict(version["schema"]["openAPIV3Schema"])
    schema["properties"]["apiVersion"] = {"const": f"{crd['spec']['group']}/{VERSION}"}
    schema["properties"]["kind"] = {"const": crd["spec"]["names"]["kind"]}
    schema["properties"]["metadata"] = {
        "type": "object",
        "required": ["name"],
        "properties": {"name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}},
    }
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata", "spec"})
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$comment": (
            f"kubernetes-sigs/jobset {tag} (commit {commit}), {CRD_PATH}, {VERSION} openAPIV3Schema; "
            "made strict by deploy/kubernetes/schemas/vendor_jobset_schema.py (see its docstring)"
        ),
        "x-jobset-release": tag,
        **schema,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    crd = yaml.safe_load(sys.stdin)
    json.dump(vendored(crd, *argv), sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
