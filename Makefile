# Thin front over CMake. `make run` builds and generates; `make test` builds
# the Release and the ASan+UBSan configurations and runs the whole suite.
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan
MODEL ?= models/glimmer-tiny-q4_k_xl.gguf

.PHONY: all deps build build-asan run test test-release test-asan clean

all: build

deps:
	@./scripts/deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

build-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMUSER_SANITIZE=ON >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS)

# The main job: generation with the shipped default model (glimmer-tiny).
run: build
	$(BUILD)/muser run -m $(MODEL) -p "And it came to pass, when the king" -n 64

test-release: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan: build-asan
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS)

test: test-release test-asan

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
