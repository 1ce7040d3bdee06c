# SPDX-License-Identifier: Apache-2.0
# The README's two commands: `make demo` (set up, train a binary network on Fashion-MNIST and
# evaluate it) and `make test` (set up, build, run every test). Both work on a fresh Debian machine.
JOBS ?= $(shell nproc)
# CUDA's compiler, where the toolkit is installed but not on PATH.
ifeq ($(shell command -v nvcc),)
  ifneq ($(wildcard /usr/local/cuda/bin/nvcc),)
    export PATH := $(PATH):/usr/local/cuda/bin
  endif
endif
CMAKE_FLAGS ?=

.PHONY: all build test test-unit test-san test-python test-fuzz fuzz demo clean

all: build

build:
	scripts/install-deps.sh build
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build build -j$(JOBS)

# Release build with every unit test, then the whole suite again under ASan + UBSan + LSan, then the
# PyTorch binding's tests.
test:
	scripts/install-deps.sh test
	$(MAKE) --no-print-directory build
	ctest --test-dir build -L unit --output-on-failure -j$(JOBS)
	$(MAKE) --no-print-directory test-san
	$(MAKE) --no-print-directory test-python
	$(MAKE) --no-print-directory test-fuzz

test-san:
	cmake -S . -B build-san -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBIE_SANITIZE=ON -DBIE_CUDA=OFF $(CMAKE_FLAGS)
	cmake --build build-san -j$(JOBS)
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 BIE_TEST_QUICK=1 \
	  ctest --test-dir build-san -L unit --output-on-failure -j$(JOBS)

test-python:
	@if [ -d python/tests ]; then \
	  BIE_LIBRARY=$(CURDIR)/build/libbie.so PYTHONPATH=$(CURDIR)/python /usr/bin/python3 -m pytest -q python/tests; \
	else echo "no python tests yet"; fi

# libFuzzer targets of the file readers (fuzz/): `make fuzz` runs each for FUZZ_RUNS inputs
# (default 1,000,000) from its seed corpus; `make test` runs each for FUZZ_SECONDS (default 20).
FUZZ_RUNS ?= 1000000
FUZZ_SECONDS ?= 20
FUZZ_TARGETS = fuzz-safetensors fuzz-idx
.PHONY: build-fuzz
build-fuzz:
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBIE_FUZZ=ON -DBIE_CUDA=OFF $(CMAKE_FLAGS) >/dev/null
	cmake --build build-fuzz -j$(JOBS) --target $(FUZZ_TARGETS)

fuzz: build-fuzz
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p build-fuzz/corpus/$$t; \
	  echo "$$t: $(FUZZ_RUNS) runs"; \
	  build-fuzz/$$t -runs=$(FUZZ_RUNS) -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1 \
	    build-fuzz/corpus/$$t fuzz/corpus-$${t#fuzz-} >build-fuzz/$$t.log 2>&1; rc=$$?; \
	  grep -E "^(stat::number_of_executed_units|Done)" build-fuzz/$$t.log; \
	  [ $$rc -eq 0 ] || { tail -n 40 build-fuzz/$$t.log; echo "$$t failed: see build-fuzz/$$t.log"; exit 1; }; \
	done

test-fuzz: build-fuzz
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p build-fuzz/corpus/$$t; \
	  build-fuzz/$$t -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1 \
	    build-fuzz/corpus/$$t fuzz/corpus-$${t#fuzz-} >build-fuzz/$$t.log 2>&1; rc=$$?; \
	  grep -E "^(stat::number_of_executed_units|Done)" build-fuzz/$$t.log; \
	  [ $$rc -eq 0 ] || { tail -n 40 build-fuzz/$$t.log; echo "$$t failed: see build-fuzz/$$t.log"; exit 1; }; \
	done

demo:
	scripts/install-deps.sh demo
	$(MAKE) --no-print-directory build
	scripts/demo.sh

clean:
	rm -rf build build-san build-fuzz

# docs/performance.md from the benchmarks' JSON results in bench/results/ (scripts/perf-report.py);
# `make test` checks that the committed page is what those files give.
.PHONY: perf-doc
perf-doc:
	python3 scripts/perf-report.py
