"""Writes the NVML scenario files in this folder (run once; the JSON files are committed).

They use the format ``nodeagent.nvml_scenario.record`` writes on a real node; the figures
follow an 8x H100 SXM (NVSwitch) node, a node with one GPU fallen off the bus, a cloud A10G node
whose NVML answers "Not Supported" to several calls, and a node without the driver. Re-record
on real hardware with ``python bench/gpu_check.py --record PATH``.
"""

import json
from pathlib import Path

HERE = Path(__file__).parent
GIB = 1 << 30
H100_TOTAL = 85520809984
SWITCHES = ["00000000:c5:00.0", "00000000:c6:00.0", "00000000:c7:00.0", "00000000:c8:00.0"]
GPU_BUS = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
LOST = {"error": "NVML_ERROR_GPU_IS_LOST"}
NOT_SUPPORTED = {"error": "NVML_ERROR_NOT_SUPPORTED"}


def h100(i: int) -> dict:
    used = 72 * GIB + i * 37 * (1 << 20)
    links = {str(link): 1 for link in range(18)}
    remotes = {str(link): {"busId": SWITCHES[link % 4]} for link in range(18)}
    links["18"] = NOT_SUPPORTED  # the 19th link does not exist on H100: ends the list
    return {
        "nvmlDeviceGetHandleByIndex": None,
        "nvmlDeviceGetUUID": f"GPU-8f3c2a1e-0000-4000-8000-00000000000{i}",
        "nvmlDeviceGetName": "NVIDIA H100 80GB HBM3",
        "nvmlDeviceGetPciInfo": {"busId": f"00000000:{GPU_BUS[i]}:00.0"},
        "nvmlDeviceGetMemoryInfo": {"total": H100_TOTAL, "used": used, "free": H100_TOTAL - used},
        "nvmlDeviceGetUtilizationRates": {"gpu": 80 + i, "memory": 40 + i},
        "nvmlDeviceGetCurrPcieLinkGeneration": 5,
        "nvmlDeviceGetCurrPcieLinkWidth": 16,
        "nvmlDeviceGetComputeRunningProcesses": [
            {"pid": 4200 + i, "usedGpuMemory": used - 600 * (1 << 20)}
        ],
        "nvmlDeviceGetNvLinkState": links,
        "nvmlDeviceGetNvLinkRemotePciInfo": remotes,
    }


def write(name: str, scenario: dict) -> None:
    (HERE / f"{name}.json").write_text(json.dumps({"name": name, **scenario}, indent=1) + "\n")


healthy = [h100(i) for i in range(8)]
write(
    "healthy-8xh100",
    {"nvmlInit": None, "nvmlSystemGetDriverVersion": "550.54.15", "devices": healthy},
)

lost = [h100(i) for i in range(8)]
for call in list(lost[3]):
    if call not in ("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID"):
        lost[3][call] = LOST
lost[3]["nvmlDeviceGetNvLinkState"] = {"0": LOST}
lost[6]["nvmlDeviceGetHandleByIndex"] = LOST
write("lost-gpu", {"nvmlInit": None, "nvmlSystemGetDriverVersion": "550.54.15", "devices": lost})

a10g = []
for i in range(2):
    total = 24146608128
    used = 20 * GIB
    a10g.append(
        {
            "nvmlDeviceGetHandleByIndex": None,
            "nvmlDeviceGetUUID": f"GPU-a10a10a1-0000-4000-8000-00000000000{i}",
            "nvmlDeviceGetName": "NVIDIA A10G",
            "nvmlDeviceGetPciInfo": {"busId": f"00000000:{0x1E + i:02x}:00.0"},
            "nvmlDeviceGetMemoryInfo": {"total": total, "used": used, "free": total - used},
            "nvmlDeviceGetUtilizationRates": NOT_SUPPORTED,
            "nvmlDeviceGetCurrPcieLinkGeneration": 4,
            "nvmlDeviceGetCurrPcieLinkWidth": NOT_SUPPORTED,
            "nvmlDeviceGetComputeRunningProcesses": NOT_SUPPORTED,
            "nvmlDeviceGetNvLinkState": {"0": NOT_SUPPORTED},
            "nvmlDeviceGetNvLinkRemotePciInfo": {},
        }
    )
write(
    "not-supported-fields",
    {"nvmlInit": None, "nvmlSystemGetDriverVersion": "535.183.01", "devices": a10g},
)

write("no-driver", {"nvmlInit": {"error": "NVML_ERROR_DRIVER_NOT_LOADED"}, "devices": []})
