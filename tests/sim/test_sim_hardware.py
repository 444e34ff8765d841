import dataclasses
from pathlib import Path

import numpy as np
import pytest

from routecast.common.errors import ConfigError
from routecast.sim.hardware import HARDWARE_DIR, Hardware, list_hardware, load_hardware

SHIPPED = ["a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm", "h200", "h800"]


def test_every_shipped_profile_loads():
    assert list_hardware() == sorted(SHIPPED)
    for name in SHIPPED:
        hw = load_hardware(name)
        assert isinstance(hw, Hardware) and hw.name == name
        assert hw.peak_flops > 1e14 and hw.mem_bandwidth > 1e12 and hw.mem_capacity >= 40e9
        assert hw.mem_derate == 0.8
        assert 0 < hw.alpha < 1e-4
        assert hw.pcie_bandwidth in (32e9, 64e9) and hw.nvlink_bandwidth > hw.pcie_bandwidth


def test_link_figures_are_per_direction():
    assert load_hardware("a100-sxm-80gb").link_bandwidth("nvlink") == 300e9
    assert load_hardware("a100-sxm-80gb").link_bandwidth("pcie") == 32e9
    assert load_hardware("h100-sxm").link_bandwidth("nvlink") == 450e9
    assert load_hardware("h200").link_bandwidth("pcie") == 64e9
    with pytest.raises(ConfigError, match="infiniband"):
        load_hardware("h100-sxm").link_bandwidth("infiniband")


def test_every_number_in_a_shipped_file_has_a_source_comment():
    for path in HARDWARE_DIR.glob("*.toml"):
        for line in path.read_text().splitlines():
            key = line.split("=")[0].strip()
            if key.endswith(("_tflops", "_gbps", "_gb", "_us", "derate")):
                assert "#" in line, f"{path.name}: '{key}' has no source comment"


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ConfigError) as e:
        load_hardware("tpu-v9")
    msg = str(e.value)
    assert "tpu-v9" in msg and all(n in msg for n in SHIPPED)


def _broken(tmp_path: Path, drop: str | None = None, replace: tuple[str, str] | None = None) -> Path:
    text = (HARDWARE_DIR / "a100-sxm-80gb.toml").read_text()
    if drop:
        text = "\n".join(line for line in text.splitlines() if not line.startswith(drop))
    if replace:
        text = text.replace(*replace)
    p = tmp_path / "broken.toml"
    p.write_text(text)
    return p


def test_missing_field_names_file_and_field(tmp_path):
    p = _broken(tmp_path, drop="bandwidth_gbps")
    with pytest.raises(ConfigError) as e:
        load_hardware(p)
    assert str(p) in str(e.value) and "memory.bandwidth_gbps" in str(e.value)


@pytest.mark.parametrize(
    "old,new,field",
    [
        ("eta = [0.15,", "eta = [1.5,", "gemm.eta"),
        ("tokens = [32, 64,", "tokens = [64, 32,", "gemm.tokens"),
        ("derate = 0.8", "derate = 1.7", "memory.derate"),
        ("peak_tflops = 312.0", 'peak_tflops = "fast"', "compute.peak_tflops"),
        ('kind = "gpu"', 'kind = "fpga"', "kind"),
    ],
)
def test_invalid_field_names_it(tmp_path, old, new, field):
    p = _broken(tmp_path, replace=(old, new))
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_hardware(p)


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_hardware(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [unclosed")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_hardware(bad)


def test_eta_bounded_monotone_and_exact_at_table_points():
    n = np.concatenate([[0, 1], np.geomspace(1, 1e5, 200)])
    for name in SHIPPED:
        hw = load_hardware(name)
        eta = hw.eta(n)
        assert eta.shape == n.shape and np.all(eta > 0) and np.all(eta <= 1)
        assert np.all(np.diff(eta[1:]) >= -1e-12), name  # shipped curves never drop with more tokens
        np.testing.assert_allclose(hw.eta(np.array(hw.eta_tokens)), hw.eta_values)
        stair = hw.eta(n, staircase=True)
        assert np.all(stair > 0) and np.all(stair <= 1)
    # Piecewise linear in log tokens: halfway in log between 128 and 256 is halfway in eta.
    a100 = load_hardware("a100-sxm-80gb")
    assert a100.eta(np.sqrt(128 * 256)) == pytest.approx((0.50 + 0.52) / 2)
    assert a100.eta(np.ones((2, 3, 4)) * 4096).shape == (2, 3, 4)


def test_staircase_reproduces_the_a100_tile_boundary():
    # ANCHORS: bf16 GEMM n=16384, k=4096 takes 0.110 ms at m=128 and 0.214 ms at m=129.
    hw = load_hardware("a100-sxm-40gb")
    m = np.array([128.0, 129.0])
    t = 2 * m * 16384 * 4096 / (hw.eta(m, staircase=True) * hw.peak_flops)
    assert t[0] == pytest.approx(0.110e-3, rel=0.05)
    assert t[1] / t[0] == pytest.approx(0.214 / 0.110, rel=0.05)
    t_smooth = 2 * m * 16384 * 4096 / (hw.eta(m) * hw.peak_flops)
    assert t_smooth[1] / t_smooth[0] < 1.05  # without the option there is no step


def test_toml_round_trip(tmp_path):
    hw = load_hardware("h800")
    p = tmp_path / "copy.toml"
    p.write_text(hw.to_toml({"compute.peak_tflops": "copied"}))
    back = load_hardware(p)
    assert dataclasses.replace(back, source="") == dataclasses.replace(hw, source="")
    assert "# copied" in p.read_text()


# ---- measured weight-read curve and call floor (optional fields) ----------------------------------------
def _with_curve(tmp_path: Path, mb: str, gbps: str, call_us: str = "7.5") -> Path:
    text = (HARDWARE_DIR / "h100-sxm.toml").read_text()
    text = text.replace("weight_mb = []", f"weight_mb = {mb}").replace("weight_gbps = []", f"weight_gbps = {gbps}")
    text = text.replace("expert_call_us = 0.0", f"expert_call_us = {call_us}")
    p = tmp_path / "curve.toml"
    p.write_text(text)
    return p


def test_weight_read_curve_interpolates_in_log_size_and_is_flat_beyond(tmp_path):
    hw = load_hardware(_with_curve(tmp_path, "[1.0, 100.0]", "[1000.0, 3000.0]"))
    assert hw.weight_bytes == (1e6, 100e6) and hw.weight_bandwidth == (1000e9, 3000e9)
    assert hw.expert_call_overhead == pytest.approx(7.5e-6)
    t = hw.weight_read_time(np.array([1e6, 10e6, 100e6, 1e3, 1e9]))
    np.testing.assert_allclose(t, [1e6 / 1e12, 10e6 / 2000e9, 100e6 / 3000e9, 1e3 / 1e12, 1e9 / 3000e9])
    # Without a curve every size reads at bandwidth x derate.
    plain = load_hardware("h100-sxm")
    assert plain.weight_bytes == () and plain.expert_call_overhead == 0.0
    assert plain.weight_read_time(3.35e12) == pytest.approx(1.0 / 0.8)
    back = tmp_path / "back.toml"
    back.write_text(hw.to_toml())
    assert dataclasses.replace(load_hardware(back), source="") == dataclasses.replace(hw, source="")


@pytest.mark.parametrize(
    "mb,gbps,call,field",
    [
        ("[1.0, 100.0]", "[1000.0]", "0.0", "memory.weight_gbps"),
        ("[100.0, 1.0]", "[1.0, 2.0]", "0.0", "memory.weight_mb"),
        ("[1.0, 2.0]", "[1.0, 0.0]", "0.0", "memory.weight_gbps"),
        ("[]", "[]", "-3.0", "overhead.expert_call_us"),
        ('"x"', "[]", "0.0", "memory.weight_mb"),
    ],
)
def test_bad_curve_fields_are_named(tmp_path, mb, gbps, call, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_hardware(_with_curve(tmp_path, mb, gbps, call))


def test_profile_without_the_new_fields_still_loads(tmp_path):
    # Profiles written by an older `routecast calibrate` carry neither field: no curve, no call floor.
    text = "\n".join(line for line in (HARDWARE_DIR / "h800.toml").read_text().splitlines()
                     if not line.startswith(("weight_", "expert_call_us")))
    p = tmp_path / "old.toml"
    p.write_text(text)
    hw = load_hardware(p)
    assert hw.weight_bytes == () and hw.expert_call_overhead == 0.0
