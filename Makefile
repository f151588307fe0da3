# sparsek — every target does its own set-up (scripts/setup is idempotent and quick when all is there).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_ARGS ?=
SPARSEK = ./$(BUILD)/sparsek

.PHONY: all setup configure build test test-cpu test-python run bench verify doctor ncu clean

all: build

setup:
	@bash scripts/setup

configure: setup
	@test -f $(BUILD)/build.ninja || cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The whole suite: C++ (CPU tests run; GPU tests skip with the reason when no GPU answers) + Python.
test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)
	@BUILD=$(BUILD) JOBS=$(JOBS) bash scripts/python-tests

# Only the Python suite (builds the nanobind extension inside $(BUILD); see scripts/python-tests).
test-python: build
	@BUILD=$(BUILD) JOBS=$(JOBS) bash scripts/python-tests

run: build
	$(SPARSEK) bench

bench: build
	$(SPARSEK) bench --json $(BUILD)/bench.json

verify: build
	$(SPARSEK) verify

doctor: build
	$(SPARSEK) doctor

# Nsight Compute key metrics of one sparsek kernel launch (needs ncu and a GPU).
NCU_ARGS ?= --m 8192 --n 8192 --k 8192 --block 128x128 --density 0.125 --reps 1 --warmup 1
ncu: build
	ncu --kernel-name regex:sparsek --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
	  $(SPARSEK) bench $(NCU_ARGS)

clean:
	rm -rf $(BUILD)
