# SPDX-License-Identifier: Apache-2.0
# The README's two commands: `make demo` (set up, train a binary network on Fashion-MNIST,
# evaluate it and draw its training curves) and `make test` (set up, build, run every test). Both
# work on a fresh Debian machine. `make install PREFIX=DIR` installs the build (default
# /usr/local).
JOBS ?= $(shell nproc)
# CUDA's compiler, where the toolkit is installed but not on PATH.
ifeq ($(shell command -v nvcc),)
  ifneq ($(wildcard /usr/local/cuda/bin/nvcc),)
    export PATH := $(PATH):/usr/local/cuda/bin
  endif
endif
CMAKE_FLAGS ?=
PREFIX ?= /usr/local

.PHONY: all build install test test-format test-unit test-san test-python test-wheel test-fuzz fuzz demo clean

all: build

build:
	scripts/install-deps.sh build
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build build -j$(JOBS)

install: build
	cmake --install build --prefix $(PREFIX)

# The sources' formatting (scripts/check-format.sh), a Release build with every unit test (the
# installed tree and the library without CUDA included), then the whole suite again under ASan + UBSan + LSan, the PyTorch binding's tests from the source
# tree and as pip installs it, the concurrency tests under ThreadSanitizer and the fuzzers briefly.
test:
	scripts/install-deps.sh test
	$(MAKE) --no-print-directory test-format
	$(MAKE) --no-print-directory build
	ctest --test-dir build -L unit --output-on-failure -j$(JOBS)
	$(MAKE) --no-print-directory test-san
	$(MAKE) --no-print-directory test-python
	$(MAKE) --no-print-directory test-wheel
	$(MAKE) --no-print-directory test-tsan
	$(MAKE) --no-print-directory test-fuzz

# Every C and CUDA source formatted as .clang-format says.
test-format:
	scripts/check-format.sh

test-san:
	cmake -S . -B build-san -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBIE_SANITIZE=ON -DBIE_CUDA=OFF $(CMAKE_FLAGS)
	cmake --build build-san -j$(JOBS)
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 BIE_TEST_QUICK=1 \
	  ctest --test-dir build-san -L unit --output-on-failure -j$(JOBS)

test-python:
	@if [ -d python/tests ]; then \
	  BIE_LIBRARY=$(CURDIR)/build/libbie.so PYTHONPATH=$(CURDIR)/python /usr/bin/python3 -m pytest -q python/tests; \
	else echo "no python tests yet"; fi

# The binding as `pip install ./python` makes it: a wheel that scikit-build-core builds from this
# checkout (without the CUDA backend here, which would add minutes of nvcc; its build directory
# is kept for the next run), installed into a fresh venv that sees Debian's torch, and tested from
# outside the source tree against the installed package.
WHEEL_TESTS = ../python/tests/test_modules.py ../python/tests/test_functional.py -k "not gradcheck"
test-wheel:
	rm -rf build/venv build/wheel
	/usr/bin/python3 -m venv --system-site-packages build/venv
	build/venv/bin/pip wheel -q --no-deps -w build/wheel ./python --config-settings=build-dir=build/python-wheel \
	  --config-settings=cmake.define.BIE_CUDA=OFF
	@case "$$(ls build/wheel)" in *-py3-none-linux_*.whl) echo "wheel: $$(ls build/wheel)" ;; \
	  *) echo "the wheel is not a platform wheel: $$(ls build/wheel)"; exit 1 ;; esac
	build/venv/bin/pip install -q --no-deps build/wheel/*.whl
	cd build && env -u BIE_LIBRARY venv/bin/python -c "import bie, sys; p = bie.library_path(); \
	  assert p.startswith(sys.prefix), p; print('installed bie uses', p, '- CUDA:', bie.cuda_unavailable_reason() or 'available')"
	cd build && env -u BIE_LIBRARY BIE_TEST_INSTALLED=1 venv/bin/python -m pytest -p no:cacheprovider $(WHEEL_TESTS)

# Fuzzing (fuzz/README.md). libFuzzer targets, built with ASan + UBSan: the file readers
# (fuzz-safetensors, fuzz-idx), model files end to end (fuzz-model) and the layer API against the
# reference on every backend (fuzz-layers); the bie program's arguments and bench shape files
# (fuzz/fuzz_cli.py, on the ASan build of bie); the Python binding (hypothesis); a kill -9 loop of
# `bie train` (fuzz/kill-train.sh).
# `make fuzz`: each libFuzzer target to FUZZ_RUNS inputs (10 M) or FUZZ_MAX_SECONDS (1 hour)
# whichever comes first, the others for FUZZ_MAX_SECONDS / 6 or their own bounds.
# `make test-fuzz` (part of `make test`): each for FUZZ_SECONDS (12) or a few hundred runs.
FUZZ_RUNS ?= 10000000
FUZZ_MAX_SECONDS ?= 3600
FUZZ_SECONDS ?= 12
FUZZ_TARGETS = fuzz-safetensors fuzz-idx fuzz-model fuzz-layers
FUZZ_FLAGS = -max_len=65536 -rss_limit_mb=2048 -timeout=60 -print_final_stats=1
.PHONY: build-fuzz fuzz-libfuzzer fuzz-others test-tsan
build-fuzz:
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBIE_FUZZ=ON -DBIE_CUDA=OFF $(CMAKE_FLAGS) >/dev/null
	cmake --build build-fuzz -j$(JOBS) --target $(FUZZ_TARGETS) bie_cli

# Runs every libFuzzer target with FUZZ_ARGS; corpus: fuzz/corpus-<name> (fuzz-model reads the
# safetensors one) plus what the runs found (build-fuzz/corpus/<name>).
fuzz-libfuzzer: build-fuzz
	@for t in $(FUZZ_TARGETS); do \
	  seed=fuzz/corpus-$${t#fuzz-}; [ $$t = fuzz-model ] && seed=fuzz/corpus-safetensors; \
	  mkdir -p build-fuzz/corpus/$$t; [ -d $$seed ] || seed=; \
	  build-fuzz/$$t $(FUZZ_FLAGS) $(FUZZ_ARGS) build-fuzz/corpus/$$t $$seed >build-fuzz/$$t.log 2>&1; rc=$$?; \
	  echo "$$t: $$(grep -E '^stat::number_of_executed_units' build-fuzz/$$t.log | sed 's/.*: *//') executions," \
	       "$$(grep -E '^stat::average_exec_per_sec' build-fuzz/$$t.log | sed 's/.*: *//')/s, exit $$rc"; \
	  [ $$rc -eq 0 ] || { tail -n 40 build-fuzz/$$t.log; echo "$$t failed: see build-fuzz/$$t.log"; exit 1; }; \
	done

# The program (on its ASan build), the binding and the kill loop, for FUZZ_OTHER_SECONDS each.
fuzz-others: build-fuzz
	python3 fuzz/fuzz_cli.py --bie build-fuzz/bie --seconds $(FUZZ_OTHER_SECONDS) --work build-fuzz/cli
	BIE_LIBRARY=$(CURDIR)/build/libbie.so PYTHONPATH=$(CURDIR)/python BIE_FUZZ_SECONDS=$(FUZZ_OTHER_SECONDS) \
	  /usr/bin/python3 -m pytest -q -p no:cacheprovider fuzz/python
	fuzz/kill-train.sh build/bie $(FUZZ_KILLS) build-fuzz/kill

fuzz:
	$(MAKE) --no-print-directory build
	$(MAKE) --no-print-directory fuzz-libfuzzer FUZZ_ARGS="-runs=$(FUZZ_RUNS) -max_total_time=$(FUZZ_MAX_SECONDS)"
	$(MAKE) --no-print-directory fuzz-others FUZZ_OTHER_SECONDS=$$(($(FUZZ_MAX_SECONDS) / 6)) FUZZ_KILLS=50

test-fuzz:
	$(MAKE) --no-print-directory fuzz-libfuzzer FUZZ_ARGS="-max_total_time=$(FUZZ_SECONDS)"
	$(MAKE) --no-print-directory fuzz-others FUZZ_OTHER_SECONDS=$(FUZZ_SECONDS) FUZZ_KILLS=5

# The concurrency tests under ThreadSanitizer: contexts in several threads, one OpenMP thread each
# (libgomp and OpenBLAS are not instrumented).
TSAN_TESTS = test-concurrency test-context
test-tsan:
	CC=clang cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBIE_TSAN=ON -DBIE_CUDA=OFF $(CMAKE_FLAGS) >/dev/null
	cmake --build build-tsan -j$(JOBS) --target $(TSAN_TESTS)
	@for t in $(TSAN_TESTS); do \
	  echo "$$t (ThreadSanitizer)"; \
	  BIE_TEST_TSAN=1 BIE_TEST_QUICK=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1" \
	    build-tsan/tests/$$t >build-tsan/$$t.log 2>&1 || { tail -n 60 build-tsan/$$t.log; exit 1; }; \
	  tail -n 1 build-tsan/$$t.log; \
	done

demo:
	scripts/install-deps.sh demo
	$(MAKE) --no-print-directory build
	scripts/demo.sh

clean:
	rm -rf build build-san build-fuzz build-tsan

# docs/performance.md from the benchmarks' JSON results in bench/results/ (scripts/perf-report.py);
# `make test` checks that the committed page is what those files give.
.PHONY: perf-doc
perf-doc:
	python3 scripts/perf-report.py
