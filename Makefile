# The README's two commands:
#   make run   installs dependencies, builds, and serves the embedded default model on 127.0.0.1:8080
#   make test  installs dependencies, builds, and runs every test
.PHONY: all setup build run test test-asan test-tsan check-threads check-layering fuzz bench format clean

JOBS ?= 2
PRESET ?= release
BUILD := build/$(PRESET)
KVCACHE := $(BUILD)/src/cli/kvcache
TEST_MODEL ?= $(firstword $(wildcard ../shared/models/stories260K.gguf))
TESTDATA ?= $(firstword $(wildcard ../shared/testdata))
FUZZ_SECONDS ?= 60
JINJA_FUZZ_SECONDS ?= 30
ARGS ?=

all: build

setup:
	./scripts/setup

build: setup
	cmake --preset $(PRESET) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

run: build
	$(KVCACHE) serve $(ARGS)

test: build
	KVCACHE_TEST_MODEL=$(abspath $(TEST_MODEL)) KVCACHE_TESTDATA=$(abspath $(TESTDATA)) ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

test-asan: setup
	cmake --preset asan >/dev/null
	cmake --build build/asan -j $(JOBS)
	KVCACHE_TEST_MODEL=$(abspath $(TEST_MODEL)) KVCACHE_TESTDATA=$(abspath $(TESTDATA)) ctest --test-dir build/asan --output-on-failure -j $(JOBS)

# The engine and server tests under ThreadSanitizer (the soak test shortened to 20 s).
test-tsan: setup
	cmake --preset tsan >/dev/null
	cmake --build build/tsan -j $(JOBS) --target engine_tests server_tests
	for t in engine_tests server_tests; do \
	  KVCACHE_TEST_MODEL=$(abspath $(TEST_MODEL)) KVCACHE_SOAK_SECONDS=20 \
	    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(abspath tests/tsan.supp)" build/tsan/tests/$$t || exit 1; \
	done

# Clang's thread-safety analysis over the code whose mutexes carry annotations (base's kernels
# use GCC-only pragmas, so only its locking files).
check-threads: setup
	cmake --preset clang-tsa >/dev/null
	ninja -C build/clang-tsa -j $(JOBS) $$(ninja -C build/clang-tsa -t targets all | grep -oE '^src/((kv|engine|server)/CMakeFiles/[^:]+|base/CMakeFiles/[^:]+/histogram\.cc)\.o')

check-layering:
	./scripts/check-layering

fuzz: setup
	cmake --preset fuzz >/dev/null
	cmake --build build/fuzz -j $(JOBS)
	mkdir -p build/fuzz/corpus
	build/fuzz/fuzz/gguf_fuzz_seeds build/fuzz/corpus
	build/fuzz/fuzz/gguf_fuzz -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 build/fuzz/corpus
	mkdir -p build/fuzz/jinja_corpus
	build/fuzz/fuzz/jinja_fuzz -max_total_time=$(JINJA_FUZZ_SECONDS) -max_len=4096 -print_final_stats=1 build/fuzz/jinja_corpus fuzz/jinja_seeds

bench: build
	$(KVCACHE) bench $(ARGS)

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf build
