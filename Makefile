# Thin wrapper over CMake: `make`, `make test`, `make run`, `make install PREFIX=...`.
BUILD ?= build
PREFIX ?= /usr/local
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
# ctest -R regex: `make test SUITES='^(safety|comm)$$'` runs only those suites (default: all).
SUITES ?=

.PHONY: all test run install clean test-asan test-tsan fuzz

# No "Entering/Leaving directory" lines from this make's children (CMake's generated makefiles and the
# sanitizer targets' $(MAKE)): exported to them through MAKEFLAGS.
MAKEFLAGS += --no-print-directory

all:
	@cmake -S . -B $(BUILD) -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# ctest's status is make test's; tools/test-summary.sh then lists what was skipped and how to enable it.
test: all
	@cd $(BUILD) && ctest --output-on-failure -j 2 $(if $(SUITES),-R '$(SUITES)'); rc=$$?; \
	  bash $(CURDIR)/tools/test-summary.sh .; exit $$rc

run: all
	@echo "chorusrun -n 4 all_reduce_perf -b 8 -e 128M -f 2"
	@$(BUILD)/bin/chorusrun -n 4 $(BUILD)/bin/all_reduce_perf -b 8 -e 128M -f 2

install: all
	cmake --install $(BUILD) --prefix $(PREFIX)

# Sanitizer builds in their own trees. CMAKE_FLAGS given on the command line (e.g. -DCHORUS_WERROR=ON)
# pass through; the first report fails the test (options already in the environment win).
test-asan:
	ASAN_OPTIONS=$${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1} \
	UBSAN_OPTIONS=$${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
	$(MAKE) test BUILD=build-asan CMAKE_FLAGS="$(CMAKE_FLAGS) -DCHORUS_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug"

test-tsan:
	TSAN_OPTIONS=$${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1} \
	$(MAKE) test BUILD=build-tsan CMAKE_FLAGS="$(CMAKE_FLAGS) -DCHORUS_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug"

# libFuzzer targets (fuzz/fuzz_*.c), built with clang + ASan/UBSan; each runs FUZZ_SECONDS from an
# empty corpus (a crash, leak or timeout fails: its report is printed, the reproducer and the whole log
# are left in build-fuzz/).
FUZZ_SECONDS ?= 60
fuzz:
	@CC=clang cmake -S . -B build-fuzz -DCHORUS_FUZZ=ON -DCHORUS_SANITIZE=address,undefined \
	  -DCMAKE_BUILD_TYPE=Debug $(CMAKE_FLAGS) >/dev/null
	@cmake --build build-fuzz -j $(JOBS) --target $(notdir $(basename $(wildcard fuzz/fuzz_*.c)))
	@for f in $(notdir $(basename $(wildcard fuzz/fuzz_*.c))); do \
	  echo "== $$f for $(FUZZ_SECONDS) s"; \
	  (cd build-fuzz && ASAN_OPTIONS=detect_leaks=$${FUZZ_LEAKS:-1} ./bin/$$f -max_total_time=$(FUZZ_SECONDS) \
	    -timeout=10 -max_len=4096 -print_final_stats=1 >$$f.log 2>&1; rc=$$?; \
	    grep -E -A40 'ERROR|SUMMARY|deadly' $$f.log | head -n 60; tail -n 6 $$f.log; exit $$rc) || exit 1; \
	done

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz
