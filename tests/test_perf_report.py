#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""scripts/perf-report.py: the committed docs/performance.md is what the committed result files
in bench/results/ give, and the generator reads every result format it documents (JSON lines,
JSON lists, notes, the module and network benchmarks' rows)."""
import importlib.util
import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("perf_report", os.path.join(ROOT, "scripts", "perf-report.py"))
perf_report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(perf_report)


def cpu_row(case, threads, isa, bie_ms, base_ms):
    return {"case": case, "backend": "cpu", "threads": threads, "bie_ms": bie_ms, "baseline": "openblas-sgemm",
            "baseline_ms": base_ms, "speedup": base_ms / bie_ms, "gops": 100.0, "device": "Test CPU", "cpus": 2,
            "isa": isa, "blas": "OpenBLAS test", "bie_version": "0.1.0", "date": "2030-01-02"}


class PerfReport(unittest.TestCase):
    def test_committed_page_matches_results(self):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            sys.argv = ["perf-report.py", "--check"]
            rc = perf_report.main()
        self.assertEqual(rc, 0, err.getvalue())

    def test_formats(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "cpu.json"), "w") as f:  # JSON lines, a note, a line to skip
                f.write("not json\n")
                for r in (cpu_row("gemm-bin-4096", 1, "avx512vpopcnt", 2.0, 20.0),
                          cpu_row("gemm-bin-4096", 2, "avx512vpopcnt", 1.0, 12.0)):
                    f.write(json.dumps(r) + "\n")
                f.write(json.dumps({"note": "A test note."}) + "\n")
            with open(os.path.join(d, "cpu-avx2.json"), "w") as f:  # a JSON list
                json.dump([cpu_row("gemm-bin-4096", 1, "avx2", 4.0, 20.0)], f)
            with open(os.path.join(d, "networks.json"), "w") as f:
                json.dump([{"model": "resnet18-binary", "batch": 128, "mode": "inference", "bie_ms": 2.5,
                            "baseline": "float fp16", "baseline_ms": 5.0, "ratio": 2.0, "peak_mib": 1900.4,
                            "baseline_peak_mib": 2046.0,
                            "device": "Test GPU", "date": "2030-01-03"}], f)
            with open(os.path.join(d, "modules.json"), "w") as f:
                f.write(json.dumps({"layer": "BinaryLinear", "shape": "M=1 K=8 N=8", "mode": "forward",
                                    "bie_ms": 0.5, "baseline": "nn.Linear float32", "baseline_ms": 1.5,
                                    "speedup": 3.0, "device": "Test CPU", "threads": 1, "dtype": "float32",
                                    "torch": "9.9", "date": "2030-01-04", "transcribed": "Copied by hand."}) + "\n")
            page = perf_report.render(d)
        self.assertIn("## CPU: Test CPU", page)
        self.assertIn("| `gemm-bin-4096` | M=4096 K=4096 N=4096 | OpenBLAS sgemm | 2.000 | 20.00 | 10.00x | 100 "
                      "| 1.000 | 12.00 | 12.00x | 4.000 | 5.00x |", page)
        self.assertIn("A test note.", page)
        self.assertIn("## Whole networks", page)
        self.assertIn("| resnet18-binary | 128 | eager | 2.500 / 5.000 | 2.00x | - | - | - | - | - | - | 1900 / 2046 |", page)
        self.assertIn("| BinaryLinear | M=1 K=8 N=8 | 0.5000 / 1.500 | 3.00x | - | - | - |", page)
        self.assertIn("Copied by hand.", page)
        self.assertNotIn("## CUDA", page)

    def test_check_fails_on_a_stale_page(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "cpu.json"), "w") as f:
                f.write(json.dumps(cpu_row("lin-bin-m1", 1, "avx2", 1.0, 2.0)) + "\n")
            page = os.path.join(d, "page.md")
            with open(page, "w") as f:
                f.write(perf_report.render(d).replace("2.00x", "3.00x"))
            err = io.StringIO()
            with redirect_stderr(err), redirect_stdout(io.StringIO()):
                sys.argv = ["perf-report.py", "--check", "--results", d, "--output", page]
                self.assertEqual(perf_report.main(), 1)
            self.assertIn("make perf-doc", err.getvalue())


if __name__ == "__main__":
    unittest.main()
