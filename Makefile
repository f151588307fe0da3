# sparsek — every target does its own set-up (scripts/setup is idempotent and quick when all is there).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_ARGS ?=
SPARSEK = ./$(BUILD)/sparsek

.PHONY: all setup setup-cli configure build cli run-cli test test-cpu test-python run bench verify doctor ncu fuzz clean

all: build

CONFIGURE = test -f $(BUILD)/build.ninja || cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

setup:
	@bash scripts/setup

# What the CLI needs (no Python packages): run, bench, verify and doctor build the CLI alone.
setup-cli:
	@bash scripts/setup --no-python

configure: setup
	@$(CONFIGURE)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

cli: setup-cli
	@$(CONFIGURE)
	cmake --build $(BUILD) -j $(JOBS) --target sparsek_cli

# The whole suite: C++ (CPU tests run; GPU tests skip with the reason when no GPU answers) + Python,
# then a short fuzzing run (fixed seed): 40 seconds for each of the two fuzz targets.
test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS); rc=$$?; bash scripts/skip-reasons $(BUILD); exit $$rc
	@BUILD=$(BUILD) JOBS=$(JOBS) bash scripts/python-tests
	@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=40 FUZZ_ARGS=-seed=1

# Only the Python suite (builds the nanobind extension inside $(BUILD); see scripts/python-tests).
test-python: build
	@BUILD=$(BUILD) JOBS=$(JOBS) bash scripts/python-tests

# What run and bench build. Where a GPU answers (nvidia-smi), the CLI with every GPU kernel. Without
# one, `sparsek bench` can only run the CPU backend, so they build the CLI without CUDA in
# $(CPU_BUILD) instead: about 1.5 minutes on 2 cores, against 10 or more for the GPU kernels nothing
# there would run. RUN_CUDA=1 builds the CUDA CLI anyway (RUN_CUDA=0: the CPU one with a GPU present).
CPU_BUILD ?= $(BUILD)-cpu
RUN_CUDA ?= $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU' && echo 1 || echo 0)
ifeq ($(RUN_CUDA),1)
RUN_BUILD = $(BUILD)
run-cli: cli
else
RUN_BUILD = $(CPU_BUILD)
run-cli: setup-cli
	@echo "no GPU answers (nvidia-smi): the CLI without CUDA, in $(CPU_BUILD) (RUN_CUDA=1 builds the CUDA one)"
	@test -f $(CPU_BUILD)/build.ninja || cmake -S . -B $(CPU_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPARSEK_CUDA=OFF $(CMAKE_ARGS)
	cmake --build $(CPU_BUILD) -j $(JOBS) --target sparsek_cli
endif

run: run-cli
	./$(RUN_BUILD)/sparsek bench

bench: run-cli
	./$(RUN_BUILD)/sparsek bench --json $(RUN_BUILD)/bench.json

verify: cli
	$(SPARSEK) verify

doctor: cli
	$(SPARSEK) doctor

# Nsight Compute key metrics of one sparsek kernel launch (needs ncu and a GPU), as a diffable file.
NCU_ARGS ?= --m 8192 --n 8192 --k 8192 --block 128x128 --density 0.125
ncu: cli
	$(SPARSEK) profile $(NCU_ARGS) --out $(BUILD)/profile.txt

# libFuzzer with ASan + UBSan (clang, its own build in $(FUZZ_BUILD)), FUZZ_SECONDS for each target:
# sparsek_fuzz (the validator, the C API products and plans, the tuning-cache reader; seed corpus
# tests/fuzz/corpus) and sparsek_fuzz_attention (attention layouts, plans on edited layouts, the
# backward, the gate; tests/fuzz/corpus-attention). New inputs go to $(FUZZ_BUILD)/corpus*; a
# crashing input to $(FUZZ_BUILD)/.
FUZZ_SECONDS ?= 600
FUZZ_BUILD ?= build-fuzz
FUZZ_ARGS ?=
fuzz: setup
	@test -f $(FUZZ_BUILD)/build.ninja || cmake -S tests/fuzz -B $(FUZZ_BUILD) -G Ninja \
	  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(FUZZ_BUILD) -j $(JOBS)
	@mkdir -p $(FUZZ_BUILD)/corpus $(FUZZ_BUILD)/corpus-attention
	CUDA_VISIBLE_DEVICES= $(FUZZ_BUILD)/sparsek_fuzz -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -timeout=20 \
	  -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/ $(FUZZ_ARGS) \
	  $(FUZZ_BUILD)/corpus tests/fuzz/corpus
	CUDA_VISIBLE_DEVICES= $(FUZZ_BUILD)/sparsek_fuzz_attention -max_total_time=$(FUZZ_SECONDS) -max_len=4096 \
	  -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/attention- $(FUZZ_ARGS) \
	  $(FUZZ_BUILD)/corpus-attention tests/fuzz/corpus-attention

clean:
	rm -rf $(BUILD) $(CPU_BUILD)
