# Two commands do all the set-up on a fresh machine:
#   make test    create .venv, install the package with its test and docs extras, lint,
#                run the whole test suite, build the docs with warnings as errors
#   make bench   install the bench extra and print the headline benchmark table
#   make bench-repro  the headline three times per thread count (1 and 2) and its spread
#   make test-long   the exhaustive test run (tests/conftest.py): 4x the hypothesis examples,
#                the `long` tests, full shape ranges and the `jax_long` cases on JAX
#   make test-kernels  the suite under two other BLAS/torch/Numba kernel paths (other CPUs' rounding)
#   make warm    compile the Numba kernels into Numba's on-disk cache (install does it too)
# What the install ($(VENV)/.installed-stamp) does:
#   1. creates $(VENV) unless it exists (VENV=/path/to/env uses an existing environment),
#      installs the package with Numba and starts compiling the kernels (make warm) while
#      steps 2 and 3 install the rest (a minute less than one after the other);
#   2. installs torch only when $(VENV) has none: $(TORCH_SPEC) from $(TORCH_INDEX), PyTorch's
#      CPU wheel index (a CPU build: no CUDA packages, no triton), falling back to the default
#      index if that fails; a torch already there (a CUDA build, say) is kept, and the extras
#      ask for torch>=2.4 only, so the next step never replaces it;
#   3. pip install -e ".[test,docs,bench]";
#   4. waits for make warm: the kernels compile once here (a minute or two) instead of in
#      the tests.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
# Backends the test suite must run on; a backend named here but not importable fails the run.
HL_TEST_BACKENDS ?= numpy,numpy_readonly,array_api_strict,torch,jax,jax_jit,dask
PYTEST_WORKERS ?= 2
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_SPEC  ?= torch==2.13.0
# torch alone comes from TORCH_INDEX (--no-deps: its dependencies come with the package's
# install, from the default index), so an unreachable index costs one request of at most
# 2 x 10 s before the fallback to the default index takes over
PIP_NET     ?= --timeout 10 --retries 1

.PHONY: install test test-long lint unit unit-long docs bench bench-quick bench-repro fuzz clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e ".[numba]"
	$(PY) -m householderla._kernels.warm & warm=$$!; \
	{ $(PY) -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" \
	  || $(PY) -m pip install --quiet --no-deps $(PIP_NET) --index-url $(TORCH_INDEX) "$(TORCH_SPEC)" \
	  || $(PY) -m pip install --quiet "$(TORCH_SPEC)"; } \
	&& $(PY) -m pip install --quiet -e ".[test,docs,bench]"; rc=$$?; \
	wait $$warm || rc=1; exit $$rc
	touch $(STAMP)

install: $(STAMP)

.PHONY: warm
# every Numba kernel compiled (or loaded) once, so no later process compiles them
warm: $(STAMP)
	$(PY) -m householderla._kernels.warm

lint: $(STAMP)
	$(PY) -m ruff check householderla tests benchmarks examples docs/conf.py
	$(PY) -m ruff format --check householderla tests benchmarks examples

unit: $(STAMP)
	HL_TEST_BACKENDS=$(HL_TEST_BACKENDS) $(PY) -m pytest -n $(PYTEST_WORKERS) -q --durations=30

unit-long: $(STAMP)
	HL_TEST_LONG=1 HL_TEST_BACKENDS=$(HL_TEST_BACKENDS) $(PY) -m pytest -n $(PYTEST_WORKERS) -q

# the pages (their plot examples run), then every Python example on them (doctest builder);
# one BLAS/OpenMP thread: `make test` runs it beside bench-quick on two cores, and Dask's
# thread pool on the Dask page calls LAPACK from two threads at once (OpenBLAS's own threads
# on top made the page's tall QRs ~20x slower: the doctests took 63 s instead of 35)
DOCS_ENV ?= OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 NUMBA_NUM_THREADS=1
docs: $(STAMP)
	$(DOCS_ENV) $(PY) -m sphinx -W --keep-going -q -b html -d docs/_build/doctrees docs docs/_build/html
	$(DOCS_ENV) $(PY) -m sphinx -W --keep-going -q -b doctest -d docs/_build/doctrees docs docs/_build/doctest

# every benchmark script (make bench-all; with --quick, make bench-quick)
BENCH_SCRIPTS := run forming retractions sequential structured svd training_step stiefel dispatch lapack small dask_tall lowprec muon by_hand cpu_rows peft
# where make bench, bench-all and bench-repro write: git-ignored unless you ask for the
# committed results (make bench BENCH_OUT=benchmarks/results)
BENCH_OUT ?= build/bench

# every benchmark script, tiny sizes, in one process (benchmarks/quick.py): a smoke test that
# they run (timings are not checked)
bench-quick: $(STAMP)
	$(PY) -m benchmarks.quick --out $(VENV)/bench-quick $(BENCH_SCRIPTS) reproduce

# lint and the tests first; then the docs and the benchmark smoke test side by side (two
# single-threaded jobs on two cores: the wall time of the longer, not of both)
test: lint unit
	$(MAKE) --no-print-directory -j2 -Otarget docs bench-quick

# the fuzz suite with many examples per property (minutes; not part of `make test`)
fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=fuzz HL_TEST_BACKENDS=numpy,numpy_readonly,torch,jax $(PY) -m pytest -n $(PYTEST_WORKERS) -q tests/test_fuzz.py tests/test_reliability.py

test-long: lint unit-long

# the suite under other kernel paths of the same libraries, as on other CPUs: OpenBLAS's
# Haswell kernels, MKL's AVX2, torch's avx2 and Numba compiling for haswell (an AVX2-only
# machine), then Sandybridge, SSE4.2, no vectorisation and sandybridge; each rounds in
# another order, so a tolerance that holds on one machine only fails here (about 16 minutes,
# the Numba kernels compiled for each CPU first; not part of `make test`)
KERNEL_VARIANTS := \
	"OPENBLAS_CORETYPE=Haswell MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 NUMBA_CPU_NAME=haswell" \
	"OPENBLAS_CORETYPE=Sandybridge MKL_ENABLE_INSTRUCTIONS=SSE4_2 ATEN_CPU_CAPABILITY=default NUMBA_CPU_NAME=sandybridge"
.PHONY: test-kernels
test-kernels: $(STAMP)
	for v in $(KERNEL_VARIANTS); do echo "== $$v"; env $$v $(PY) -m householderla._kernels.warm \
	  && env $$v HL_TEST_BACKENDS=$(HL_TEST_BACKENDS) $(PY) -m pytest -n $(PYTEST_WORKERS) -q || exit 1; \
	done

# the headline table only (benchmarks/run.py, one thread; about 3 minutes on an idle 2-core
# machine), with its legend, into $(BENCH_OUT)
bench: $(STAMP)
	$(PY) -m benchmarks.run --out $(BENCH_OUT)

# every script in BENCH_SCRIPTS, full sizes, into $(BENCH_OUT) (about 26 minutes)
.PHONY: bench-all
bench-all: $(STAMP)
	for s in $(BENCH_SCRIPTS); do $(PY) -m benchmarks.$$s --out $(BENCH_OUT) || exit 1; done

# the headline three times at one and three times at two threads, each run in a fresh process,
# and the spread of every ratio ($(BENCH_OUT)/reproduce.md; about 16 minutes)
bench-repro: $(STAMP)
	$(PY) -m benchmarks.reproduce --out $(BENCH_OUT)

clean:
	rm -rf $(VENV) docs/_build docs/api/generated .pytest_cache .hypothesis

# -- make gpu-check: on a machine with a GPU and no network (docs/install.rst, "On a GPU
# machine"), with that machine's own torch, CuPy and JAX: the GPU-backend tests in parallel,
# at most GPU_TEST_S seconds (timeout), then benchmarks/gpu.py within GPU_BENCH_S seconds
# (sections it cannot finish are written as "not measured"), into $(GPU_OUT)/gpu.{md,json}
# and the tests' log $(GPU_OUT)/gpu-tests.log. At most 300 + 170 s with the defaults (the
# timeouts; not yet run on a GPU). Nothing is
# installed: GPU_WHEELS names a folder of pure-Python dependencies (array-api-compat) put on
# PYTHONPATH; pytest-benchmark, if the machine has it, is switched off (its warning under
# xdist is an error here). Exits non-zero when a test failed or a phase ran out of time.
GPU_PY      ?= python3
GPU_WHEELS  ?=
GPU_WORKERS ?= 12
GPU_TEST_S  ?= 300
GPU_BENCH_S ?= 140
GPU_OUT     ?= benchmarks/results
# not GPU tests: the examples, the CPU kernels and Dask, the harness, sharding (CPU devices),
# the layer rules
GPU_SKIP    := examples numba_kernels dask dask_tall bench_harness bench_gpu sharding layers

.PHONY: gpu-check
gpu-check:
	@mkdir -p $(GPU_OUT); \
	export PYTHONPATH="$(CURDIR)$(if $(GPU_WHEELS),:$(abspath $(GPU_WHEELS)))$${PYTHONPATH:+:$$PYTHONPATH}"; \
	export XLA_PYTHON_CLIENT_PREALLOCATE=false HL_TEST_BACKENDS=torch_cuda,cupy,jax_gpu; \
	echo "[gpu-check] tests (at most $(GPU_TEST_S) s, $(GPU_WORKERS) workers) -> $(GPU_OUT)/gpu-tests.log"; \
	timeout -k 10 $(GPU_TEST_S) $(GPU_PY) -m pytest -p no:benchmark -p no:cacheprovider \
	  -n $(GPU_WORKERS) -q -rfE $(foreach t,$(GPU_SKIP),--ignore=tests/test_$(t).py) tests \
	  > $(GPU_OUT)/gpu-tests.log 2>&1; trc=$$?; tail -n 30 $(GPU_OUT)/gpu-tests.log; \
	if [ $$trc -eq 124 ] || [ $$trc -eq 137 ]; then \
	  echo "[gpu-check] tests: not finished in $(GPU_TEST_S) s" | tee -a $(GPU_OUT)/gpu-tests.log; fi; \
	echo "[gpu-check] benchmarks/gpu.py (budget $(GPU_BENCH_S) s)"; \
	timeout -k 5 $$(( $(GPU_BENCH_S) + 30 )) $(GPU_PY) -m benchmarks.gpu --budget $(GPU_BENCH_S) \
	  --out $(GPU_OUT); brc=$$?; \
	echo "[gpu-check] tests exit $$trc, benchmark exit $$brc"; \
	[ $$trc -eq 0 ] && [ $$brc -eq 0 ]
