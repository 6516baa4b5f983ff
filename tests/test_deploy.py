"""deploy/ files pass their validators and keep the time limits nested."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from supervisor.topology import parse

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
UNIT = DEPLOY / "systemd" / "wurk-swarm.service"
K8S = DEPLOY / "kubernetes"
SWARM_BIN = Path(sys.executable).parent / "wurk-swarm"


def unit_settings() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNIT)
    return parser


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing: apt-get install -y systemd (scripts/test does)")
    # systemd-analyze insists ExecStart exists; point it at this venv's
    # wurk-swarm and change nothing else.
    text = UNIT.read_text()
    assert "/opt/wurk/venv/bin/wurk-swarm" in text
    copy = tmp_path / "wurk-swarm.service"
    copy.write_text(text.replace("/opt/wurk/venv/bin/wurk-swarm", str(SWARM_BIN)))
    result = subprocess.run(["systemd-analyze", "verify", str(copy)],
                            capture_output=True, text=True, timeout=60, check=False)
    problems = [line for line in result.stderr.splitlines() if "wurk-swarm.service" in line]
    assert result.returncode == 0 and not problems, result.stderr


def test_systemd_unit_drains_before_systemd_kills() -> None:
    service = unit_settings()["Service"]
    assert service["Type"] == "notify"
    assert service["KillMode"] == "mixed"
    assert service["Restart"] == "on-failure"
    assert service["ExecReload"].endswith("-HUP $MAINPID")
    topology = parse({"wurk": {}, "slot": [{"name": "a"}]}, Path("defaults"))
    parent_drain = topology.shutdown_timeout + topology.shutdown_grace
    assert float(service["TimeoutStopSec"]) > parent_drain


def test_kubernetes_manifests_validate() -> None:
    files = [str(K8S / "configmap.yaml"), str(K8S / "deployment.yaml")]
    result = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", *files],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed") == 2


def test_kubernetes_grace_period_covers_the_drain_and_memory_limit_the_children() -> None:
    configmap = yaml.safe_load((K8S / "configmap.yaml").read_text())
    topology = parse(tomllib.loads(configmap["data"]["topology.toml"]), Path("configmap"))
    deployment = yaml.safe_load((K8S / "deployment.yaml").read_text())
    pod = deployment["spec"]["template"]["spec"]
    parent_drain = topology.shutdown_timeout + topology.shutdown_grace
    assert pod["terminationGracePeriodSeconds"] > parent_drain
    container = pod["containers"][0]
    limit = container["resources"]["limits"]["memory"]
    assert limit.endswith("Gi")
    children_mb = sum(s.count * s.max_memory_mb for s in topology.slots)
    assert 0 < children_mb < float(limit[:-2]) * 1024
    assert "--probe" in container["livenessProbe"]["exec"]["command"]
    ready = container["readinessProbe"]["httpGet"]
    first = topology.slots[0].config
    assert ready["path"] == "/ready"
    assert first.health_listen is not None and first.health_listen.endswith(f":{ready['port']}")


def test_keda_scaledobject_targets_the_deployment() -> None:
    scaled = yaml.safe_load((K8S / "keda-scaledobject.yaml").read_text())
    deployment = yaml.safe_load((K8S / "deployment.yaml").read_text())
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["kind"] == "ScaledObject"
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["type"] == "redis"
    assert trigger["metadata"]["listName"].startswith("queue:")
    assert int(trigger["metadata"]["listLength"]) > 0
