# Thin front over CMake. `make run` builds and generates with the shipped
# model models/glimmer-tiny-q4_k_xl.gguf; `make test` builds the Release and
# the ASan+UBSan configurations and runs the whole suite, then builds the
# GGUF fuzzer with clang and gives it a short run.
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
MODEL ?= models/glimmer-tiny-q4_k_xl.gguf

.PHONY: all deps build build-asan build-fuzz run models-local test test-release test-asan test-fuzz clean

all: build

deps:
	@./scripts/deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

build-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMUSER_SANITIZE=ON >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS)

# libFuzzer needs clang; only the fuzz targets are built in this tree.
build-fuzz: deps
	cmake -S . -B $(FUZZ_BUILD) -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMUSER_FUZZ=ON >/dev/null
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_gguf

# The main job: generation with the shipped default model (glimmer-tiny).
run: build
	$(BUILD)/muser run -m $(MODEL) -p "And it came to pass, when the king" -n 64

# Other precisions of glimmer-tiny, made here from the shipped file (its
# weights dequantized, then re-typed): build/models/glimmer-tiny-{f32,f16,q8_0,nvfp4}.gguf.
# tests/test_golden.c makes the same files itself and checks them against the
# PyTorch reference; the trainer's own F32/F16 come from tools/train/export.sh.
models-local: build
	mkdir -p $(BUILD)/models
	$(BUILD)/muser quantize $(MODEL) $(BUILD)/models/glimmer-tiny-f32.gguf F32 --no-progress
	for t in f16 q8_0 nvfp4; do \
	    $(BUILD)/muser quantize $(BUILD)/models/glimmer-tiny-f32.gguf $(BUILD)/models/glimmer-tiny-$$t.gguf $$t --no-progress || exit 1; \
	done

test-release: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan: build-asan
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS)

test-fuzz: build-fuzz
	cd $(FUZZ_BUILD) && ctest --output-on-failure -R '^fuzz_'

test: test-release test-asan test-fuzz

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
