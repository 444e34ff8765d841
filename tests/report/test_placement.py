import numpy as np

from routecast.place.compare import compare_methods, summarize
from routecast.report.placement import plot_throughput, section_probe
from routecast.trace.synth import SynthConfig, generate


def _trace():
    cfg = SynthConfig(num_layers=2, num_experts=8, top_k=2, num_tokens=12 * 64, token_budget=64, max_running=64,
                      prompt_len=(8.0,), output_len=(20.0,), popularity_alpha=1.5, seed=1)
    return generate(cfg)


def test_section_and_plot_write_the_figure_and_the_summary_table(tmp_path):
    trace = _trace()
    sec, info = section_probe(trace, str(tmp_path), ep=4, shift_step=5)
    assert sec.key == "probe" and (tmp_path / "probe_vs_eplb.png").exists()
    table = next(p for p in sec.parts if "<table>" in p)
    assert all(f">{r['method']}<" in table for r in info["rows"])  # every summary row is in the report table
    assert info["settings"]["ep"] == 4 and info["settings"]["steps"] == np.unique(trace.tokens["step"]).size
    from routecast.sim.hardware import load_hardware
    from routecast.sim.models import load_model

    res = compare_methods(trace, ep=4, hw=load_hardware("h100-sxm"), model=load_model("mixtral-8x7b"))
    assert [r["method"] for r in summarize(res)] == [r["method"] for r in info["rows"]]
    png = plot_throughput(res, str(tmp_path / "sub" / "t.png"), shift_step=3, title="t")
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_section_compares_only_the_first_max_steps_and_says_so(tmp_path):
    trace = _trace()
    n = np.unique(trace.tokens["step"]).size
    sec, info = section_probe(trace, str(tmp_path), ep=4, max_steps=5)
    assert info["settings"]["steps"] == 5 < n
    assert any("first 5 of the trace" in p and f"{n} steps are compared" in p for p in sec.parts)
    _, whole = section_probe(trace, str(tmp_path), ep=4, max_steps=n)
    assert whole["settings"]["steps"] == n
