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

.PHONY: all build test test-unit test-san test-python demo clean

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

test-san:
	cmake -S . -B build-san -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBIE_SANITIZE=ON -DBIE_CUDA=OFF $(CMAKE_FLAGS)
	cmake --build build-san -j$(JOBS)
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 BIE_TEST_QUICK=1 \
	  ctest --test-dir build-san -L unit --output-on-failure -j$(JOBS)

test-python:
	@if [ -d python/tests ]; then \
	  BIE_LIBRARY=$(CURDIR)/build/libbie.so PYTHONPATH=$(CURDIR)/python /usr/bin/python3 -m pytest -q python/tests; \
	else echo "no python tests yet"; fi

demo:
	scripts/install-deps.sh demo
	$(MAKE) --no-print-directory build
	scripts/demo.sh

clean:
	rm -rf build build-san
