"""The thermo log: columns, units, exact values, ns/day and truncation on resume."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from fastmace.io import THERMO_COLUMNS
from fastmace.io.thermo import ThermoLog, truncate_thermo


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def read(path) -> list[dict[str, str]]:
    with open(path, newline="") as stream:
        return list(csv.DictReader(stream))


def test_one_system_has_no_system_column_and_exact_values(tmp_path):
    path = tmp_path / "thermo.csv"
    log = ThermoLog(path, n_systems=1)
    energy = -123.45678901234567
    log.write([{"step": 0, "time_fs": 0.0, "potential_energy_eV": np.float64(energy)}])
    log.write([{"step": 10, "time_fs": 5.0, "temperature_K": np.float32(300.5), "volume_A3": 8}])
    log.close()
    header = path.read_text().splitlines()[0].split(",")
    assert header == [column for column in THERMO_COLUMNS if column != "system"]
    rows = read(path)
    assert float(rows[0]["potential_energy_eV"]) == energy  # shortest exact repr
    assert rows[0]["temperature_K"] == ""
    assert rows[1]["temperature_K"] == "300.5" and rows[1]["volume_A3"] == "8"
    assert "\r" not in path.read_text()


def test_batch_has_a_system_column_and_extra_columns(tmp_path):
    path = tmp_path / "thermo.csv"
    log = ThermoLog(path, n_systems=2)
    log.write(
        {"step": 0, "system": s, "temperature_K": 300.0 + s, "conserved_energy_eV": -1.0 * s}
        for s in range(2)
    )
    with pytest.raises(ValueError, match=r"columns \['barostat'\] are not in"):
        log.write([{"step": 1, "system": 0, "barostat": 1.0}])
    with pytest.raises(ValueError, match="a non-negative integer 'step'"):
        log.write([{"system": 0}])
    with pytest.raises(TypeError, match="not a number"):
        log.write([{"step": 2, "system": 0, "temperature_K": "hot"}])
    log.close()
    header = path.read_text().splitlines()[0].split(",")
    assert header[:3] == ["step", "system", "time_fs"]
    assert header[-1] == "conserved_energy_eV"
    rows = read(path)
    assert [(r["step"], r["system"], r["temperature_K"]) for r in rows] == [
        ("0", "0", "300.0"),
        ("0", "1", "301.0"),
    ]


def test_ns_per_day_from_simulated_over_wall_time(tmp_path):
    clock = FakeClock()
    log = ThermoLog(tmp_path / "thermo.csv", clock=clock)
    log.write([{"step": 0, "time_fs": 0.0}])
    clock.now = 86.4  # a thousandth of a day
    log.write([{"step": 1000, "time_fs": 1000.0}])  # 1 ps
    log.write([{"step": 2000, "time_fs": 2000.0, "ns_per_day": 7.0}])  # the caller's own
    log.close()
    rows = read(tmp_path / "thermo.csv")
    assert rows[0]["ns_per_day"] == ""
    assert float(rows[1]["ns_per_day"]) == pytest.approx(1.0)  # 1 ps per 1/1000 day
    assert rows[2]["ns_per_day"] == "7.0"


def test_reopened_log_keeps_its_header(tmp_path):
    path = tmp_path / "thermo.csv"
    log = ThermoLog(path)
    log.write([{"step": 0, "extra": 1.0}])
    log.close()
    log = ThermoLog(path)
    assert log.columns[-1] == "extra"
    log.write([{"step": 1, "extra": 2.0}])
    log.close()
    assert [row["extra"] for row in read(path)] == ["1.0", "2.0"]


def test_truncate_drops_later_rows_and_a_torn_last_row(tmp_path):
    path = tmp_path / "thermo.csv"
    log = ThermoLog(path, n_systems=2)
    for step in range(0, 40, 10):
        log.write({"step": step, "system": s, "time_fs": step * 0.5} for s in range(2))
    log.close()
    with open(path, "a") as stream:
        stream.write("40,0,20.")  # a crash in the middle of a row
    assert truncate_thermo(path, 20) == 6
    assert [row["step"] for row in read(path)] == ["0", "0", "10", "10", "20", "20"]
