"""The NVML collector on recorded scenarios, the real library without a driver, the simulated source."""

import json
from pathlib import Path

import pynvml
import pytest

from nodeagent.gpu import NvmlCollector, SimulatedGpuSource
from nodeagent.nvml_scenario import RecordedNvml

SCENARIOS = Path(__file__).parent / "nvml_scenarios"


def collect(name):
    return NvmlCollector(RecordedNvml.from_file(SCENARIOS / f"{name}.json")).collect()


def test_healthy_node_reports_every_field():
    r = collect("healthy-8xh100")
    assert r.status == "8 GPU(s)" and len(r.gpus) == 8
    uuids = {g["uuid"] for g in r.gpus}
    for g in r.gpus:
        assert g["errors"] == {}
        assert g["name"] == "NVIDIA H100 80GB HBM3"
        assert g["memory_total"] == g["memory_used"] + g["memory_free"] == 85520809984
        assert g["pcie"] == {"gen": 5, "width": 16}
        assert g["processes"][0]["used_memory"] < g["memory_used"]
        # NVSwitch fabric: every other GPU is a peer.
        assert set(g["nvlink_peers"]) == uuids - {g["uuid"]}


def test_lost_gpu_marks_only_that_gpu():
    r = collect("lost-gpu")
    assert len(r.gpus) == 8 and "2 unreadable" in r.status
    lost = r.gpus[3]
    assert lost["uuid"] and lost["memory_used"] is None
    assert lost["errors"]["memory"] == "GPU is lost"
    assert r.gpus[6]["errors"] == {"device": "GPU is lost"}
    healthy = [g for i, g in enumerate(r.gpus) if i not in (3, 6)]
    assert all(g["errors"] == {} and g["memory_used"] for g in healthy)


def test_not_supported_fields_are_marked_not_fatal():
    r = collect("not-supported-fields")
    assert len(r.gpus) == 2
    g = r.gpus[0]
    assert g["memory_total"] == 24146608128 and g["utilization_gpu"] is None
    assert g["errors"] == {
        "utilization_gpu": "Not Supported",
        "pcie": "Not Supported",
        "processes": "Not Supported",
    }
    assert g["pcie"] == {"gen": 4, "width": None} and g["nvlink_peers"] == []


def test_no_driver_is_zero_gpus_with_a_clear_status():
    r = collect("no-driver")
    assert r.gpus == [] and "Driver Not Loaded" in r.status


def test_real_pynvml_reports_what_the_library_says_and_never_raises():
    """Against the real library: without a driver (CI, laptops) zero GPUs and a status naming
    NVML's own error; on a GPU machine one entry per device NVML counts."""
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        r = NvmlCollector(pynvml).collect()
        assert r.gpus == []
        assert r.status == f"NVML unavailable ({exc}): reporting zero GPUs"
        return
    r = NvmlCollector(pynvml).collect()
    assert len(r.gpus) == count and r.status.startswith(f"{count} GPU(s)")
    assert all(g["uuid"].startswith("GPU-") and g["memory_total"] > 0 for g in r.gpus)


def test_simulated_source_reads_the_file(tmp_path):
    f = tmp_path / "gpus.json"
    f.write_text(
        json.dumps(
            {"gpus": [{"uuid": "GPU-sim-0", "index": 0, "memory_total": 100, "memory_used": 60}]}
        )
    )
    r = SimulatedGpuSource(str(f)).collect()
    assert r.gpus[0]["memory_free"] == 40 and r.gpus[0]["uuid"] == "GPU-sim-0"


@pytest.mark.parametrize("content", [None, "not json", '{"gpus": [{"uuid": "x"}]}'])
def test_simulated_source_problems_give_zero_gpus(tmp_path, content):
    f = tmp_path / "gpus.json"
    if content is not None:
        f.write_text(content)
    r = SimulatedGpuSource(str(f)).collect()
    assert r.gpus == [] and str(f) in r.status
