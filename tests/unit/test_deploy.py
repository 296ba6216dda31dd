"""The deploy examples (deploy/): /metrics on the address Prometheus scrapes, never on every address,
behind the ecosystem's protections: the exporter-toolkit web config (TLS, basic auth) and, on
Kubernetes, a NetworkPolicy that admits Prometheus alone (issue 49: every example bound 0.0.0.0:9400
with no authentication)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from torchwatch.cli import build_parser

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _serve_args(args: list[str]) -> Any:
    return build_parser().parse_args(args)


def test_no_example_listens_on_every_address() -> None:
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file()):
        code = "\n".join(ln for ln in path.read_text().splitlines() if not ln.lstrip().startswith("#"))
        assert not re.search(r"(?<![\d.])0\.0\.0\.0(?![\d./])|\[::\]", code), path


def test_the_daemonset_listens_on_the_pod_address_with_the_web_config_and_a_network_policy() -> None:
    docs = _docs(DEPLOY / "kubernetes" / "torchwatch-daemonset.yaml")
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    args = [a.replace("$(POD_IP)", "10.1.2.3") for a in c["args"]]
    parsed = _serve_args(args)
    assert parsed.prometheus == ("10.1.2.3", 9400) and str(parsed.web_config_file) == "/etc/torchwatch/web.yml"
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in c["env"]
    assert "tcpSocket" in c["readinessProbe"]  # an HTTP probe has no password: 401
    mounted = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounted["web"] == "/etc/torchwatch"
    assert any(v.get("secret", {}).get("secretName") == "torchwatch-web" for v in pod["volumes"])
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == ds["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9400}] and rule["from"]  # only some peers


def test_systemd_and_slurm_pass_an_address_and_the_web_config() -> None:
    unit = (DEPLOY / "systemd" / "torchwatch-serve.service").read_text()
    exec_start = re.search(r"^ExecStart=(\S+) (.*)$", unit, re.M)
    assert exec_start is not None
    args = exec_start.group(2).replace("${TORCHWATCH_LISTEN}", "10.0.0.5:9400").split()
    assert _serve_args(args).web_config_file is not None
    assert re.search(r"^IPAddressDeny=any$", unit, re.M) and re.search(r"^IPAddressAllow=", unit, re.M)
    prolog = (DEPLOY / "slurm" / "prolog.sh").read_text()
    assert '--prometheus "${ADDR:-127.0.0.1}:$PORT"' in prolog and "--web-config-file" in prolog


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian: prometheus)")
def test_prometheus_scrapes_over_tls_with_basic_auth() -> None:
    done = subprocess.run(
        ["promtool", "check", "config", "prometheus.yml"],
        cwd=DEPLOY / "prometheus",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for path in (DEPLOY / "prometheus" / "prometheus.yml", DEPLOY / "kubernetes" / "scrape-config.yaml"):
        (job,) = [j for j in _docs(path)[0]["scrape_configs"] if j["job_name"].startswith("torchwatch")]
        assert job["scheme"] == "https" and job["basic_auth"]["password_file"] and job["tls_config"]["ca_file"]
