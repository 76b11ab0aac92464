#!/usr/bin/env python3
"""tests/test_kubernetes.py DIR GPT2D: deploy/kubernetes/*.yaml are
well-formed and agree with each other and with gpt2d:

- every file parses (python3-yaml), each document has apiVersion, kind and
  metadata.name, and the kinds are the expected ones;
- the Deployment's selector matches its pod labels, the Service selects the
  same pods and targets the container's named port, the probes use that port
  with /ready (readiness) and /health (liveness), the model volume is
  read-only, and termination grace exceeds the shutdown timeout;
- the container's arguments are options gpt2d accepts (gpt2d parses them and
  fails only on the model directory, which does not exist here);
- the memory limit covers the weights, the KV cache and some headroom;
- the autoscaler targets the Deployment, and the metric it scales on is one
  gpt2d exports.
"""
import os
import re
import subprocess
import sys

try:
    import yaml
except ImportError:  # a missing package skips (exit 77), except in CI (GPT2D_REQUIRE_ALL=1)
    print("SKIP: python3-yaml is not installed (scripts/setup.sh --test installs it)", file=sys.stderr)
    sys.exit(1 if os.environ.get("GPT2D_REQUIRE_ALL") == "1" or os.environ.get("CI") else 77)

d, gpt2d = sys.argv[1], sys.argv[2]
here = os.path.dirname(os.path.abspath(__file__))


def fail(msg):
    print("FAIL:", msg, file=sys.stderr)
    sys.exit(1)


docs = {}
for name in sorted(os.listdir(d)):
    if not name.endswith(".yaml"):
        continue
    with open(os.path.join(d, name)) as f:
        for doc in yaml.safe_load_all(f):
            if doc is None:
                continue
            for k in ("apiVersion", "kind", "metadata"):
                if k not in doc:
                    fail(f"{name}: no {k}")
            if not doc["metadata"].get("name"):
                fail(f"{name}: no metadata.name")
            docs[doc["kind"]] = doc
expected = {"Deployment": "apps/v1", "Service": "v1",
            "HorizontalPodAutoscaler": "autoscaling/v2", "PodDisruptionBudget": "policy/v1"}
for kind, api in expected.items():
    if kind not in docs:
        fail(f"no {kind}")
    if docs[kind]["apiVersion"] != api:
        fail(f"{kind}: apiVersion {docs[kind]['apiVersion']}, not {api}")

dep, svc, hpa, pdb = (docs[k] for k in expected)
labels = dep["spec"]["template"]["metadata"]["labels"]
sel = dep["spec"]["selector"]["matchLabels"]
if any(labels.get(k) != v for k, v in sel.items()):
    fail("the Deployment's selector does not match its pod labels")
for what, s in (("Service", svc["spec"]["selector"]),
                ("PodDisruptionBudget", pdb["spec"]["selector"]["matchLabels"])):
    if any(labels.get(k) != v for k, v in s.items()):
        fail(f"the {what} does not select the Deployment's pods")
pod = dep["spec"]["template"]["spec"]
c = pod["containers"][0]
ports = {p["name"]: p["containerPort"] for p in c["ports"]}
if svc["spec"]["ports"][0]["targetPort"] not in ports:
    fail("the Service's targetPort is not a named container port")
if c["readinessProbe"]["httpGet"]["path"] != "/ready":
    fail("readiness must probe /ready")
if c["livenessProbe"]["httpGet"]["path"] != "/health":
    fail("liveness must probe /health")
for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
    if c[probe]["httpGet"]["port"] not in ports:
        fail(f"{probe} uses a port the container does not name")

# The arguments: gpt2d must accept every option and fail only on the model.
args = c["args"]
if args[0] != "serve":
    fail("the container does not run gpt2d serve")
opts = dict(a[2:].split("=", 1) for a in args[1:])
if int(opts["port"]) != ports["http"]:
    fail("--port is not the container port")
r = subprocess.run([gpt2d] + args, capture_output=True, text=True, timeout=30)
if r.returncode == 0 or opts["model"] not in r.stderr or "unknown option" in r.stderr:
    fail("gpt2d does not accept the container's arguments: " + r.stderr)
mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
if not any(opts["model"].startswith(p) and m.get("readOnly") for p, m in mounts.items()):
    fail("the model directory is not on a read-only volume")
if pod["terminationGracePeriodSeconds"] <= float(opts["shutdown-timeout"]):
    fail("terminationGracePeriodSeconds must exceed --shutdown-timeout")


def mib(q):
    m = re.fullmatch(r"(\d+)(Mi|Gi)", str(q))
    if not m:
        fail(f"memory quantity {q} not in Mi or Gi")
    return int(m.group(1)) * (1024 if m.group(2) == "Gi" else 1)


weights_mib = 498e6 / 2**20  # GPT-2 small, F32
need = weights_mib + int(opts["kv-cache-mb"])
limit, request = mib(c["resources"]["limits"]["memory"]), mib(c["resources"]["requests"]["memory"])
if request < need or limit < request:
    fail(f"memory request {request} Mi / limit {limit} Mi do not cover weights + KV ({need:.0f} Mi)")
if int(opts["threads"]) > float(c["resources"]["requests"]["cpu"]):
    fail("more engine threads than requested CPUs")

ref = hpa["spec"]["scaleTargetRef"]
if ref["kind"] != "Deployment" or ref["name"] != dep["metadata"]["name"]:
    fail("the autoscaler does not target the Deployment")
if hpa["spec"]["minReplicas"] < 2:
    fail("fewer than 2 replicas at minimum")
# The /metrics page is written by server/daemon/metrics.c.
server_c = open(os.path.join(here, "..", "server", "daemon", "metrics.c")).read()
for m in hpa["spec"]["metrics"]:
    if m["type"] == "Pods":
        name = m["pods"]["metric"]["name"]
        if not re.search(r'"%s",\s*"gauge"' % re.escape(name), server_c):
            fail(f"the autoscaler scales on {name}, which gpt2d does not export as a gauge")
print(f"kubernetes: {len(docs)} documents consistent; gpt2d accepts {len(args) - 1} options")
