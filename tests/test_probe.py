import json

import pytest

from components.probe.checks import FAIL, PASS, WARN, run_checks, verdict
from components.probe.machine_facts import collect, memory, usable_cpus
from components.probe.probe_report import probe_markdown, run_probe


def _facts(gpus=(), cuda_build=True, usable=2, visible=2, total=16 << 30):
    return {
        "tensorflow": {"version": "2.16.2", "gpus": list(gpus),
                       "build": {"is_cuda_build": cuda_build, "cuda_version": "12.3", "cudnn_version": "8"}},
        "cpu": {"usable": usable, "visible": visible},
        "memory": {"total": total, "available": total // 2, "cgroup_limit": None},
        "python": "3.11.7",
    }


def test_no_gpu_warns_by_default_and_fails_when_required():
    checks = {c.name: c for c in run_checks(_facts())}
    assert checks["gpu"].status == WARN and "no GPU" in checks["gpu"].reason
    required = {c.name: c for c in run_checks(_facts(), require_gpu=True)}
    assert required["gpu"].status == FAIL and "nvidia-smi" in required["gpu"].fix


def test_cpu_only_build_names_the_gpu_install():
    gpu = run_checks(_facts(cuda_build=False), require_gpu=True)[0]
    assert gpu.status == FAIL and "CPU-only build" in gpu.reason and "--extra gpu" in gpu.fix


def test_visible_gpu_passes():
    gpu = run_checks(_facts(gpus=[{"name": "NVIDIA A100", "compute_capability": [8, 0]}]), require_gpu=True)[0]
    assert gpu.status == PASS and "A100" in gpu.reason and "cc 8.0" in gpu.reason


def test_cpu_quota_below_visible_cores_warns():
    cpus = {c.name: c for c in run_checks(_facts(usable=2, visible=64))}["cpus"]
    assert cpus.status == WARN and "2 usable CPUs of 64 visible" in cpus.reason


def test_little_ram_warns():
    ram = {c.name: c for c in run_checks(_facts(total=2 << 30))}["ram"]
    assert ram.status == WARN


def test_verdict_is_the_worst_status():
    checks = run_checks(_facts(usable=1, visible=8), require_gpu=True)
    assert verdict(checks) == FAIL
    assert verdict([c for c in checks if c.status != FAIL]) == WARN


def test_cgroup_v2_quota_limits_usable_cpus(tmp_path):
    (tmp_path / "cpu.max").write_text("200000 100000\n")
    assert usable_cpus(tmp_path)["usable"] <= 2
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(tmp_path)["cgroup_quota"] is None


def test_cgroup_v1_quota_and_memory_limit(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("150000")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert usable_cpus(tmp_path)["cgroup_quota"] == 1.5 and usable_cpus(tmp_path)["usable"] == 1
    (tmp_path / "memory.max").write_text(str(3 << 30))
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16384 kB\nMemAvailable:    8192 kB\n")
    assert memory(meminfo, tmp_path) == {"total": 16384 * 1024, "available": 8192 * 1024, "cgroup_limit": 3 << 30}


def test_real_collection_on_this_machine():
    facts = collect()
    assert facts["schema_version"] == 1
    assert facts["cpu"]["usable"] >= 1 and facts["memory"]["total"] > 0
    assert facts["tensorflow"]["version"].startswith("2.16")
    result = run_probe(facts=facts)
    json.dumps(result.to_dict())  # serialisable as probe.json
    assert result.verdict in (PASS, WARN)
    assert probe_markdown(result).startswith(f"# Environment probe: {result.verdict}")


@pytest.mark.parametrize("status", [PASS, WARN, FAIL])
def test_markdown_lists_every_check(status):
    result = run_probe(facts=_facts(gpus=[{"name": "T4", "compute_capability": [7, 5]}] if status == PASS else []),
                       require_gpu=status == FAIL)
    text = probe_markdown(result)
    for check in result.checks:
        assert f"| {check.name} | {check.status} |" in text
